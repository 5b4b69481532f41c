"""This process's share of the global batch being trained on: what makes gradients exact with uneven splits.

The loader twin (``data.py``) publishes, with every batch it yields, how many of the global batch's rows
this rank holds; the gradient reduction (``ddp.py``) and ``DistributedCriterion`` (``losses.py``) read it.
A rank's local loss is a mean over its own rows, so its gradient counts in the global one with the weight
``rows / total``: equal weights (DDP's plain average) would over-count the ranks of a short last batch.

Rows are assigned as ``torch.chunk`` (DataParallel's scatter) assigns them: contiguous spans in the
original order, of ``ceil(B / W)`` rows but the last (``structure.chunk_sizes``), so every rank holds the
rows the DataParallel original's GPU of that index held (the same BatchNorm statistics, no 1-row span
where DataParallel had none); the ranks past the last chunk are empty (weight 0), never padded with
repeated samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from mgpu_runtime.structure import chunk_sizes


@dataclass(frozen=True)
class Share:
    """``rows`` of the global batch's ``total`` rows, from row ``start`` on, belong to this rank."""

    rows: int
    total: int
    start: int = 0


_current: Share | None = None


def share_spans(total: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of ``parts`` ranks' rows of a ``total``-row batch, as ``torch.chunk`` cuts it."""
    sizes = chunk_sizes(total, parts)
    stops = list(accumulate(sizes + [0] * (parts - len(sizes))))
    return list(zip([0, *stops[:-1]], stops))


def publish(share: Share | None) -> None:
    """Record the share of the batch now handed to the training loop (None: no distributed batch)."""
    global _current
    _current = share


def current_share() -> Share | None:
    """The share of the batch last handed out, or None outside a distributed loader's iteration."""
    return _current


def gradient_weight(world_size: int) -> float:
    """How much this rank's mean-loss gradient counts in the global one: its share, or 1/W without one."""
    if _current is None:
        return 1.0 / world_size
    return _current.rows / _current.total if _current.total else 0.0
