"""Loss pieces that remember what they averaged over, so the pieces combine into the unsplit batch's loss.

A mean loss weighs by what it averaged over: a replica's token-mean cross-entropy over 40 tokens counts
for more than another's over 10, whatever their rows. While a replica runs (the model's forward, or the
criterion beside its piece of the output), each call of a torch loss function that ``mgpu_runtime.losses``
knows, with a mean or sum reduction, returns its usual value marked with its numerator and denominator.
When the replicas' scalars are combined (``outputs.py``) and every one is so marked, the result is the sum
of numerators over the sum of denominators (or the sum of sums): exactly the unsplit batch's loss. A scalar
the script computed further (``loss + 0.1 * penalty``) is unmarked and falls back to the mean weighted by
rows, which is exact for per-row means only.

The replicas of a forward also share their random draws: the ``k``-th dropout or per-row draw
(``torch.randn_like(std)``) of any replica is answered from the ``k``-th one drawn for the whole batch (by whichever replica gets there first, under a
lock), of which each replica keeps its rows (``mgpu_runtime.randomness``). The masks are then the unsplit
forward's, drawn in its order, so the generator advances as the original's did and two identical runs
agree, however the replica threads interleave.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from mgpu_runtime.losses import WATCHED, LossParts, loss_parts
from mgpu_runtime.randomness import (
    DRAWS,
    PER_ROW,
    apply_mask,
    dropout_call,
    global_mask,
    per_row_draw,
)

_FACTORIES = (torch.randn, torch.rand)

_PARTS = "_mgpu_loss_parts"


class SharedDraws:
    """The dropout masks of one parallel forward, drawn for the whole batch and shared by its replicas."""

    def __init__(self, sizes: Sequence[int], device: torch.device) -> None:
        self.sizes = list(sizes)
        self.starts = [sum(self.sizes[:index]) for index in range(len(self.sizes))]
        self.device = device
        self._masks: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def slice(
        self, index: int, replica: int, draw: Callable[[], torch.Tensor], device: torch.device | None
    ) -> torch.Tensor:
        """Replica ``replica``'s rows of the forward's ``index``-th draw, made by ``draw`` if no replica has yet,
        on ``device`` (None: where it was drawn)."""
        with self._lock:
            while len(self._masks) <= index:
                self._masks.append(draw())
            drawn = self._masks[index]
        start = self.starts[replica]
        rows = drawn[start : start + self.sizes[replica]]
        return rows if device is None else rows.to(device)


class _MarkedLosses(TorchFunctionMode):
    def __init__(self, draws: SharedDraws | None, replica: int) -> None:
        super().__init__()
        self._draws = draws
        self._replica = replica
        self._draw_calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        draws = self._draws
        if draws is not None and func in DRAWS:
            call = dropout_call(args, kwargs, draws.sizes[self._replica])
            if call is not None:
                source, p, inplace = call
                self._draw_calls += 1
                total, device = sum(draws.sizes), draws.device
                mask = draws.slice(
                    self._draw_calls - 1, self._replica, lambda: global_mask(source, total, p, device), source.device
                )
                return apply_mask(source, mask, inplace)
        if draws is not None and func in PER_ROW:
            draw = per_row_draw(func, args, kwargs, draws.sizes[self._replica])
            if draw is not None:
                self._draw_calls += 1
                total = sum(draws.sizes)
                device = kwargs.get("device") if func in _FACTORIES else args[0].device
                return draws.slice(self._draw_calls - 1, self._replica, lambda: draw(total), device)
        parts = loss_parts(func, args, kwargs) if func in WATCHED else None
        if parts is None:
            return func(*args, **kwargs)
        value = parts.numerator if parts.denominator is None else parts.numerator / parts.denominator
        setattr(value, _PARTS, parts)
        return value


def marking_losses(
    function: Callable[..., Any], draws: SharedDraws | None = None, replica: int = 0
) -> Callable[..., Any]:
    """``function``, running with its loss calls marked (in whichever thread calls it), as replica ``replica``
    of ``draws``' forward when given."""

    def marked(*args: Any, **kwargs: Any) -> Any:
        with _MarkedLosses(draws, replica):
            return function(*args, **kwargs)

    return marked


def combine_marked(scalars: Sequence[torch.Tensor], device: torch.device | None) -> torch.Tensor | None:
    """The unsplit loss from per-replica marked scalars; None unless every one is marked the same way."""
    parts: list[LossParts | None] = [getattr(scalar, _PARTS, None) for scalar in scalars]
    if any(part is None for part in parts):
        return None
    numerator = torch.stack([part.numerator.to(device) for part in parts]).sum()
    if all(part.denominator is None for part in parts):
        return numerator
    if any(part.denominator is None for part in parts):
        return None
    return numerator / torch.stack([part.denominator.to(device) for part in parts]).sum()
