"""A DataParallel subclass's own ``scatter`` and ``gather``, rebased on the runtime's ``DistributedDataParallel``.

Detection projects cut the batch themselves (Yet-Another-EfficientDet's ``CustomDataParallel``: ``batch // GPUs``
images for each GPU, the rest dropped; yolact's: an allocation of images per GPU, lists of targets of several
sizes, one size drawn for the whole batch) and stack each GPU's losses in their own gather. DataParallel called
both around its replicas; here each process is one of those GPUs:

* ``scatter(inputs, kwargs, device_ids)`` runs on every process on the global batch, with the original's device
  ids (one per process), and each process keeps its part: part r for rank r, as GPU r took it. Every process
  needs the whole batch for that, so a distributed loader's ``Sharded`` batch is materialised first (the codemod
  makes such a loader give every process the whole batch instead, which costs no collective). A draw inside the
  scatter (yolact's size for the batch) draws alike everywhere: every rank's python stream is rank 0's. While it
  runs, a tensor sent to a GPU (``.to('cuda:1')``, ``.cuda(1)``) goes to this process's device if the GPU is
  this rank's, and stays where it is otherwise: the parts of the other ranks are dropped, and copying them to
  this GPU (or to a GPU another process uses) would only cost time and memory.
* ``gather(outputs, output_device)`` is given every active part's output, as DataParallel gave it its
  replicas' outputs: each tensor gathered from the processes (an all-gather whose backward keeps this rank's
  rows, ``mgpu_runtime.sharded.groups``), so that its value, and the loss the loop computes from it, is the same on
  every process and its gradient reaches each rank's own part.

A scatter that gives fewer parts than processes leaves the last processes without rows (they still run their
replica on none, as DDP needs every rank's backward); more parts than processes is an error, as it was on GPUs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from mgpu_runtime.sharded import materialize, scatter_gather
from mgpu_runtime.sharded.groups import Group
from mgpu_runtime.sharded.tensor import Sharded


def own_part(
    scatter: Callable[[tuple, dict, list[int]], tuple[Any, Any]],
    inputs: tuple,
    kwargs: dict,
    group: Group | None,
    rank: int,
    local: torch.device,
) -> tuple[tuple, dict, int]:
    """This rank's arguments as the subclass's ``scatter`` cuts the global batch, and how many parts it made (a
    world of one: ``group`` None, one GPU)."""
    processes = group.parts if group is not None else 1
    with gpus_of_this_rank(rank, local):
        scattered = scatter(materialize(inputs), materialize(kwargs), list(range(processes)))
    parts = scatter_gather.own_parts(scattered, processes, "processes")
    if rank < len(parts):
        return (*parts[rank], len(parts))
    # No part for this rank: its replica runs on no rows of the first part's tensors.
    empty = scatter_gather.walk(parts[0][0], lambda tensor: tensor[:0] if tensor.dim() else tensor)
    return empty, parts[0][1], len(parts)


def own_gather(gather: Callable[[list[Any], Any], Any], output: Any, active: int, group: Group, rank: int, local: torch.device) -> Any:
    """The subclass's ``gather`` of every active part's output (see the module doc), given output device 0."""
    gathered = scatter_gather.gather([output], active, group)
    local_leaves = scatter_gather._output_tensors(output)
    global_leaves = scatter_gather._output_tensors(gathered)
    per_part: list[list[torch.Tensor]] = [[] for _ in range(active)]
    for mine, everyone in zip(local_leaves, global_leaves, strict=True):
        full = materialize(everyone)
        splits = everyone._splits if type(everyone) is Sharded else (1,) * active
        pieces = full.split(list(splits[:active])) if full.dim() else [full] * active
        for part, piece in enumerate(pieces[:active]):
            per_part[part].append(piece.reshape(()) if mine.dim() == 0 else piece)
    outputs = [_rebuilt(output, iter(leaves), active) for leaves in per_part]
    with gpus_of_this_rank(rank, local):
        return gather(outputs, 0)


def _rebuilt(output: Any, leaves: Iterator[torch.Tensor], active: int) -> Any:
    return scatter_gather._gathered(output, lambda _: next(leaves), active)


@contextlib.contextmanager
def gpus_of_this_rank(rank: int, local: torch.device) -> Iterator[None]:
    """While the subclass's scatter or gather runs: ``Tensor.to``/``Tensor.cuda`` to GPU ``rank`` (or to the current
    GPU) go to ``local``, this process's device; to another GPU, nowhere (the tensor is returned as it is)."""
    to = torch.Tensor.to
    # Given back as they were: torch's are its C base class's, not torch.Tensor's own attributes.
    own = {name: torch.Tensor.__dict__[name] for name in ("to", "cuda") if name in torch.Tensor.__dict__}

    def moved_to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        where = kwargs.get("device", args[0] if args else None)
        place = gpu_place(where, rank, local)
        if place is _UNCHANGED:
            return to(self, *args, **kwargs)
        if place is None:
            return self
        if "device" in kwargs:
            return to(self, *args, **{**kwargs, "device": place})
        return to(self, place, *args[1:], **kwargs)

    def moved_cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **_: Any) -> torch.Tensor:
        place = gpu_place(torch.device("cuda") if device is None else device, rank, local)
        return self if place is None else to(self, local, non_blocking=non_blocking)

    torch.Tensor.to, torch.Tensor.cuda = moved_to, moved_cuda  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        for name in ("to", "cuda"):
            if name in own:
                setattr(torch.Tensor, name, own[name])
            else:
                delattr(torch.Tensor, name)


_UNCHANGED = object()


def gpu_place(where: Any, rank: int, local: torch.device) -> Any:
    """Where a move to ``where`` goes while a subclass's scatter or gather runs on rank ``rank``: ``local`` for GPU
    ``rank`` (or the current GPU, or a bare index ``rank``), None (stay) for another GPU, ``_UNCHANGED`` for what
    is not a GPU (a dtype, the CPU, another tensor)."""
    if isinstance(where, bool) or where is None:
        return _UNCHANGED
    if isinstance(where, int):
        return local if where == rank else None
    if isinstance(where, str):
        try:
            where = torch.device(where)
        except RuntimeError:
            return _UNCHANGED
    if isinstance(where, torch.device) and where.type == "cuda":
        return local if where.index is None or where.index == rank else None
    return _UNCHANGED
