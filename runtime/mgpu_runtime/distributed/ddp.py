"""``DistributedDataParallel``: torch's DDP on this process's device, taking and giving global values.

A subclass of ``torch.nn.parallel.DistributedDataParallel``, so ``isinstance`` checks, ``.module``,
``no_sync()`` and the ``module.``-prefixed ``state_dict`` keys (the same as the DataParallel original's)
behave as torch's. What it adds in a world of more than one process is the runtime contract
(``mgpu_runtime.sharded``): its forward is DataParallel's, over processes (``mgpu_runtime.sharded.scatter_gather``):

* it takes the global values the loop holds (the distributed loader's ``Sharded`` batches, plain tensors
  every rank holds alike), and gives this rank's replica its chunk of them, as DataParallel gave GPU r;
* the replica runs what GPU r ran: its chunk, its BatchNorm statistics (rank 0's buffers are every rank's
  at the next forward, as replica 0's were the module's), its dropout drawn from its device's stream
  (``global_view.own_forward``), a loss computed in ``forward`` its own;
* it gives back what DataParallel's gather gave: ``Sharded`` outputs, a W-vector for a loss in ``forward``.

Gradients are summed over the ranks (a DDP communication hook): each rank's backward gives its chunk's part of
the one global loss's gradient (``mgpu_runtime.sharded.gradients``). The reduction also carries the lockstep
check (``lockstep.py``), for which DDP's first bucket is made one parameter (``bucket_cap_mb_list``) unless the
script sets its own bucket sizes. With more than one process the wrapper also feeds the safety net
(``safety.py``): at the first training forward every process's weights are made rank 0's if a script changed
them after the wrap, and plain inputs (which every rank must hold alike) are compared at the first step.

Parameters frozen or unfrozen after the wrap (``requires_grad`` set by a ``train()`` override that freezes
BatchNorm, a ``freeze_backbone()`` called through ``.module``, a helper that trains the head only): DataParallel
did not care, while torch's DDP keeps waiting for the gradients of the parameters it was built with, and stops
at the next step. So each training forward compares which parameters require gradients with what DDP was built
over and, where they differ, rebuilds DDP's reducer over the ones that now do, as torch rebuilds it when a DDP
model is unpickled. Every process runs the same script, so every process rebuilds at the same forward.

A forward whose outputs feed several backward passes (a trainer module returning the discriminator's and the
generator's losses, each given its own ``backward()``) is what torch's reducer cannot follow: it prepares one
reduction per forward. ``reduce_each_backward=True`` leaves the reducer out and sums the model's gradients at the
end of each backward pass instead (``mgpu_runtime.sharded.gradients``), so ``.grad`` is whole after each pass, as
DataParallel's was, whatever runs between the passes (a step, clipping); it costs the overlap of the reduction
with the backward pass. Two wrappers that share parameters (first-order-model's generator and discriminator
"full models", each holding the generator, the keypoint detector and the discriminator, each wrapped) both work
that way, whatever they were given: each wrapper's reducer would wait for every parameter its module holds,
also those its forward never uses (the discriminator's full model runs no generator), and count the shared
ones when the other wrapper's backward pass reaches them, while DataParallel summed whatever each pass reached.

A forward given a switch (a keyword whose value is a bool, that the module's ``forward`` takes with a bool
default: ERFNet's ``model(x, only_encode=True)``) may leave some parameters out of the loss. torch's reducer would
wait for their gradients for ever; DataParallel's broadcast of the parameters, one autograd Function, gave them
zeros as soon as a backward pass reached any of them, and weight decay or momentum then moved them. So from the
first such forward the wrapper sums its gradients at the end of each backward pass, as with
``reduce_each_backward``, and a pass that reaches the module gives its parameters left out zeros
(``mgpu_runtime.broadcast_gradients``), as for a wrap with ``find_unused_parameters=True`` and any wrap
``reduce_each_backward``. A wrap given ``find_unused_parameters=True`` (the migration gives it to a model unrolled through
several forwards before one backward pass) keeps torch's reducer.

``replication_callbacks=True`` (a vendored ``DataParallelWithCallback``'s wrap) links the Synchronized-BatchNorm
package's layers over the ranks at each forward, as the callbacks linked DataParallel's replicas
(``replication_callbacks.py``): they normalise over the global batch, as they did.

``device_ids`` and ``output_device`` (DataParallel's arguments, naming all the GPUs of one process) are
accepted and ignored: here each process has exactly one device, ``device()``. Other keyword arguments go to
torch's DDP unchanged (``find_unused_parameters=True`` for a model that skips parameters in some steps).
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import ExceptionWrapper

from mgpu_runtime.distributed import global_view, idle, lockstep, own_machinery, safety, sync_batchnorm
from mgpu_runtime.distributed.launch import own_path_runs
from mgpu_runtime.distributed.process_group import Job, device, job, setup, world_size
from mgpu_runtime.distributed.rebinding import HeldParameters
from mgpu_runtime.distributed.replication_callbacks import linked
from mgpu_runtime.distributed.replication_callbacks import told_copies as replication_callbacks_of
from mgpu_runtime.pickling import COPY_MARK, as_data_parallel, copied_as_pickled
from mgpu_runtime.broadcast_gradients import zeros_once_reached
from mgpu_runtime.replica_links import thread_linked
from mgpu_runtime.sharded import scatter_gather

_TorchDDP = nn.parallel.DistributedDataParallel
# The options a migration may give a wrap, besides DataParallel's own arguments.
_WRAP_OPTIONS = ("reduce_each_backward", "replication_callbacks", "find_unused_parameters")
# Renamed in recent torch (broadcast_buffers is deprecated there); the spelling this torch understands.
_BUFFER_SYNC_ARGUMENT = (
    "forward_sync_buffers"
    if "forward_sync_buffers" in inspect.signature(_TorchDDP.__init__).parameters
    else "broadcast_buffers"
)


def _the_original(
    module: nn.Module, device_ids: Sequence[Any] | None = None, output_device: Any = None, dim: int = 0, **_: Any
) -> nn.DataParallel:
    """The wrap as the original made it, for the script's own distributed path (the options the migration added,
    ``reduce_each_backward`` and the like, are the runtime's)."""
    return nn.DataParallel(module, device_ids=device_ids, output_device=output_device, dim=dim)


class DistributedDataParallel(_TorchDDP):
    """Drop-in for ``nn.DataParallel(module, ...)`` in a migrated script: one process, one device, one wrapper.

    A module with nothing to train (every parameter frozen: a distillation teacher, a perceptual-loss
    network) gives a ``FrozenModule`` instead: torch's DDP refuses such a module, and there is nothing to
    synchronise, while DataParallel held it without complaint.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A DataParallel subclass rebased on this wrapper (MGP106) keeps its own ``__init__`` (``def __init__(self,
        module, num_gpus): super().__init__(module)``), which the options a migration gives the wrap
        (``replication_callbacks=True``, ``reduce_each_backward=True``, ``find_unused_parameters=True``) cannot
        pass through: they are taken off the call here, and read by this class's ``__init__``."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__init__")
        if own is None:
            return
        accepted = inspect.signature(own).parameters
        if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in accepted.values()):
            return

        @functools.wraps(own)
        def init(self, *args: Any, **kwargs: Any) -> None:
            options = {name: kwargs.pop(name) for name in _WRAP_OPTIONS if name in kwargs and name not in accepted}
            if options:
                object.__setattr__(self, "_wrap_options", options)
            own(self, *args, **kwargs)

        cls.__init__ = init  # type: ignore[method-assign]

    def __new__(cls, module: nn.Module, *args: Any, **kwargs: Any):
        if cls is DistributedDataParallel and own_path_runs():
            # The script's own distributed path runs (own_path.leave_to_own_path): this was its DataParallel.
            return _the_original(module, *args, **kwargs)
        if not any(parameter.requires_grad for parameter in module.parameters()):
            return FrozenModule(module)
        return super().__new__(cls)

    def __init__(
        self,
        module: nn.Module,
        device_ids: Sequence[Any] | None = None,
        output_device: Any = None,
        dim: int = 0,
        reduce_each_backward: bool = False,
        replication_callbacks: bool = False,
        **kwargs: Any,
    ) -> None:
        # Given to a rebased subclass's call, past its own __init__ (__init_subclass__).
        options = self.__dict__.pop("_wrap_options", {})
        reduce_each_backward = reduce_each_backward or options.pop("reduce_each_backward", False)
        replication_callbacks = replication_callbacks or options.pop("replication_callbacks", False)
        kwargs = {**options, **kwargs}
        _refuse_thread_linked_layers(module)
        # A DataParallelWithCallback's synchronized BatchNorm layers, linked over the ranks at each forward.
        told = replication_callbacks_of(module) if replication_callbacks else []
        setup()
        local = device()
        processes = world_size()
        if processes == 1 and not {"broadcast_buffers", "forward_sync_buffers"} & kwargs.keys():
            # Nobody to copy buffers to; on a GPU each forward would otherwise round-trip them through gloo.
            kwargs[_BUFFER_SYNC_ARGUMENT] = False
        if local.type == "cpu":
            sync_batchnorm.run_on_cpu(module)  # torch's SyncBatchNorm refuses CPU tensors
        if processes > 1:
            kwargs = {**lockstep.bucket_arguments(_TorchDDP.__init__, kwargs), **kwargs}
        super().__init__(
            module.to(local),
            device_ids=[local.index] if local.type == "cuda" else None,
            dim=dim,
            **kwargs,
        )
        self._job = job()
        self._told = told
        sharing = _sharing_parameters(self._job, module) if processes > 1 else []
        for other in sharing:
            other._sum_each_backward()  # both sum what each pass reached, as DataParallel did (see the module doc)
        self._job.wrappers.add(self)
        self._reduce_each_backward = reduce_each_backward or bool(sharing)
        gradients = self._job.gradients
        summed = functools.update_wrapper(functools.partial(_summed_noting, gradients), _summed) if gradients is not None else _summed
        self.register_comm_hook(self._job.lockstep, summed if processes > 1 else _keep_local)
        self._watched = list(module.parameters())  # read at each training forward: a flat list is 15x faster to scan
        self._trainable = _trainable(self._watched)
        self._note_synchronised()
        self._aligned = False
        self._switches: frozenset[str] | None = None  # the forward's keywords with bool defaults (_switched)
        self._unused_hook: Any = None  # _zeros_for_the_unused's hook on the parameters, until a backward reaches one
        self._held = HeldParameters(self.module)  # rebound with `.data =` in forward: kept as DataParallel kept them
        # What the original's nn.DataParallel was given: a pickle of this wrapper is that DataParallel.
        listed = None if device_ids is None else list(device_ids)
        self._data_parallel_arguments = {"device_ids": listed, "output_device": output_device, "dim": dim}

    def __reduce_ex__(self, protocol: int) -> Any:
        return as_data_parallel(self.module, **self._data_parallel_arguments)

    def __deepcopy__(self, memo: dict) -> Any:
        """``copy.deepcopy`` of the wrapper (an averaged model, ``swa_utils.AveragedModel(model)``, or an EMA copy):
        in the original it was an ``nn.DataParallel`` over the same GPUs, whose forward split each batch as the
        model's did (each chunk its own BatchNorm statistics, the first device's kept). Here the copy is this
        wrapper again, around a deep copy of the module, with the same options; its forward is split over the
        processes as the model's is. (A pickle, ``torch.save(model)``, still holds the ``nn.DataParallel``.) Building
        it is a collective, as building the original's was: every process copies at the same point."""
        if type(self) is not DistributedDataParallel:
            # A DataParallel subclass rebased on this class (MGP106) keeps state of its own: copied as pickled.
            return copied_as_pickled(self, memo)
        module = copy.deepcopy(self.module, memo)
        clone = DistributedDataParallel.__new__(DistributedDataParallel, module)
        if type(clone) is DistributedDataParallel:
            # Marked before its module is set: `mgpu-migrate verify` compares the models the script wrapped, and the
            # original's copy, restored from its pickle, was never wrapped by a call either.
            object.__setattr__(clone, COPY_MARK, True)
            clone.__init__(
                module,
                reduce_each_backward=self._reduce_each_backward,
                find_unused_parameters=self.find_unused_parameters,
                **self._data_parallel_arguments,
            )
        memo[id(self)] = clone
        return clone

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if kwargs and not (self._reduce_each_backward or self.find_unused_parameters) and self.training and self._switched(kwargs):
            self._sum_each_backward()
        if torch.is_grad_enabled() and (self._reduce_each_backward or (self.training and not self._follow_frozen_parameters())):
            # Nothing of the model trains in this forward (a GAN's discriminator, frozen for the generator's step), or
            # its gradients are summed at the end of each backward pass (reduce_each_backward, in eval mode too: a
            # reducer prepared by an evaluation that runs no backward would wait at the next forward): DDP's reducer
            # is left out of the forward, as under no_sync(), and the next forward still gives every rank rank 0's
            # buffers, as DataParallel's replicas took the module's.
            with self.no_sync():
                output = self._global_forward(inputs, kwargs)
            self.require_forward_param_sync = True
            return output
        return self._global_forward(inputs, kwargs)

    def _global_forward(self, inputs: tuple, kwargs: dict) -> Any:
        current = self._job
        # A DataParallel subclass rebased on this wrapper (MGP106) may cut the batch and gather the outputs its own way.
        scatter = self.scatter if type(self).scatter is not _TorchDDP.scatter else None
        if current.group is None:
            if scatter is not None and device().type == "cuda":
                # DataParallel on one GPU still called the subclass's scatter (and ran its one part, ungathered).
                inputs, kwargs = own_machinery.own_part(scatter, inputs, kwargs, None, 0, device())[:2]
            return super().forward(*inputs, **kwargs)
        training = self.training and torch.is_grad_enabled()
        if torch.is_grad_enabled() and (self.find_unused_parameters or self._reduce_each_backward):
            self._zeros_for_the_unused()
        if training:
            if not self._aligned:
                self._aligned = True  # every process trains in step, so this collective is met everywhere
                safety.align_replicas(self.module, self.process_group)
            current.safety.note_forward(inputs, kwargs)
            current.lockstep.note_forward()
        with linked(self._told):
            output, active = _replica_forward(super().forward, inputs, kwargs, current, self._held, scatter)
        if self.training and not torch.is_grad_enabled():
            # Buffers changed without a training forward (BatchNorm statistics recomputed under no_grad): the next
            # forward gives every rank rank 0's again, as DataParallel's replicas always took the module's.
            self.require_forward_param_sync = True
        if type(self).gather is not _TorchDDP.gather:
            group = current.group
            return own_machinery.own_gather(self.gather, output, active, group, group.rank, device())
        return scatter_gather.gather([output], active, current.group)

    def _follow_frozen_parameters(self) -> bool:
        """Rebuild the reducer over the parameters that require gradients now, if they are not those it was built
        over (see the module doc); whether any does. torch's own steps, as in ``DistributedDataParallel.__setstate__``;
        the comm hook goes on the new reducer, whose buckets are made again after its first backward, as at the wrap."""
        trainable = _trainable(self._watched)
        if trainable == self._trainable:
            return True
        if not any(trainable):
            return False  # DDP cannot be built over no parameter; the reducer it has waits for the next that trains
        self._trainable = trainable
        parameters, expect_sparse_gradient = self._build_params_for_reducer()
        names = self._build_debug_param_to_name_mapping(parameters)
        self._ddp_init_helper(parameters, expect_sparse_gradient, names, self.static_graph)
        if self.static_graph:
            self.reducer._set_static_graph()
            self.logger._set_static_graph()
        for hook, state in self._comm_hooks:
            dist._register_comm_hook(self.reducer, state, hook)
        self._has_rebuilt_buckets = False
        self._note_synchronised()
        return True

    def _zeros_for_the_unused(self) -> None:
        """With ``find_unused_parameters=True`` torch's reducer leaves a parameter that no rank's forward used
        without a gradient, and so does the sum at the end of each backward pass (``reduce_each_backward``, a
        switch); DataParallel's broadcast of the parameters (one autograd Function) gave it zeros once a backward
        pass reached any of them, and weight decay or momentum then moved it. So when this forward's backward
        reaches one of the module's parameters, its end gives the others still without one zeros, before the
        gradients are summed (a parameter some rank used gets the sum either way)."""
        if self._unused_hook is not None:
            self._unused_hook.remove()  # a forward whose backward never ran (an evaluation with gradients on)
        trainable = [parameter for parameter in self._watched if parameter.requires_grad]
        self._unused_hook = zeros_once_reached(trainable, trainable) if trainable else None

    def _switched(self, kwargs: dict) -> bool:
        """A keyword given a bool that the module's ``forward`` takes with a bool default (ERFNet's
        ``model(x, only_encode=True)``): a switch, which may leave some of the module's parameters out of the
        forward. torch's reducer then waits for their gradients for ever; DataParallel gave them zeros. So the
        wrapper sums its gradients at the end of each backward pass from then on (see the module doc), where a
        pass that reached the module gives its other parameters zeros, as DataParallel's broadcast did. Every
        process calls its model alike, so every process switches at the same forward."""
        if not torch.is_grad_enabled():
            return False
        if self._switches is None:
            try:
                parameters = inspect.signature(self.module.forward).parameters
            except (TypeError, ValueError):
                parameters = {}  # type: ignore[assignment]
            self._switches = frozenset(name for name, parameter in parameters.items() if isinstance(parameter.default, bool))
        return any(type(value) is bool and name in self._switches for name, value in kwargs.items())

    def _sum_each_backward(self) -> None:
        """From now on, this wrapper's gradients are summed at the end of each backward pass, its reducer left out."""
        if not self._reduce_each_backward:
            self._reduce_each_backward = True
            self._note_synchronised()

    def _note_synchronised(self) -> None:
        gradients = self._job.gradients
        if gradients is None:
            return
        if self._reduce_each_backward:
            gradients.sum_each_backward(list(self.module.parameters()))
        else:
            gradients.note_synchronised([p for p in self.module.parameters() if p.requires_grad])

    def _run_ddp_forward(self, *inputs: Any, **kwargs: Any) -> Any:
        # The module's own forward, inside torch's: on a rank that holds no part of the batch, one that may not
        # take zero rows (idle.py).
        if idle.take():
            return idle.run(super()._run_ddp_forward, self.module, inputs, kwargs)
        return super()._run_ddp_forward(*inputs, **kwargs)

    def _sync_buffers(self) -> None:
        # A collective of DDP's own, before the forward: told to the lockstep check as ours are, so that a rank
        # held here while a peer waits in a collective only it makes (an evaluation on the main process) is named.
        monitor = self._job.lockstep
        if monitor is None:
            return super()._sync_buffers()
        monitor.counts(torch.zeros(1))
        with monitor.waiting("the broadcast of rank 0's buffers at the start of a forward"):
            return super()._sync_buffers()


def _replica_forward(
    forward, inputs: tuple, kwargs: dict, current: Job, held: HeldParameters, scatter: Any = None
) -> tuple[Any, int]:
    """This rank's replica's output (DataParallel's scatter over the ranks, or a subclass's own), and how many
    devices ran."""
    group = current.group
    if not current.fail_together:
        return _run_replica(forward, inputs, kwargs, current, held, scatter)
    # fail_together(): every rank learns whether any replica raised, and raises the lowest one's error, as
    # DataParallel's one process re-raised its replica's (together.py)
    try:
        result, failure = _run_replica(forward, inputs, kwargs, current, held, scatter), None
    except Exception:
        result, failure = None, ExceptionWrapper(where=f"in replica {group.rank} on device {group.rank}")
    raised = group.first_failure(failure)
    if raised is not None:
        raised.reraise()
    return result


def _run_replica(
    forward, inputs: tuple, kwargs: dict, current: Job, held: HeldParameters, scatter: Any
) -> tuple[Any, int]:
    group = current.group
    if scatter is not None:
        local_inputs, local_kwargs, active = own_machinery.own_part(scatter, inputs, kwargs, group, group.rank, device())
    else:
        active = scatter_gather.active_devices(inputs, kwargs, group.parts)
        ((local_inputs, local_kwargs),) = scatter_gather.scatter(inputs, kwargs, group, active)
    no_part = all(part >= active for part in group.held)  # DataParallel ran no replica on this device
    with global_view.own_forward(current.gradients, group.rank, current.stream), held.rebinding_dropped():
        if no_part and isinstance(forward, nn.Module):  # a FrozenModule's module, called as it is
            return idle.run(forward, forward, local_inputs, local_kwargs), active
        with idle.marked(no_part):  # DDP's forward runs the module in _run_ddp_forward
            return forward(*local_inputs, **local_kwargs), active



class FrozenModule(nn.Module):
    """A module with nothing to train, on this process's device, behind ``.module`` as DataParallel held it
    (so ``state_dict`` keys keep their ``module.`` prefix). Its forward is DataParallel's over the ranks too:
    a distillation teacher's outputs are global values like the student's."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        setup()
        self.module = module.to(device())
        self._switches: frozenset[str] | None = None  # the forward's keywords with bool defaults (_switched)
        self._unused_hook: Any = None  # _zeros_for_the_unused's hook on the parameters, until a backward reaches one
        self._held = HeldParameters(self.module)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        current = job()
        if current.group is None:
            return self.module(*inputs, **kwargs)
        output, active = _replica_forward(self.module, inputs, kwargs, current, self._held)
        return scatter_gather.gather([output], active, current.group)

    def __reduce_ex__(self, protocol: int) -> Any:
        return as_data_parallel(self.module)


def _sharing_parameters(current: Job, module: nn.Module) -> list[DistributedDataParallel]:
    """The job's wrappers whose modules hold a parameter of ``module``."""
    held = {id(parameter) for parameter in module.parameters()}
    return [other for other in list(current.wrappers) if any(id(parameter) in held for parameter in other._watched)]


def _trainable(parameters: list[torch.Tensor]) -> list[bool]:
    return [parameter.requires_grad for parameter in parameters]


# The hooks are unannotated: DDP rejects annotations that are not the real types, and here they are strings.
def _summed(state, bucket):
    """Sum over ranks of each rank's gradient part (a ``dist.GradBucket``), carrying the lockstep counts (``state``
    is the job's lockstep check)."""
    return state.all_reduce(bucket.buffer(), bucket.index())


def _summed_noting(gradients, state, bucket):
    """``_summed``, telling the job's gradients which parameters this backward pass summed (``Gradients._kept_whole``:
    a gradient accumulated over several passes is summed once each)."""
    gradients.note_reduced(bucket.parameters())
    return state.all_reduce(bucket.buffer(), bucket.index())


def _keep_local(state, bucket):
    """A world of one: the local gradient is the result."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _refuse_thread_linked_layers(module: nn.Module) -> None:
    """A layer that meets its copies in DataParallel's replica threads would wait forever here, where each
    process holds one replica (``mgpu_runtime.replica_links``): say so at the wrap, before any process waits."""
    linked = list(thread_linked(module))
    if linked:
        name, layer = linked[0]
        others = f", and {len(linked) - 1} more layer(s)" if len(linked) > 1 else ""
        raise TypeError(
            f"mgpu_runtime.DistributedDataParallel: `{name or 'the model'}` ({type(layer).__module__}."
            f"{type(layer).__qualname__}{others}) meets its copies across "
            "nn.DataParallel's replica threads through queues or barriers it holds; under DDP each process holds "
            "one replica, and the first would wait forever for the others. Use torch.nn.SyncBatchNorm (or the "
            "layer's own DistributedDataParallel version) in its place, or migrate with --to balanced"
        )

