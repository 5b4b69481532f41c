"""What a user chooses about a migration: its target, and the options beyond it (``--sync-bn`` ...), passed to
every rule. Cheap to import (the command line reads the target names before any parser loads)."""

from __future__ import annotations

from dataclasses import dataclass

BALANCED, DDP = "balanced", "ddp"
TARGETS = (BALANCED, DDP)


@dataclass(frozen=True)
class Options:
    sync_bn: bool = False
    """Convert BatchNorm layers to SyncBatchNorm (``--to ddp``): statistics over the whole global batch."""


DEFAULT_OPTIONS = Options()
