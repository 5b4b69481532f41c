"""``DataParallelCriterion``: the criterion, on the balanced model's outputs as they are.

The outputs of ``DataParallelModel`` are ``Sharded`` values held on the replicas' devices
(``mgpu_runtime.sharded``): a criterion called on them computes, piece by piece on each device, exactly the
loss the gathered output would give (torch's losses as local numerators over global denominators, any other
arithmetic by the op rules), and gathers nothing large. So this wrapper, the PyTorch-Encoding pair's
other half, only calls the criterion it holds (``.module``). Targets on another device are fine: each piece
meets its rows on its own device.
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn


class DataParallelCriterion(nn.Module):
    """``criterion = DataParallelCriterion(criterion)``: the criterion, taking ``DataParallelModel`` outputs."""

    def __init__(self, criterion: Callable[..., Any]) -> None:
        super().__init__()
        self.module = criterion

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)
