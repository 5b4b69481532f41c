"""Spans of a global batch, taking a span of rows out of a collated batch, and the global batch a rank holds.

Rows are assigned as ``torch.chunk`` (DataParallel's scatter) assigns them: contiguous spans in the original
order, of ``ceil(B / W)`` rows but the last (``structure.chunk_sizes``), so every rank holds the rows the
DataParallel original's GPU of that index held (the same BatchNorm statistics, no 1-row span where
DataParallel had none); the ranks past the last chunk hold none, never repeated samples.

The batch's rows are the first dimension of its first tensor that has one (what ``default_collate``
stacks). In the span's copy of the batch, every tensor with that many rows is cut; other tensors (scalars,
per-batch tables) are kept whole; lists of that many plain values, such as the file names
``default_collate`` gathers into a list, are cut too, so they stay aligned with the tensors; containers
(tuples, lists, dicts, namedtuples, dataclasses such as HF's ``ModelOutput``) are rebuilt around their cut
contents; anything else is kept whole.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any, NamedTuple

import torch

from mgpu_runtime.sharded import RankGroup, Sharded
from mgpu_runtime.structure import children, chunk_sizes, holds_tensor, rebuild, tensors


class Span(NamedTuple):
    """``rows`` of a global batch of ``total`` rows, from row ``start`` on."""

    start: int
    rows: int
    total: int

    def splits(self, parts: int) -> list[int]:
        """Every rank's rows of this batch."""
        sizes = chunk_sizes(self.total, parts)
        return sizes + [0] * (parts - len(sizes))


def spans(total: int, parts: int) -> list[Span]:
    """Each of ``parts`` ranks' span of a ``total``-row batch, as ``torch.chunk`` cuts it."""
    sizes = chunk_sizes(total, parts)
    sizes += [0] * (parts - len(sizes))
    return [Span(start, rows, total) for start, rows in zip([0, *accumulate(sizes)], sizes)]


def batch_rows(batch: Any) -> int:
    """Rows of a collated batch: the first dimension of its first tensor that has one."""
    first = next((tensor for tensor in tensors(batch) if tensor.dim() > 0), None)
    if first is None:
        raise TypeError(f"cannot split a batch without tensors among the processes: {type(batch).__name__}")
    return first.shape[0]


def take_rows(batch: Any, start: int, stop: int, rows: int, lists: bool = True) -> Any:
    """The rows ``[start, stop)`` of ``batch``, a collated batch of ``rows`` rows (its per-row lists kept whole
    unless ``lists``)."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop] if batch.dim() > 0 and batch.shape[0] == rows else batch
    parts = children(batch)
    if parts is None:
        return batch
    if _is_per_row_list(batch, parts, rows):
        return type(batch)(parts[start:stop]) if lists else batch
    return rebuild(batch, [take_rows(part, start, stop, rows, lists) for part in parts])


def global_batch(batch: Any, span: Span, group: RankGroup, whole: bool, cut: list[bool] | None = None) -> Any:
    """The global batch as this rank holds it: its tensors of the batch's rows ``Sharded`` over ``group``, the
    rest as it is (the same on every rank).

    ``whole``: ``batch`` is the whole global batch (every rank loaded it); its tensors of ``span.total`` rows
    are cut to the rank's span, and its per-row lists are already whole. Otherwise ``batch`` holds the
    rank's span: ``cut`` says which of its tensors (in ``tensors`` order) are rows of the batch (default:
    every tensor with dimensions, as ``default_collate`` stacks every field), and a per-row list that holds
    the span only is gathered from the ranks.
    """
    splits = span.splits(group.parts)
    marks = iter(cut) if cut is not None else None

    def convert(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            is_row = next(marks) if marks is not None else value.dim() > 0
            if whole:
                if value.dim() > 0 and value.shape[0] == span.total:
                    return Sharded([value[span.start : span.start + span.rows]], splits, group)
                return value
            return Sharded([value], splits, group) if is_row else value
        parts = children(value)
        if parts is None:
            return value
        if not whole and cut is None and _is_per_row_list(value, parts, span.rows):
            return type(value)(group.objects([parts]))
        return rebuild(value, [convert(part) for part in parts])

    return convert(batch)


def _is_per_row_list(batch: Any, parts: list[Any], rows: int) -> bool:
    return (
        type(batch) in (list, tuple)
        and len(parts) == rows
        and not any(children(part) is not None or holds_tensor(part) for part in parts)
    )
