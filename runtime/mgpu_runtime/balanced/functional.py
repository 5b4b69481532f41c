"""The balanced forward, shared by ``DataParallelModel`` and the functional ``data_parallel``."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import torch
from torch import nn

from mgpu_runtime.balanced.devices import DeviceId, Devices, resolve_devices
from mgpu_runtime.balanced.outputs import Pieces, as_output
from mgpu_runtime.balanced.parallel_apply import parallel_apply
from mgpu_runtime.balanced.piece_losses import SharedDraws, marking_losses
from mgpu_runtime.balanced.replicate import replicate
from mgpu_runtime.balanced.scatter import batch_size, scatter_inputs, split_sizes


def parallel_forward(
    module: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any], devices: Devices, dim: int
) -> Any:
    """``module(*inputs, **kwargs)`` split over ``devices``, returned per replica (see ``outputs``).

    Without replicas the module runs as is; with one device it runs once on that device, without threads
    or copies of the module, so wrapping a single-GPU model costs nothing measurable.
    """
    rows = batch_size((inputs, kwargs), dim)
    if not devices.replicas:
        return as_output(Pieces([module(*inputs, **kwargs)], (rows,), dim, devices))
    sizes = split_sizes(rows, len(devices.replicas))
    used = devices.replicas[: len(sizes)]
    piece_inputs, piece_kwargs = scatter_inputs(inputs, kwargs, sizes, dim, used)
    if len(devices.replicas) == 1:
        return as_output(Pieces([module(*piece_inputs[0], **piece_kwargs[0])], sizes, dim, devices))
    _check_module_device(module, devices.replicas[0])
    draws = SharedDraws(sizes, devices.replicas[0])
    replicas = [marking_losses(replica, draws, index) for index, replica in enumerate(replicate(module, used))]
    outputs = parallel_apply(replicas, piece_inputs, piece_kwargs, devices)
    return as_output(Pieces(outputs, sizes, dim, devices))


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
