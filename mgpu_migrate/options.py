"""What a user chooses about a migration: its target, and the options beyond it (``--sync-bn`` ...), passed to
every rule. Cheap to import (the command line reads the target names before any parser loads)."""

from __future__ import annotations

from dataclasses import dataclass

BALANCED, DDP = "balanced", "ddp"
TARGETS = (BALANCED, DDP)
# How ``--to ddp`` writes the distributed program: through the bundled runtime, or in plain PyTorch.
RUNTIME_STYLE, TORCH_STYLE = "runtime", "torch"
STYLES = (RUNTIME_STYLE, TORCH_STYLE)


@dataclass(frozen=True)
class Options:
    sync_bn: bool = False
    """Convert BatchNorm layers to SyncBatchNorm (``--to ddp``): statistics over the whole global batch."""
    style: str = RUNTIME_STYLE
    """``--style`` (``--to ddp``): ``torch`` writes the textbook scaffold with no runtime import."""


DEFAULT_OPTIONS = Options()
