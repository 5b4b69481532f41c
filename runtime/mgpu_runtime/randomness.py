"""Random draws the original made once for the whole batch, made once for the whole batch and sliced per piece.

Dropout in the original drew one mask for the global batch from the global generator: one Bernoulli draw per
element, in order. A piece of the batch (a DDP rank's span, a balanced replica's chunk) that drew a mask of
its own shape would get other masks and leave the generator elsewhere than the original left it, so later
draws (the next epoch's shuffle, the next layer's mask) would differ too. ``sliced_dropout`` draws the
global batch's mask exactly as ``F.dropout`` draws it and keeps the piece's rows: the masks are the
original's, and the generator advances as the original's did.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F

DRAWS: frozenset = frozenset({F.dropout})
_SIGNATURE = inspect.signature(F.dropout)


def dropout_call(args: tuple[Any, ...], kwargs: dict[str, Any], rows: int) -> tuple[torch.Tensor, float, bool] | None:
    """``(input, p, inplace)`` of an ``F.dropout`` call that draws a mask for a piece of ``rows`` rows; else None."""
    try:
        bound = _SIGNATURE.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    source, p = bound.arguments["input"], bound.arguments["p"]
    if not (bound.arguments["training"] and isinstance(source, torch.Tensor) and source.dim() > 0):
        return None
    # p of 0 or 1 draws nothing (the input, or zeros), in the original as here.
    if source.shape[0] != rows or not 0.0 < p < 1.0:
        return None
    return source, p, bound.arguments["inplace"]


def global_mask(like: torch.Tensor, total: int, p: float, device: torch.device | None = None) -> torch.Tensor:
    """The scaled keep-mask ``F.dropout`` draws for a ``total``-row batch shaped like ``like`` past its rows."""
    noise = torch.empty((total, *like.shape[1:]), dtype=like.dtype, device=device or like.device)
    noise.bernoulli_(1.0 - p)
    return noise.div_(1.0 - p)


def apply_mask(source: torch.Tensor, mask: torch.Tensor, inplace: bool) -> torch.Tensor:
    return source.mul_(mask) if inplace else source * mask
