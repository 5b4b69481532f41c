"""``DistributedCriterion``: kept for scripts migrated by earlier versions of the tool; the criterion itself.

Under the runtime contract (``mgpu_runtime.sharded``) a criterion called on the wrapped model's outputs and
the distributed loader's batches computes the global batch's loss by itself: torch's loss functions are
local numerators over global denominators, and any other arithmetic follows the op rules. So the tool no
longer wraps criteria, and this wrapper only calls the one it holds (``.criterion``, as before).
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from mgpu_runtime.distributed.process_group import setup


class DistributedCriterion(nn.Module):
    """``criterion = DistributedCriterion(criterion)``: the criterion, unchanged."""

    def __init__(self, criterion: Callable[..., Any]) -> None:
        super().__init__()
        setup()
        self.criterion = criterion

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.criterion(*args, **kwargs)
