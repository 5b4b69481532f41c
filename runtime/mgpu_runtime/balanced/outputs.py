"""``gather``: the gathered value of a balanced model's output, for code that insists on a plain tensor."""

from __future__ import annotations

from typing import Any

from mgpu_runtime.sharded import materialize


def gather(value: Any) -> Any:
    """``value`` with every output held on the replicas (also inside lists, tuples and dicts) gathered on the
    output device, differentiably; a plain value as it is."""
    return materialize(value)
