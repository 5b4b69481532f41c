"""The collectives of ``torch.nn.parallel`` on the emulated devices (``devices.install`` puts them in torch's place).

A synchronized BatchNorm of a project's own (vacancy's Synchronized-BatchNorm, kept by pytorch-deeplab-xception and
first-order-model) sums its replicas' statistics on the master replica with ``_functions.ReduceAddCoalesced`` and
hands them back with ``_functions.Broadcast``, which call ``comm.reduce_add_coalesced`` and
``comm.broadcast_coalesced``. torch runs these on GPUs only (``Broadcast`` refuses CPU tensors, ``reduce_add``
expects GPU inputs), so on the emulated devices the master replica failed and the others waited for it forever.
These give the same values on the CPU, for the DataParallel reference and the runtime's CPU replicas alike: a copy
of each tensor per device (the first device's are the tensors themselves, as ``broadcast_coalesced`` returns
them), and each tensor's copies summed from the destination's, the others in device order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.parallel._functions
import torch.nn.parallel.comm

def broadcast_coalesced(tensors: Sequence[torch.Tensor], devices_: Sequence, buffer_size: int = 0) -> tuple:
    """``comm.broadcast_coalesced``: the first device's are the tensors themselves, the others' copies."""
    del buffer_size
    copies = [tuple(tensor.detach().clone(memory_format=torch.contiguous_format) for tensor in tensors) for _ in devices_[1:]]
    return (tuple(tensors), *copies)


def broadcast(tensor: torch.Tensor, devices_: Sequence | None = None, *, out: Any = None) -> tuple:
    """``comm.broadcast`` of one tensor."""
    if out is not None:
        raise RuntimeError("the emulated comm.broadcast takes devices, not out=")
    return tuple(copies[0] for copies in broadcast_coalesced([tensor], devices_ or []))


def reduce_add(inputs: Sequence[torch.Tensor], destination: int | None = None) -> torch.Tensor:
    """``comm.reduce_add``: the sum of one tensor's copies, from the destination's, the others in device order."""
    root = 0 if destination is None or destination < 0 else min(destination, len(inputs) - 1)
    total = inputs[root].clone()
    for index, tensor in enumerate(inputs):
        if index != root:
            total.add_(tensor)
    return total


def reduce_add_coalesced(inputs: Sequence[Sequence[torch.Tensor]], destination: int | None = None, buffer_size: int = 0) -> list:
    """``comm.reduce_add_coalesced``: for each tensor, the sum of its copies over the devices."""
    del buffer_size
    return [reduce_add(list(copies), destination) for copies in zip(*inputs)]


class Broadcast(torch.autograd.Function):
    """``torch.nn.parallel._functions.Broadcast`` on the emulated devices: each device's copies of ``inputs``,
    flat; the backward sums them (``ReduceAddCoalesced``)."""

    @staticmethod
    def forward(ctx, target_gpus, *inputs):
        ctx.target_gpus = list(target_gpus)
        if not inputs:
            return ()
        ctx.num_inputs = len(inputs)
        ctx.input_device = 0
        outputs = broadcast_coalesced(inputs, ctx.target_gpus)
        frozen = [output[index] for index, needs in enumerate(ctx.needs_input_grad[1:]) if not needs for output in outputs]
        ctx.mark_non_differentiable(*frozen)
        return tuple(tensor for copies in outputs for tensor in copies)

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (None, *ReduceAddCoalesced.apply(ctx.input_device, ctx.num_inputs, *grad_outputs))


class ReduceAddCoalesced(torch.autograd.Function):
    """``torch.nn.parallel._functions.ReduceAddCoalesced`` on the emulated devices: ``grads`` are ``num_inputs``
    tensors per device, summed over the devices; the backward hands each device the sums' gradients
    (``Broadcast``)."""

    @staticmethod
    def forward(ctx, destination, num_inputs, *grads):
        ctx.target_gpus = list(range(len(grads) // num_inputs))
        per_device = [grads[index : index + num_inputs] for index in range(0, len(grads), num_inputs)]
        return tuple(reduce_add_coalesced(per_device, destination))

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (None, None, *Broadcast.apply(ctx.target_gpus, *grad_outputs))


REPLACEMENTS: dict[Any, dict[str, Any]] = {
    torch.nn.parallel._functions: {"Broadcast": Broadcast, "ReduceAddCoalesced": ReduceAddCoalesced},
    torch.nn.parallel.comm: {
        "broadcast": broadcast,
        "broadcast_coalesced": broadcast_coalesced,
        "reduce_add": reduce_add,
        "reduce_add_coalesced": reduce_add_coalesced,
    },
}
