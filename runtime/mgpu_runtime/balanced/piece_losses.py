"""Loss pieces that remember what they averaged over, so the pieces combine into the unsplit batch's loss.

A mean loss weighs by what it averaged over: a replica's token-mean cross-entropy over 40 tokens counts
for more than another's over 10, whatever their rows. While a replica runs (the model's forward, or the
criterion beside its piece of the output), each call of a torch loss function that ``mgpu_runtime.losses``
knows, with a mean or sum reduction, returns its usual value marked with its numerator and denominator.
When the replicas' scalars are combined (``outputs.py``) and every one is so marked, the result is the sum
of numerators over the sum of denominators (or the sum of sums): exactly the unsplit batch's loss. A scalar
the script computed further (``loss + 0.1 * penalty``) is unmarked and falls back to the mean weighted by
rows, which is exact for per-row means only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from mgpu_runtime.losses import WATCHED, LossParts, loss_parts

_PARTS = "_mgpu_loss_parts"


class _MarkedLosses(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        parts = loss_parts(func, args, kwargs) if func in WATCHED else None
        if parts is None:
            return func(*args, **kwargs)
        value = parts.numerator if parts.denominator is None else parts.numerator / parts.denominator
        setattr(value, _PARTS, parts)
        return value


def marking_losses(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, running with its loss calls marked (in whichever thread calls it)."""

    def marked(*args: Any, **kwargs: Any) -> Any:
        with _MarkedLosses():
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
