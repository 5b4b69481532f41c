"""``DistributedCriterion``: a loss whose value is the global batch's and whose gradient is the original's.

The original computed one loss over the global batch of ``B`` rows. Each rank here sees its span of
``b_r`` rows, and the DDP hook (``ddp.py``) sums the ranks' gradients weighted by ``w_r = b_r / B``. The
wrapped criterion splits the loss into a numerator and a denominator summed over ranks, all-reduces both
once (a two-number collective), and returns

    value     = (sum of numerators) / (sum of denominators)        the global loss, for logging parity
    gradient  = of numerator_r / (sum of denominators * w_r)        so that the weighted sum is the original's

How a criterion splits (the same rules as the balanced ``DataParallelCriterion``):

* ``CrossEntropyLoss`` / ``NLLLoss`` with ``reduction='mean'`` and class-index targets: the summed loss over
  the total weight of the targets (the count of non-ignored targets without ``weight``). Exact with
  ``weight``, ``ignore_index`` and ``label_smoothing``, and with ranks whose targets are all ignored.
* ``reduction='sum'``: numerators only, summed (not divided by the world size).
* ``reduction='none'``: returned as the criterion computes it; the script reduces it, and a mean over the
  rank's rows is then exact through the hook's weighting.
* Anything else (other ``'mean'`` losses, ``KLDivLoss(reduction='batchmean')``, ``CTCLoss``, any callable)
  is taken to be a mean over the rank's rows: numerator ``loss * b_r``, denominator ``b_r``. Exact for
  losses averaged over samples, or over elements when every row has as many (MSE, L1, BCE, soft-target
  cross-entropy ...).

``b_r`` and ``B`` come from the distributed loader's current batch; without one every rank counts
equally. A rank with no rows contributes zero to both sums and a zero gradient. In a world of one the
wrapper is the criterion itself.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from mgpu_runtime.distributed.process_group import setup, world_size
from mgpu_runtime.distributed.share import current_share, gradient_weight
from mgpu_runtime.losses import class_index_sum_and_weight, is_class_index_mean

class DistributedCriterion(nn.Module):
    """Wraps a criterion (module or function) at construction: ``criterion = DistributedCriterion(criterion)``."""

    def __init__(self, criterion: Callable[..., Any]) -> None:
        super().__init__()
        setup()
        self.criterion = criterion

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if world_size() == 1 or getattr(self.criterion, "reduction", None) == "none":
            return self.criterion(*args, **kwargs)
        numerator, denominator = self._numerator_and_denominator(args, kwargs)
        # At least float32: a half-precision sum of token counts overflows at 65504.
        dtype = torch.promote_types(numerator.dtype, torch.float32)
        totals = torch.stack([numerator.detach().to(dtype), denominator.to(dtype)])
        dist.all_reduce(totals)
        total_numerator, total_denominator = totals.unbind()
        weight = gradient_weight(world_size())
        if weight == 0.0:
            # No rows here: a zero that still reaches the parameters, so DDP's backward runs on every rank.
            contribution = torch.nan_to_num(numerator) * 0.0
        else:
            contribution = numerator / (total_denominator * weight)
        value = total_numerator / total_denominator
        # Exactly the global value on every rank (x - x is exactly 0), with the contribution's gradient.
        return value + (contribution - contribution.detach())

    def _numerator_and_denominator(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if is_class_index_mean(self.criterion, args, kwargs):
            return class_index_sum_and_weight(self.criterion, *args)
        loss = self.criterion(*args, **kwargs)
        if getattr(self.criterion, "reduction", None) == "sum":
            # Each rank's sum counts once; only rank 0's "1" makes the summed denominators 1.
            return loss, torch.tensor(float(dist.get_rank() == 0), device=loss.device)
        share = current_share()
        rows = share.rows if share is not None else 1
        numerator = loss * rows if rows else torch.nan_to_num(loss) * 0.0
        return numerator, torch.tensor(float(rows), device=loss.device)
