"""Facts about criteria that both families need to combine a loss split over pieces of a batch exactly.

Cross-entropy and NLL with ``reduction='mean'`` and class-index targets are a weighted mean: the summed
loss over the total weight of the targets (the count of non-ignored targets without ``weight``). Split
into that numerator and denominator per piece, they recombine exactly with ``weight``, ``ignore_index``
and ``label_smoothing``, also when a piece's targets are all ignored (0 over 0 is never formed).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_CLASS_INDEX_LOSSES = {nn.CrossEntropyLoss.forward: F.cross_entropy, nn.NLLLoss.forward: F.nll_loss}


def is_class_index_mean(criterion: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """CE/NLL's own forward (not a subclass override), ``reduction='mean'``, an (input, class-index target) call."""
    return (
        getattr(type(criterion), "forward", None) in _CLASS_INDEX_LOSSES
        and criterion.reduction == "mean"
        and len(args) == 2
        and not kwargs
        and isinstance(args[1], torch.Tensor)
        and not args[1].is_floating_point()
    )


def class_index_sum_and_weight(
    criterion: nn.Module, output: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed loss and the total weight of the targets: the mean's numerator and denominator."""
    options = {"weight": criterion.weight, "ignore_index": criterion.ignore_index, "reduction": "sum"}
    if isinstance(criterion, nn.CrossEntropyLoss):
        options["label_smoothing"] = criterion.label_smoothing
    summed = _CLASS_INDEX_LOSSES[type(criterion).forward](output, target, **options)
    kept = target != criterion.ignore_index
    if criterion.weight is None:
        weight = kept.sum()
    else:
        weight = (criterion.weight[torch.where(kept, target, 0)] * kept).sum()
    return summed, weight.to(summed.dtype)
