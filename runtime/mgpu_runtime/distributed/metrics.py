"""``reduce_sum`` and ``reduce_mean``: metrics over the whole job, each sample counted once.

The distributed loader never pads or repeats samples (an uneven batch leaves some ranks fewer rows, or
none), so summing what each rank counted is the global count: ``correct = reduce_sum(correct)``. Numbers
come back as Python numbers, tensors as tensors on their own device; the inputs are left unchanged. In a
world of one both return their input.
"""

from __future__ import annotations

from typing import TypeVar, Union

import torch
import torch.distributed as dist

from mgpu_runtime.distributed.process_group import device, setup, world_size

Value = TypeVar("Value", int, float, torch.Tensor)
Count = Union[int, float, torch.Tensor]


def reduce_sum(value: Value) -> Value:
    """The sum of ``value`` over all processes."""
    setup()
    if world_size() == 1:
        return value
    if isinstance(value, torch.Tensor):
        summed = value.detach().clone().to(_collective_device(value.device))
        dist.all_reduce(summed)
        return summed.to(value.device)
    summed = torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else torch.int64)
    summed = summed.to(_collective_device(summed.device))
    dist.all_reduce(summed)
    return summed.item()


def reduce_mean(value: Value, count: Count | None = None) -> Value:
    """The mean over all processes of each one's ``value``.

    Without ``count`` every process weighs the same. With it, ``value`` is a mean over ``count`` items
    (the rank's rows, tokens ...) and the result is the mean over all items: ``sum(value * count) /
    sum(count)``; a rank with ``count == 0`` counts nothing, even when its ``value`` is the NaN of an empty
    mean.
    """
    if count is None:
        return reduce_sum(value) / world_size()
    if isinstance(value, torch.Tensor):
        counts = torch.as_tensor(count, device=value.device)
        weighted = torch.where(counts > 0, value * counts, torch.zeros((), dtype=value.dtype, device=value.device))
    else:
        weighted = value * count if count > 0 else 0.0
    return reduce_sum(weighted) / reduce_sum(count)


def _collective_device(current: torch.device) -> torch.device:
    # nccl reduces only CUDA tensors; gloo takes tensors where they are.
    return device() if dist.get_backend() == "nccl" else current
