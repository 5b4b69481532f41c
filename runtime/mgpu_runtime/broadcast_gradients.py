"""The gradients ``nn.DataParallel``'s broadcast of the parameters gives those a forward leaves out.

DataParallel copies the module's parameters to its devices in one autograd Function (``Broadcast``). Once a
backward pass reaches any of the copies, that Function's backward runs for all of them, and a parameter that no
replica used (a decoder skipped by ``forward(x, only_encode=True)``) gets a zero gradient, which weight decay and
momentum then move. The balanced replicas place each parameter on its own and torch's DDP reducer leaves such a
parameter's gradient ``None``, so both targets give the zeros by hand, with this.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def zeros_once_reached(watched: Sequence[torch.Tensor], parameters: Sequence[torch.Tensor]) -> Any:
    """When a backward pass reaches any of ``watched`` (the replicas' copies, or the parameters themselves), the
    end of that pass gives each of ``parameters`` still without a gradient zeros. Returns the hook's handle; the
    hook removes itself when it runs, and a caller whose forward may see no backward pass removes it first."""
    handle: Any = None

    def fill() -> None:
        for parameter in parameters:
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)

    def reached(_gradients: Any) -> None:
        handle.remove()
        torch.autograd.Variable._execution_engine.queue_callback(fill)

    handle = torch.autograd.graph.register_multi_grad_hook(watched, reached, mode="any")
    return handle
