"""``torch.nn.DataParallel`` on the emulated devices: the reference every migration is measured against.

``install(count)`` emulates ``count`` devices (``devices.install``) and puts this module's ``DataParallel``
and ``data_parallel`` where torch has its own (``torch.nn``, ``torch.nn.parallel``,
``torch.nn.parallel.data_parallel``), with the pieces they are built of (``scatter``, ``scatter_kwargs``,
``gather``, ``replicate``, ``parallel_apply``), so a script's own DataParallel subclass that calls them
gets these too (the collectives a project's synchronized BatchNorm calls itself come with the emulated devices:
``devices``, ``collectives``). ``DataParallel`` subclasses torch's, so ``isinstance`` checks against torch's class hold.
It is written independently of ``mgpu_runtime.balanced`` and ``mgpu_runtime.distributed``: a reference
shares no code with what it checks.

What torch 2.13 does, read in ``torch/nn/parallel/`` (``data_parallel.py``, ``scatter_gather.py``,
``replicate.py``, ``parallel_apply.py``, ``_functions.py``) and in the C++ of ``comm.scatter``,
``comm.gather`` and ``comm.broadcast_coalesced``, and what is kept here:

* **Scatter.** A tensor is cut by ``tensor.chunk(len(device_ids), dim)``: 5 rows over 3 devices are
  2, 2, 1, and 4 rows over 3 are 2, 2, so only two devices run. The chunk for the batch's own device stays a
  view of the batch; the others are copies. The emulation takes the usual case, a batch already on device
  0 (``x.to(device)`` before the call). Tuples, lists, dicts and namedtuples are split element by element
  and zipped, so the shortest decides how many devices run; any other object is repeated once per device
  (not per chunk). ``scatter_kwargs`` pads the positional inputs with ``()`` up to the kwargs' count, but
  pads the kwargs only when they are fewer than the *unscattered* inputs: with 4 rows on 3 devices and a
  non-tensor keyword, the third replica is called with no positional input at all, as on GPUs.
* **One device, one chunk.** With one device id the module itself runs, directly. With several ids and a
  batch that yields one chunk, torch still replicates onto that one device and gathers: a 0-dim output
  comes back as a 1-element vector.
* **Replicate.** Parameters go through an autograd ``Broadcast``. ``broadcast_coalesced`` returns its
  input tensors themselves for ``devices[0]`` (fresh variables, with their own version counters, for the
  others), and autograd turns an input returned from a Function into a view of it: replica 0 computes
  with views of the module's own parameters. Buffers that do not require grad always take the detached
  path, so replica 0 holds the module's very buffer tensors: its in-place updates (BatchNorm's running
  statistics and ``num_batches_tracked``) persist, while replicas 1.. update copies that are dropped.
  Under ``no_grad`` (``detach``) replica 0 holds the module's parameters too. The backward sums every
  replica's gradient into the module's parameters, device by device (``ReduceAddCoalesced``).
  Replicas are ``Module._replicate_for_data_parallel`` copies (their own ``__dict__``): attributes set in
  ``forward`` are lost, on replica 0 too. torch never calls ``__data_parallel_replicate__``; that callback
  belongs to the synchronized-BatchNorm packages' own wrappers, which call it from their ``replicate``.
* **Apply.** torch runs the replicas in threads and re-raises the first failure (by replica) as
  ``Caught X in replica i on device d.``, after all have run. Here they run one after another in device
  order, each inside ``devices.on_device(d)``: exact, since each GPU draws from its own generator, and the
  failure is raised the same way. Replicas that wait for each other (a synchronized BatchNorm, whose layers
  define ``__data_parallel_replicate__`` or hold queues or barriers: ``mgpu_runtime.replica_links``) cannot
  run one after another: those run in
  threads, as torch runs them, and a random draw among them is refused (they would share one stream).
* **Gather.** Tensors are concatenated along ``dim`` into a new tensor, one output included, with
  ``comm.gather``'s shape checks and messages. When every output is 0-dim and ``dim`` is 0, each becomes a
  1-element vector first, with torch's warning: a loss computed in ``forward`` comes back as a W-vector,
  whose ``.backward()`` fails as torch's does. ``None`` stays None; dicts are rebuilt with their type and
  the first one's keys (all must have as many keys); namedtuples through ``_make``; any other value through
  ``type(out)(...)`` over ``zip(*outputs, strict=True)``, which fails for a number or a plain dataclass
  exactly as torch fails.
* **No devices.** Without devices (``install(0)``), ``DataParallel`` runs the module as is and sets only
  ``module`` and ``device_ids = []`` (torch sets ``dim`` and ``output_device`` only with devices), and the
  functional form raises torch's "device type could not be determined".

Differences that cannot be helped: every tensor is on the CPU (``src_device_obj`` is the CPU device, and
the device check on the module's parameters is skipped); autocast and streams have no CPU meaning here;
``inference_mode`` reaches the replicas (torch's threads see only the grad mode); the emulation follows
torch 2.13, which needs Python 3.10 (``zip(strict=True)``).
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch._utils import ExceptionWrapper
from torch.nn.parallel.parallel_apply import get_a_var

from mgpu_runtime.emulation import devices
from mgpu_runtime import replica_links
from mgpu_runtime.replica_links import waits_for_copies

_TorchDataParallel = nn.DataParallel


def _device_index(device: int | str | torch.device) -> int:
    """A device id as DataParallel takes it: an index, ``'cuda:1'``, ``torch.device('cuda', 1)``;
    ``'cuda'`` alone is the current device."""
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type == "cpu":
        raise ValueError(f"Expected a non cpu device, but got: {device}")
    return devices.current_device() if device.index is None else device.index


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_asdict") and hasattr(value, "_fields")


# Scatter


def scatter(inputs: Any, target_gpus: Sequence, dim: int = 0) -> list:
    """One piece of ``inputs`` per device that gets a share (see the module's doc)."""
    return _pieces(inputs, len(target_gpus), dim)


def _pieces(value: Any, count: int, dim: int) -> list:
    if isinstance(value, torch.Tensor):
        chunks = value.chunk(count, dim)
        return [chunks[0], *(chunk.clone() for chunk in chunks[1:])]
    if _is_namedtuple(value):
        return [type(value)(*fields) for fields in zip(*(_pieces(field, count, dim) for field in value))]
    if isinstance(value, tuple) and value:
        return list(zip(*(_pieces(item, count, dim) for item in value)))
    if isinstance(value, list) and value:
        return [list(items) for items in zip(*(_pieces(item, count, dim) for item in value))]
    if isinstance(value, dict) and value:
        return [type(value)(items) for items in zip(*(_pieces(item, count, dim) for item in value.items()))]
    return [value] * count


def scatter_kwargs(inputs: tuple, kwargs: dict | None, target_gpus: Sequence, dim: int = 0) -> tuple[tuple, tuple]:
    """The positional and keyword inputs of each replica, padded as torch pads them (see the module's doc)."""
    scattered_inputs = scatter(inputs, target_gpus, dim) if inputs else []
    scattered_kwargs = scatter(kwargs, target_gpus, dim) if kwargs else []
    if len(scattered_inputs) < len(scattered_kwargs):
        scattered_inputs += [()] * (len(scattered_kwargs) - len(scattered_inputs))
    elif len(scattered_kwargs) < len(inputs):
        scattered_kwargs += [{} for _ in range(len(scattered_inputs) - len(scattered_kwargs))]
    return tuple(scattered_inputs), tuple(scattered_kwargs)


# Gather


def gather(outputs: Sequence, target_device: Any, dim: int = 0) -> Any:
    """The replicas' outputs as one value (see the module's doc); everything is on the CPU, so
    ``target_device`` names where torch would have put it."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return _concatenate(outputs, dim)
    if first is None:
        return None
    if isinstance(first, dict):
        if not all(len(first) == len(output) for output in outputs):
            raise ValueError("All dicts must have the same number of keys")
        return type(first)((key, gather([output[key] for output in outputs], target_device, dim)) for key in first)
    if _is_namedtuple(first):
        return type(first)._make(gather(parts, target_device, dim) for parts in zip(*outputs, strict=True))
    return type(first)(gather(parts, target_device, dim) for parts in zip(*outputs, strict=True))


def _concatenate(tensors: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    if dim == 0 and all(tensor.dim() == 0 for tensor in tensors):
        warnings.warn(
            "Was asked to gather along dimension 0, but all input tensors were scalars; "
            "will instead unsqueeze and return a vector.",
            stacklevel=2,
        )
        tensors = [tensor.view(1) for tensor in tensors]
    expected = list(tensors[0].shape)
    for index, tensor in enumerate(tensors):
        if tensor.dim() != len(expected):
            # comm.gather's own message, its missing space included
            raise RuntimeError(
                "Expected all input tensors to have the same number of dimensions, but tensor at index "
                f"{index}has {tensor.dim()} dimensions, (expected {len(expected)})"
            )
        expected[dim] = tensor.size(dim)
        if list(tensor.shape) != expected:
            raise RuntimeError(f"Input tensor at index {index} has invalid shape {list(tensor.shape)}, but expected {expected}")
    return torch.cat(list(tensors), dim)


# Replicate


class _Broadcast(torch.autograd.Function):
    """Each device's copies of ``tensors``; the backward sums the copies' gradients, device by device."""

    @staticmethod
    def forward(ctx, copies: int, *tensors: torch.Tensor):
        ctx.tensor_count = len(tensors)
        # Device 0's are the tensors themselves (autograd makes each a view of its input).
        outputs = list(tensors)
        for _ in range(1, copies):
            outputs += [tensor.clone(memory_format=torch.contiguous_format) for tensor in tensors]
        frozen = [i for i, needs_grad in enumerate(ctx.needs_input_grad[1:]) if not needs_grad]
        ctx.mark_non_differentiable(*(outputs[i + device * len(tensors)] for i in frozen for device in range(copies)))
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        count = ctx.tensor_count
        return (None, *(sum(grads[i + count :: count], grads[i]) for i in range(count)))


def _broadcast(tensors: list[torch.Tensor], copies: int, detach: bool) -> list[list[torch.Tensor]]:
    if not tensors:
        return []
    if detach:
        fresh = [[tensor.detach().clone(memory_format=torch.contiguous_format) for tensor in tensors] for _ in range(1, copies)]
        return [list(tensors), *fresh]
    flat = _Broadcast.apply(copies, *tensors)
    return [list(flat[device * len(tensors) : (device + 1) * len(tensors)]) for device in range(copies)]


def replicate(network: nn.Module, devices_: Sequence, detach: bool = False) -> list[nn.Module]:
    """One replica of ``network`` per device (see the module's doc)."""
    if not devices_:
        return []
    copies = len(devices_)
    parameters = list(network.parameters())
    parameter_copies = _broadcast(parameters, copies, detach)
    parameter_index = {parameter: i for i, parameter in enumerate(parameters)}
    buffers = list(network.buffers())
    tracked = [buffer for buffer in buffers if buffer.requires_grad and not detach]
    untracked = [buffer for buffer in buffers if not (buffer.requires_grad and not detach)]
    buffer_copies: dict[torch.Tensor, list[torch.Tensor]] = {}  # each buffer's copy per device
    for group, group_detached in ((tracked, detach), (untracked, True)):
        per_device = _broadcast(group, copies, group_detached)
        for i, buffer in enumerate(group):
            buffer_copies[buffer] = [device_copies[i] for device_copies in per_device]

    modules = list(network.modules())
    position = {module: i for i, module in enumerate(modules)}
    replicas = [[module._replicate_for_data_parallel() for module in modules] for _ in range(copies)]
    for device, device_replicas in enumerate(replicas):
        for module, replica in zip(modules, device_replicas):
            replica._former_parameters = {}  # what torch's replicate leaves for DDP's use
            for key, child in module._modules.items():
                if child is None:
                    replica._modules[key] = None
                else:
                    setattr(replica, key, device_replicas[position[child]])
            for key, parameter in module._parameters.items():
                if parameter is None:
                    replica._parameters[key] = None
                else:
                    parameter_copy = parameter_copies[device][parameter_index[parameter]]
                    setattr(replica, key, parameter_copy)
                    replica._former_parameters[key] = parameter_copy
            for key, buffer in module._buffers.items():
                if buffer is None:
                    replica._buffers[key] = None
                else:
                    setattr(replica, key, buffer_copies[buffer][device])
    return [device_replicas[0] for device_replicas in replicas]


# Apply


def parallel_apply(modules: Sequence[nn.Module], inputs: Sequence, kwargs_tup: Sequence[dict] | None = None, devices_: Sequence | None = None) -> list:
    """Each replica applied to its inputs on its device (see the module's doc)."""
    if len(modules) != len(inputs):
        raise AssertionError(f"The number of modules {len(modules)} is not equal to the number of inputs {len(inputs)}")
    if kwargs_tup is None:
        kwargs_tup = ({},) * len(modules)
    elif len(modules) != len(kwargs_tup):
        raise AssertionError(f"The number of modules {len(modules)} is not equal to the number of kwargs_tup {len(kwargs_tup)}")
    if devices_ is None:
        # torch reads each replica's device off a tensor in its inputs: the i-th chunk's device is i
        indices = [i if get_a_var(item) is not None else None for i, item in enumerate(inputs)]
    elif len(modules) != len(devices_):
        raise AssertionError(f"The number of modules {len(modules)} is not equal to the number of devices {len(devices_)}")
    else:
        indices = [_device_index(device) for device in devices_]
    work = list(zip(range(len(modules)), modules, inputs, kwargs_tup, indices))
    if len(modules) > 1 and waits_for_copies(modules[0]):
        results = _apply_together(work)
    else:
        results = [_apply_one(*item, as_device=True) for item in work]
    for result in results:
        if isinstance(result, ExceptionWrapper):
            result.reraise()
    return results


def _apply_one(position: int, module: nn.Module, inputs: Any, kwargs: dict, device: int | None, as_device: bool) -> Any:
    if device is None:
        # Made outside an exception, as torch makes it: it re-raises as "RuntimeError: Caught NoneType in replica ..."
        where = f"in replica {position}, no device was provided and no tensor input was found; device cannot be resolved"
        return ExceptionWrapper(where=where)
    try:
        with devices.on_device(device) if as_device else contextlib.nullcontext():
            if not isinstance(inputs, (list, tuple)):
                inputs = (inputs,)
            return module(*inputs, **kwargs)
    except Exception:
        return ExceptionWrapper(where=f"in replica {position} on device {device}")


def _apply_together(work: list) -> list:
    """Replicas that wait for each other, in threads as torch runs them; they may not draw random numbers,
    since the emulation cannot give threads running at once a stream each."""
    grad_enabled = torch.is_grad_enabled()
    results: list = [None] * len(work)
    stream = torch.get_rng_state()

    def job(item: tuple) -> Callable[[], None]:
        def run() -> None:
            torch.set_grad_enabled(grad_enabled)
            results[item[0]] = _apply_one(*item, as_device=False)

        return run

    waiting = replica_links.run_at_once(
        [job(item) for item in work], lambda: any(isinstance(result, ExceptionWrapper) for result in results)
    )
    if waiting:
        failure = next(result for result in results if isinstance(result, ExceptionWrapper))
        failure.exc_msg += "\n" + replica_links.still_waiting(waiting)
        failure.reraise()
    if not torch.equal(torch.get_rng_state(), stream):
        raise RuntimeError(
            "the replicas of this forward wait for each other (a layer defines __data_parallel_replicate__), so the "
            "emulation runs them in threads at once, and they drew random numbers: it cannot give each device its own "
            "stream then"
        )
    return results


# The module and its functional form


class DataParallel(_TorchDataParallel):
    """``torch.nn.DataParallel`` on the emulated devices (see the module's doc)."""

    def __init__(self, module: nn.Module, device_ids: Sequence | None = None, output_device: Any = None, dim: int = 0) -> None:
        nn.Module.__init__(self)  # torch's __init__ asks the CUDA driver for the devices
        if devices.count() == 0:
            self.module = module
            self.device_ids = []
            return
        if device_ids is None:
            device_ids = list(range(devices.count()))
        if output_device is None:
            output_device = device_ids[0]
        self.dim = dim
        self.module = module
        self.device_ids = [_device_index(device) for device in device_ids]
        self.output_device = _device_index(output_device)
        self.src_device_obj = torch.device("cpu")  # where the emulated devices keep their tensors
        for index in self.device_ids:
            if not 0 <= index < devices.count():
                raise AssertionError("Invalid device id")  # torch.cuda.get_device_properties', from the balance check

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if not self.device_ids:
            return self.module(*inputs, **kwargs)
        inputs, module_kwargs = self.scatter(inputs, kwargs, self.device_ids)
        if not inputs and not module_kwargs:
            inputs, module_kwargs = ((),), ({},)
        if len(self.device_ids) == 1:
            with devices.on_device(self.device_ids[0]):
                return self.module(*inputs[0], **module_kwargs[0])
        replicas = self.replicate(self.module, self.device_ids[: len(inputs)])
        outputs = self.parallel_apply(replicas, inputs, module_kwargs)
        return self.gather(outputs, self.output_device)

    def replicate(self, module: nn.Module, device_ids: Sequence) -> list[nn.Module]:
        return replicate(module, device_ids, not torch.is_grad_enabled())

    def scatter(self, inputs: tuple, kwargs: dict | None, device_ids: Sequence) -> tuple[tuple, tuple]:
        return scatter_kwargs(inputs, kwargs, device_ids, dim=self.dim)

    def parallel_apply(self, replicas: Sequence[nn.Module], inputs: Sequence, kwargs: Sequence[dict]) -> list:
        return parallel_apply(replicas, inputs, kwargs, self.device_ids[: len(replicas)])

    def gather(self, outputs: Sequence, output_device: Any) -> Any:
        return gather(outputs, output_device, dim=self.dim)


def data_parallel(
    module: nn.Module, inputs: Any, device_ids: Sequence | None = None, output_device: Any = None, dim: int = 0, module_kwargs: Any = None
) -> Any:
    """``torch.nn.parallel.data_parallel`` on the emulated devices."""
    if not isinstance(inputs, tuple):
        inputs = (inputs,) if inputs is not None else ()
    if devices.count() == 0:
        raise RuntimeError("device type could not be determined")
    if device_ids is None:
        device_ids = list(range(devices.count()))
    if output_device is None:
        output_device = device_ids[0]
    device_ids = [_device_index(device) for device in device_ids]
    output_device = _device_index(output_device)
    inputs, module_kwargs = scatter_kwargs(inputs, module_kwargs, device_ids, dim)
    if not inputs and not module_kwargs:
        inputs, module_kwargs = ((),), ({},)
    if len(device_ids) == 1:
        with devices.on_device(device_ids[0]):
            return module(*inputs[0], **module_kwargs[0])
    used = device_ids[: len(inputs)]
    replicas = replicate(module, used)  # the functional form never detaches, also under no_grad
    return gather(parallel_apply(replicas, inputs, module_kwargs, used), output_device, dim)


# Where torch keeps each name, and what stands there once installed.
_REPLACEMENTS = {
    "torch.nn": {"DataParallel": DataParallel},
    "torch.nn.parallel": {
        "DataParallel": DataParallel,
        "data_parallel": data_parallel,
        "scatter": scatter,
        "gather": gather,
        "replicate": replicate,
        "parallel_apply": parallel_apply,
    },
    "torch.nn.parallel.data_parallel": {"DataParallel": DataParallel, "data_parallel": data_parallel},
    "torch.nn.parallel.scatter_gather": {"scatter": scatter, "scatter_kwargs": scatter_kwargs, "gather": gather},
    "torch.nn.parallel.replicate": {"replicate": replicate},
    "torch.nn.parallel.parallel_apply": {"parallel_apply": parallel_apply},
}
_replaced: list[tuple[object, str, object]] = []


def install(device_count: int) -> None:
    """Emulate ``device_count`` devices and put the emulated DataParallel in torch's place (idempotent)."""
    devices.install(device_count)
    if _replaced:
        return
    for module_name, names in _REPLACEMENTS.items():
        namespace = importlib.import_module(module_name)
        for name, replacement in names.items():
            _replaced.append((namespace, name, getattr(namespace, name)))
            setattr(namespace, name, replacement)


def uninstall() -> None:
    """Give torch back its DataParallel and its CUDA functions."""
    while _replaced:
        namespace, name, original = _replaced.pop()
        setattr(namespace, name, original)
    devices.uninstall()
