"""Facts about torch's loss functions that both families need to combine a loss split over pieces of a batch.

A mean loss weighs by what it averaged over. Every ``reduction='mean'`` loss of ``torch.nn.functional`` is a
numerator (the summed loss) over a denominator: the total weight of the non-ignored targets for
cross-entropy and NLL with class-index targets (their count without ``weight``), the rows for soft-target
cross-entropy and ``kl_div(reduction='batchmean')``, the elements of the broadcast input and target for the
element-wise losses (MSE, L1, BCE ...). Split so per piece, pieces recombine exactly (sum of numerators over
sum of denominators), whatever the pieces hold: padding, ignored tokens, masked selections. A piece whose
targets are all ignored adds 0 to both sums (0 over 0 is never formed). ``reduction='sum'`` has no
denominator: the pieces' sums add up.

``loss_parts`` answers for a call of one of those functions, given its bound arguments (``bind``: every
parameter by name, defaults filled in); ``None`` for anything else (other reductions, the deprecated
``size_average``/``reduce`` arguments, a function it does not know). The op rules of ``mgpu_runtime.sharded``
use it on each piece of a global batch.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

_CLASS_INDEX = (F.cross_entropy, F.nll_loss)
_ELEMENTWISE = (
    F.mse_loss,
    F.l1_loss,
    F.smooth_l1_loss,
    F.huber_loss,
    F.binary_cross_entropy,
    F.binary_cross_entropy_with_logits,
    F.soft_margin_loss,
    F.kl_div,
)
WATCHED: frozenset[Callable[..., Any]] = frozenset((*_CLASS_INDEX, *_ELEMENTWISE))
# reduction='batchmean' is kl_div's mean over rows; every other mean is over what the loss counts.
_MEANS = ("mean", "batchmean")


@dataclass(frozen=True)
class LossParts:
    """A loss as ``numerator / denominator``; ``denominator`` is None for a sum."""

    numerator: torch.Tensor
    denominator: torch.Tensor | None


@functools.cache
def _parameters(function: Callable[..., Any]) -> tuple[tuple[str, ...], dict[str, Any]] | None:
    """``function``'s parameter names in order, and their defaults; None when it has no Python signature."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    names = tuple(signature.parameters)
    defaults = {n: p.default for n, p in signature.parameters.items() if p.default is not inspect.Parameter.empty}
    return names, defaults


def bind(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The call's arguments by name, defaults filled in (``inspect.Signature.bind`` at a tenth of its cost, for the
    plain signatures of torch's loss functions); None when they do not bind."""
    parameters = _parameters(function)
    if parameters is None:
        return None
    names, defaults = parameters
    if len(args) > len(names) or set(kwargs) - set(names):
        return None
    arguments = dict(zip(names, args))
    if any(name in arguments for name in kwargs):
        return None
    arguments.update(kwargs)
    for name in names:
        if name not in arguments:
            if name not in defaults:
                return None
            arguments[name] = defaults[name]
    return arguments


def loss_parts(function: Callable[..., Any], arguments: dict[str, Any]) -> LossParts | None:
    """The numerator and denominator of a call of a known loss function (``arguments`` as ``bind`` gives them)
    with a mean or sum reduction."""
    if function not in WATCHED:
        return None
    reduction = arguments.get("reduction")
    if arguments.get("size_average") is not None or arguments.get("reduce") is not None:
        return None
    if reduction == "sum":
        return LossParts(function(**arguments), None)
    if reduction not in _MEANS:
        return None
    summed = function(**{**arguments, "reduction": "sum"})
    return LossParts(summed, _denominator(function, arguments, reduction).to(summed.dtype))


def _denominator(function: Callable[..., Any], arguments: dict[str, Any], reduction: str) -> torch.Tensor:
    source, target = arguments["input"], arguments["target"]
    if function in _CLASS_INDEX and not target.is_floating_point():
        kept = target != arguments["ignore_index"]
        weight = arguments["weight"]
        if weight is None:
            return kept.sum()
        return (weight[torch.where(kept, target, 0)] * kept).sum()
    if function in _CLASS_INDEX:  # probabilities over the classes of dimension 1: a mean over the rest
        rows = source.numel() // source.shape[1] if source.dim() > 1 else 1
        return torch.tensor(rows, device=source.device)
    if reduction == "batchmean":
        return torch.tensor(source.shape[0] if source.dim() > 0 else 1, device=source.device)
    return torch.tensor(torch.broadcast_shapes(source.shape, target.shape).numel(), device=source.device)
