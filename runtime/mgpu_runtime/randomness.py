"""Random draws the original made once for the whole batch, made once for the whole batch and sliced per piece.

Dropout in the original drew one mask for the global batch from the global generator: one Bernoulli draw per
element, in order. A piece of the batch (a DDP rank's span, a balanced replica's chunk) that drew a mask of
its own shape would get other masks and leave the generator elsewhere than the original left it, so later
draws (the next epoch's shuffle, the next layer's mask) would differ too. ``sliced_dropout`` draws the
global batch's mask exactly as ``F.dropout`` draws it and keeps the piece's rows: the masks are the
original's, and the generator advances as the original's did.

Random numbers drawn per row of the batch (``torch.randn(b_size, nz)`` for a GAN's noise, after
``b_size = real.size(0)``; ``torch.randn_like(std)`` in a VAE's reparameterisation) are the same: a draw
whose first dimension is the piece's rows is made for the global batch's rows and sliced (``per_row_draw``),
and so are integers drawn per row (``torch.randint(0, n, (x.shape[0],))``, a noise level per sample). A draw
of another shape is left as it is.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
import torch.nn.functional as F

_SIZED = frozenset({torch.randn, torch.rand})
_SHAPED_LIKE = frozenset({torch.randn_like, torch.rand_like})
PER_ROW: frozenset = _SIZED | _SHAPED_LIKE | {torch.randint}
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


def per_row_draw(
    function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], rows: int
) -> Callable[[int], torch.Tensor] | None:
    """For a ``randn``/``rand`` (``_like``) or ``randint`` call whose first dimension is the piece's ``rows``:
    the same draw for a batch of a given number of rows; None for any other call."""
    if function is torch.randint:
        return _integers_per_row(args, kwargs, rows)
    if function in _SIZED:
        size = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
        if not size or "size" in kwargs or not all(isinstance(extent, int) for extent in size) or size[0] != rows:
            return None
        return lambda total: function(total, *size[1:], **kwargs)
    if function in _SHAPED_LIKE and args and isinstance(args[0], torch.Tensor):
        like = args[0]
        if like.dim() == 0 or like.shape[0] != rows:
            return None
        return lambda total: function(like.new_empty((total, *like.shape[1:])), *args[1:], **kwargs)
    return None


def _integers_per_row(args: tuple[Any, ...], kwargs: dict[str, Any], rows: int) -> Callable[[int], torch.Tensor] | None:
    """``torch.randint([low,] high, size)`` (``size`` also by keyword) whose first dimension is ``rows``."""
    rest = dict(kwargs)
    if "size" in rest:
        bounds, size = args, rest.pop("size")
    elif args:
        bounds, size = args[:-1], args[-1]
    else:
        return None
    if "low" in rest or "high" in rest or len(bounds) not in (1, 2) or not all(isinstance(b, int) for b in bounds):
        return None
    if not isinstance(size, (tuple, list, torch.Size)) or not size or not all(isinstance(e, int) for e in size):
        return None
    if size[0] != rows:
        return None
    return lambda total: torch.randint(*bounds, (total, *size[1:]), **rest)
