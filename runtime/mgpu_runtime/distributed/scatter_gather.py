"""What rank r's replica of the model takes and gives: DataParallel's scatter of the global inputs, and its
gather, as global values.

``scatter``: the forward's arguments are global values (``Sharded`` batches of the distributed loader, or plain
tensors every rank holds alike, such as noise drawn for the batch). DataParallel cut every tensor argument
with ``torch.chunk`` over its devices, and so does this: rank r takes chunk r of each. A ``Sharded``
argument already cut that way (the loader's batches are) gives its piece without any communication; one cut
otherwise is materialised first. As in DataParallel, tuples, lists, dicts and namedtuples are walked, any
other object is every rank's, and a batch of fewer chunks than devices runs on the first ones only: the
other ranks are *idle* for this forward, and still run it on no rows, as DDP needs every rank's backward.

``gather``: the outputs become what DataParallel's gather gave the loop: tensors concatenated along the
rows (a ``Sharded`` value whose parts are the active ranks' outputs; the parts' row counts are exchanged
in one small collective), a 0-dim tensor (a loss computed in ``forward``) a vector with one element per
device that ran, ``None`` kept, containers rebuilt. One device that ran alone is the module called directly,
ungathered, as DataParallel does it then: its 0-dim outputs stay scalars. A Python number or string that
DataParallel could not gather from several devices is an error that says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from mgpu_runtime.sharded import RankGroup, Sharded, materialize
from mgpu_runtime.sharded.groups import starts
from mgpu_runtime.structure import chunk_sizes, rebuild


def _chunks(rows: int, parts: int) -> list[int]:
    """``torch.chunk``'s sizes for ``rows`` rows over ``parts`` devices, padded with empty chunks to ``parts``."""
    sizes = chunk_sizes(rows, parts)
    return sizes + [0] * (parts - len(sizes))


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def _walk(value: Any, leaf: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with ``leaf`` applied to every tensor in the containers DataParallel's scatter walks."""
    if isinstance(value, torch.Tensor):
        return leaf(value)
    if _is_namedtuple(value):
        return type(value)(*(_walk(part, leaf) for part in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_walk(part, leaf) for part in value)
    if isinstance(value, dict):
        return type(value)((key, _walk(part, leaf)) for key, part in value.items())
    return value


def _tensors(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    _walk(value, lambda tensor: found.append(tensor))
    return found


def scatter(inputs: tuple, kwargs: dict, group: RankGroup) -> tuple[tuple, dict, int]:
    """This rank's arguments for its replica, and how many devices run this forward."""
    batched = [tensor for tensor in _tensors((inputs, kwargs)) if tensor.dim() > 0]
    if batched:
        active = min(len(chunk_sizes(len(tensor), group.parts)) for tensor in batched)
    else:
        active = group.parts if inputs or kwargs else 1
    active = max(active, 1)
    rank = group.rank

    def local(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 0:
            return materialize(tensor)
        rows = len(tensor)
        splits = _chunks(rows, group.parts)
        if type(tensor) is Sharded and tensor._splits == tuple(splits):
            piece = tensor._pieces[0]
        else:
            whole = materialize(tensor)
            piece = whole.narrow(0, starts(splits)[rank], splits[rank])
        return piece if rank < active else piece.narrow(0, 0, 0)

    return _walk(inputs, local), _walk(kwargs, local), active


def gather(output: Any, active: int, group: RankGroup) -> Any:
    """The global value of the forward's ``output`` (see the module doc)."""
    rank, idle = group.rank, group.rank >= active
    batched = [tensor for tensor in _tensors(output) if tensor.dim() > 0]
    rows = [0 if idle else len(tensor) for tensor in batched]
    every = _row_counts(rows, group) if batched else []
    counts = iter(every)

    def leaf(tensor: torch.Tensor) -> Any:
        if tensor.dim() == 0:
            vector = tensor.reshape(1)
            splits = [1] * active + [0] * (group.parts - active)
            if active == 1:  # the module called on one device: its scalar as it is, the same on every rank
                return group.concatenate([vector[:1] if rank == 0 else vector[:0]], splits).reshape(())
            return Sharded([vector[:0] if idle else vector], splits, group)
        return Sharded([tensor[:0] if idle else tensor], next(counts), group)

    return _gathered(output, leaf, active, group)


def _gathered(value: Any, leaf: Callable[[torch.Tensor], Any], active: int, group: RankGroup) -> Any:
    if isinstance(value, torch.Tensor):
        return leaf(value)
    if value is None:
        return None
    if _is_namedtuple(value):
        return type(value)(*(_gathered(part, leaf, active, group) for part in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_gathered(part, leaf, active, group) for part in value)
    if isinstance(value, dict):
        return rebuild(value, [_gathered(part, leaf, active, group) for part in value.values()])
    if active == 1:
        shared = [value]
        dist.broadcast_object_list(shared, src=0, group=group._metadata)
        return shared[0]
    raise TypeError(
        f"mgpu_runtime: the model's forward returned a {type(value).__name__} ({value!r:.60}), which nn.DataParallel "
        f"cannot gather from {active} devices (its gather raises for it): the original ran only on one device. "
        "Return tensors (or None) from forward, or compute this value outside the model."
    )


def _row_counts(rows: list[int], group: RankGroup) -> list[tuple[int, ...]]:
    """For each batched output, every rank's rows: one small all-gather for all of them."""
    mine = torch.tensor(rows, dtype=torch.int64)
    everyone = [torch.empty_like(mine) for _ in range(group.parts)]
    dist.all_gather(everyone, mine, group=group._metadata)
    table = torch.stack(everyone).tolist()
    return [tuple(table[r][index] for r in range(group.parts)) for index in range(len(rows))]
