"""``DistributedDataParallel``: torch's DDP, placed on this process's device, reducing gradients exactly.

A subclass of ``torch.nn.parallel.DistributedDataParallel``, so ``isinstance`` checks, ``.module``,
``no_sync()`` and the ``module.``-prefixed ``state_dict`` keys (the same as the DataParallel original's)
all behave as torch's. What differs is how gradients are combined (a DDP communication hook):

* More than one process: each rank's gradient is weighted by its share of the global batch (``share.py``)
  and the weighted gradients are summed, instead of averaged with equal weights. A loss that is a mean over
  the rank's own rows (an HF-style ``outputs.loss``, ``F.mse_loss`` ...) then gives exactly the gradient of
  the mean over the global batch, uneven last batch included; a rank with no rows adds nothing (its
  gradient is zeroed, which also discards the NaN of a mean over no rows). ``DistributedCriterion`` scales
  its loss to fit this rule, so sums and weighted cross-entropy come out exact too (``losses.py``).
* The reduction also carries the lockstep check (``lockstep.py``): ranks that reduce different steps'
  gradients, or a collective that times out, stop with a message naming the ranks. For it, DDP's first
  bucket is made one parameter (``bucket_cap_mb_list``) unless the script sets its own bucket sizes.
* One process: no communication at all. The gradient is already the whole batch's.

With more than one process the wrapper also feeds the safety net (``safety.py``): at the first training
forward it makes every process's weights rank 0's if a script changed them after the wrap, and it
fingerprints the inputs of training forwards until the first step, which checks that processes given whole
batches were given the same ones.

``device_ids`` and ``output_device`` (DataParallel's arguments, naming all the GPUs of one process) are
accepted and ignored: here each process has exactly one device, ``device()``. Other keyword arguments go to
torch's DDP unchanged (``find_unused_parameters=True`` for a model that skips parameters in some steps).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from mgpu_runtime.device_losses import mark_device_losses
from mgpu_runtime.distributed import lockstep, safety, sync_batchnorm
from mgpu_runtime.distributed.losses import inside_model
from mgpu_runtime.distributed.process_group import device, setup, world_size
from mgpu_runtime.distributed.share import gradient_weight
from mgpu_runtime.pickling import as_data_parallel

_TorchDDP = nn.parallel.DistributedDataParallel
# Renamed in recent torch (broadcast_buffers is deprecated there); the spelling this torch understands.
_BUFFER_SYNC_ARGUMENT = (
    "forward_sync_buffers"
    if "forward_sync_buffers" in inspect.signature(_TorchDDP.__init__).parameters
    else "broadcast_buffers"
)


class DistributedDataParallel(_TorchDDP):
    """Drop-in for ``nn.DataParallel(module, ...)`` in a migrated script: one process, one device, one wrapper.

    A module with nothing to train (every parameter frozen: a distillation teacher, a perceptual-loss
    network) gives a ``FrozenModule`` instead: torch's DDP refuses such a module, and there is nothing to
    synchronise, while DataParallel held it without complaint.
    """

    def __new__(cls, module: nn.Module, *args: Any, **kwargs: Any):
        if not any(parameter.requires_grad for parameter in module.parameters()):
            return FrozenModule(module)
        return super().__new__(cls)

    def __init__(
        self,
        module: nn.Module,
        device_ids: Sequence[Any] | None = None,
        output_device: Any = None,
        dim: int = 0,
        **kwargs: Any,
    ) -> None:
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
        self.register_comm_hook(None, _share_weighted_sum if processes > 1 else _keep_local)
        self._checks_processes = processes > 1
        self._aligned = False
        # What the original's nn.DataParallel was given: a pickle of this wrapper is that DataParallel.
        listed = None if device_ids is None else list(device_ids)
        self._data_parallel_arguments = {"device_ids": listed, "output_device": output_device, "dim": dim}

    def __reduce_ex__(self, protocol: int) -> Any:
        return as_data_parallel(self.module, **self._data_parallel_arguments)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if self._checks_processes and self.training:
            if not self._aligned and torch.is_grad_enabled():
                self._aligned = True  # every process trains in step, so this collective is met everywhere
                safety.align_replicas(self.module, self.process_group)
            safety.note_forward(inputs, kwargs)
            if torch.is_grad_enabled():
                lockstep.note_forward()
        with inside_model():  # the model's own sums are not loss terms (losses.py)
            output = super().forward(*inputs, **kwargs)
        # DataParallel gathered a loss computed in forward as a vector of per-device losses (device_losses.py).
        return mark_device_losses(output) if self._checks_processes else output


class FrozenModule(nn.Module):
    """A module with nothing to train, on this process's device, behind ``.module`` as DataParallel held it
    (so ``state_dict`` keys keep their ``module.`` prefix); its forward is the module's own."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        setup()
        self.module = module.to(device())

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.module(*inputs, **kwargs)

    def __reduce_ex__(self, protocol: int) -> Any:
        return as_data_parallel(self.module)


# The hooks are unannotated: DDP rejects annotations that are not the real types, and here they are strings.
def _share_weighted_sum(state, bucket):
    """Sum over ranks of each rank's gradient (a ``dist.GradBucket``) times its share of the global batch."""
    weight = gradient_weight(dist.get_world_size())
    buffer = bucket.buffer()
    if weight == 0.0:
        buffer.zero_()  # multiplying would keep the NaN of an empty mean
    else:
        buffer.mul_(weight)
    return lockstep.all_reduce(buffer, bucket.index())


def _keep_local(state, bucket):
    """A world of one: the local gradient is the result."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future
