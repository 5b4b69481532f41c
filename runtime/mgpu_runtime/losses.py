"""Facts about torch's loss functions that both families need to combine a loss split over pieces of a batch.

A mean loss weighs by what it averaged over. Every ``reduction='mean'`` loss of ``torch.nn.functional`` is a
numerator (the summed loss) over a denominator: the total weight of the non-ignored targets for
cross-entropy and NLL with class-index targets (their count without ``weight``), the rows for soft-target
cross-entropy and ``kl_div(reduction='batchmean')``, the elements of the broadcast input and target for the
element-wise losses (MSE, L1, BCE ...). Split so per piece, pieces recombine exactly (sum of numerators over
sum of denominators), whatever the pieces hold: padding, ignored tokens, masked selections. A piece whose
targets are all ignored adds 0 to both sums (0 over 0 is never formed). ``reduction='sum'`` has no
denominator: the pieces' sums add up.

A full reduction of a tensor whose rows are the batch's (``torch.sum(torch.abs(code))``, ``per_row.mean()``,
a penalty of a loss function of the script's own) is the same kind of loss: a sum, or a mean over its
elements. ``reduction_parts`` splits it so, for tensors that require grad and hold exactly the piece's rows;
anything else (a count, a metric, a sum over the weights) is not a loss and is left alone.

``loss_parts`` answers for a call of one of those functions (what a ``TorchFunctionMode`` sees, including
the calls that loss modules such as ``nn.CrossEntropyLoss`` make); ``None`` for anything else (other
reductions, the deprecated ``size_average``/``reduce`` arguments, a function it does not know).
"""

from __future__ import annotations

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
_SIGNATURES = {function: inspect.signature(function) for function in WATCHED}
_FULL_SUMS = frozenset({torch.sum, torch.Tensor.sum})
FULL_REDUCTIONS: frozenset[Callable[..., Any]] = _FULL_SUMS | {torch.mean, torch.Tensor.mean}
# reduction='batchmean' is kl_div's mean over rows; every other mean is over what the loss counts.
_MEANS = ("mean", "batchmean")


@dataclass(frozen=True)
class LossParts:
    """A loss as ``numerator / denominator``; ``denominator`` is None for a sum."""

    numerator: torch.Tensor
    denominator: torch.Tensor | None


def loss_parts(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> LossParts | None:
    """The numerator and denominator of a call of a watched loss function with a mean or sum reduction."""
    if function not in WATCHED:
        return None
    try:
        bound = _SIGNATURES[function].bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    arguments = bound.arguments
    reduction = arguments.get("reduction")
    if arguments.get("size_average") is not None or arguments.get("reduce") is not None:
        return None
    if reduction == "sum":
        return LossParts(function(*args, **kwargs), None)
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


def reduction_parts(
    function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], rows: int
) -> LossParts | None:
    """The parts of a full ``sum``/``mean`` (no ``dim``) of a tensor that requires grad and has ``rows`` rows."""
    if function not in FULL_REDUCTIONS or len(args) != 1 or set(kwargs) - {"dtype"}:
        return None
    tensor = args[0]
    if not (
        isinstance(tensor, torch.Tensor)
        and tensor.requires_grad
        and tensor.is_floating_point()
        and tensor.dim() > 0
        and tensor.shape[0] == rows
    ):
        return None
    summed = torch.sum(tensor, **kwargs)
    if function in _FULL_SUMS:
        return LossParts(summed, None)
    return LossParts(summed, torch.tensor(tensor.numel(), dtype=summed.dtype, device=summed.device))
