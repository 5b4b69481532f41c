"""The balanced forward, shared by ``DataParallelModel`` and the functional ``data_parallel``.

The forward is DataParallel's (``mgpu_runtime.sharded.scatter_gather``): the batch cut by ``torch.chunk``, a
replica per device (the first holding the module's own parameters and buffers), each replica's forward on
its device, drawing from that device's random stream. Only the gather differs: the outputs stay on their
devices, held as ``Sharded`` values over the replicas (``ReplicaGroup``), which behave as the gathered output
wherever the loop uses them, so nothing large is gathered on the output device unless something needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import torch
from torch import nn

from mgpu_runtime.balanced.devices import DeviceId, Devices, resolve_devices
from mgpu_runtime.balanced.parallel_apply import parallel_apply
from mgpu_runtime.balanced.replicate import replicate as replicate_module
from mgpu_runtime.balanced.scatter import batch_size, scatter_inputs, split_sizes
from mgpu_runtime.sharded import ReplicaGroup, materialize, scatter_gather

# A DataParallel subclass's scatter, its device ids given: (inputs, kwargs) -> (each part's inputs, each one's kwargs).
Scatter = Callable[[tuple[Any, ...], dict[str, Any]], tuple[Sequence[Any], Sequence[dict[str, Any]]]]
# A DataParallel subclass's gather, its output device given: the replicas' outputs -> the forward's value.
Gather = Callable[[list[Any]], Any]


def parallel_forward(
    module: nn.Module,
    inputs: tuple[Any, ...],
    kwargs: dict[str, Any],
    devices: Devices,
    dim: int,
    replicate: Callable[[nn.Module, Sequence[torch.device]], Sequence[nn.Module]] = replicate_module,
    scatter: Scatter | None = None,
    gather: Gather | None = None,
) -> Any:
    """``module(*inputs, **kwargs)`` split over ``devices`` (see the module doc).

    Without replicas the module runs as is; with one device it runs once, on that device, without threads,
    copies of the module or a gather, as DataParallel does. ``scatter`` and ``gather`` are a DataParallel
    subclass's own (a detection project's, which places each device's images itself and stacks each device's
    losses), its device ids given, called as DataParallel called them: the scatter cuts the batch instead of
    ``torch.chunk`` (also on one device), each part runs on its replica, and the gather's value is the forward's,
    held where it put it, instead of the outputs held on their replicas.
    """
    if not devices.replicas:
        return module(*materialize(inputs), **materialize(kwargs))
    if scatter is not None:
        parts = scatter_gather.own_parts(scatter(materialize(inputs), materialize(kwargs)), len(devices.replicas), "devices")
        active = len(parts)
    elif dim != 0:
        return _along_another_dimension(module, inputs, kwargs, devices, dim, replicate, gather)
    else:
        active = scatter_gather.active_devices(inputs, kwargs, len(devices.replicas))
    group = ReplicaGroup(devices.replicas, devices.output, active)
    if scatter is None:
        parts = scatter_gather.scatter(inputs, kwargs, group, active)
    if len(devices.replicas) == 1:
        with devices.stream(0):
            return module(*parts[0][0], **parts[0][1])
    _check_module_device(module, devices.replicas[0])
    replicas = replicate(module, devices.replicas[:active])  # a wrapper's own (patch_replication_callback)
    outputs = parallel_apply(replicas, [args for args, _ in parts], [kw for _, kw in parts], devices)
    return gather(outputs) if gather is not None else scatter_gather.gather(outputs, active, group)


def _along_another_dimension(
    module: nn.Module,
    inputs: tuple[Any, ...],
    kwargs: dict[str, Any],
    devices: Devices,
    dim: int,
    replicate: Callable[[nn.Module, Sequence[torch.device]], Sequence[nn.Module]],
    gather: Gather | None,
) -> Any:
    """``dim != 0`` (a sequence-first RNN): DataParallel's forward, gathered along ``dim`` on the output device.
    The loop's values are held in pieces along the rows only, so here they are plain tensors."""
    inputs, kwargs = materialize(inputs), materialize(kwargs)
    rows = batch_size((inputs, kwargs), dim)
    sizes = split_sizes(rows, len(devices.replicas))
    used = devices.replicas[: len(sizes)]
    piece_inputs, piece_kwargs = scatter_inputs(inputs, kwargs, sizes, dim, used)
    if len(used) == 1:
        with devices.stream(0):
            return module(*piece_inputs[0], **piece_kwargs[0])
    _check_module_device(module, devices.replicas[0])
    outputs = parallel_apply(replicate(module, used), piece_inputs, piece_kwargs, devices)
    return gather(outputs) if gather is not None else _gather_along(outputs, dim, devices.output)


def _gather_along(outputs: Sequence[Any], dim: int, device: torch.device) -> Any:
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        moved = [output.to(device) for output in outputs]
        return torch.cat(moved, dim) if first.dim() > 0 else torch.stack(moved)
    if first is None:
        return None
    if isinstance(first, dict):
        return type(first)((key, _gather_along([output[key] for output in outputs], dim, device)) for key in first)
    if isinstance(first, tuple) and hasattr(type(first), "_fields"):
        return type(first)(*(_gather_along(parts, dim, device) for parts in zip(*outputs)))
    return type(first)(_gather_along(parts, dim, device) for parts in zip(*outputs))


def data_parallel(
    module: nn.Module,
    inputs: Any,
    device_ids: Sequence[DeviceId] | None = None,
    output_device: DeviceId | None = None,
    dim: int = 0,
    module_kwargs: dict[str, Any] | None = None,
) -> Any:
    """The functional form of ``DataParallelModel``, with ``torch.nn.parallel.data_parallel``'s signature."""
    if not isinstance(inputs, tuple):
        inputs = () if inputs is None else (inputs,)
    devices = resolve_devices(device_ids, output_device)
    return parallel_forward(module, inputs, module_kwargs or {}, devices, dim)


def _check_module_device(module: nn.Module, device: torch.device) -> None:
    # The same precondition as nn.DataParallel: replicas are made from the module on device_ids[0].
    for tensor in chain(module.parameters(), module.buffers()):
        if tensor.device != device:
            raise RuntimeError(
                f"module must have its parameters and buffers on {device} (device_ids[0]) "
                f"but found one of them on {tensor.device}"
            )
