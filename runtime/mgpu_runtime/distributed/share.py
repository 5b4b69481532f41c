"""This process's share of the global batch being trained on: what makes gradients exact with uneven splits.

The loader twin (``data.py``) publishes, with every batch it yields, how many of the global batch's rows
this rank holds; the gradient reduction (``ddp.py``) and ``DistributedCriterion`` (``losses.py``) read it.
A rank's local loss is a mean over its own rows, so its gradient counts in the global one with the weight
``rows / total``: equal weights (DDP's plain average) would over-count the ranks of a short last batch.

Rows are assigned as ``torch.tensor_split`` assigns them: contiguous spans in the original order, sizes
differing by at most one, the larger spans first; a batch smaller than the world leaves the last ranks
empty (weight 0), never padded with repeated samples.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Share:
    """``rows`` of the global batch's ``total`` rows belong to this rank."""

    rows: int
    total: int


_current: Share | None = None


def share_spans(total: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of ``parts`` ranks' rows of a ``total``-row batch, as ``tensor_split`` cuts it."""
    base, extra = divmod(total, parts)
    stops = [(index + 1) * base + min(index + 1, extra) for index in range(parts)]
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
