"""Taking a span of rows out of a collated batch, whatever containers hold it.

The batch's rows are the first dimension of its first tensor that has one (what ``default_collate``
stacks). In the span's copy of the batch, every tensor with that many rows is cut; other tensors (scalars,
per-batch tables) are kept whole; lists of that many plain values, such as the file names
``default_collate`` gathers into a list, are cut too, so they stay aligned with the tensors; containers
(tuples, lists, dicts, namedtuples, dataclasses such as HF's ``ModelOutput``) are rebuilt around their cut
contents; anything else is kept whole.
"""

from __future__ import annotations

from typing import Any

import torch

from mgpu_runtime.structure import children, holds_tensor, rebuild, tensors


def batch_rows(batch: Any) -> int:
    """Rows of a collated batch: the first dimension of its first tensor that has one."""
    first = next((tensor for tensor in tensors(batch) if tensor.dim() > 0), None)
    if first is None:
        raise TypeError(f"cannot split a batch without tensors among the processes: {type(batch).__name__}")
    return first.shape[0]


def take_rows(batch: Any, start: int, stop: int, rows: int) -> Any:
    """The rows ``[start, stop)`` of ``batch``, a collated batch of ``rows`` rows."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop] if batch.dim() > 0 and batch.shape[0] == rows else batch
    parts = children(batch)
    if parts is None:
        return batch
    if _is_per_row_list(batch, parts, rows):
        return type(batch)(parts[start:stop])
    return rebuild(batch, [take_rows(part, start, stop, rows) for part in parts])


def _is_per_row_list(batch: Any, parts: list[Any], rows: int) -> bool:
    return (
        type(batch) in (list, tuple)
        and len(parts) == rows
        and not any(children(part) is not None or holds_tensor(part) for part in parts)
    )
