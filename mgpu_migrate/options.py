"""Choices a user makes about a migration beyond its target (``--sync-bn`` ...), passed to every rule."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    sync_bn: bool = False
    """Convert BatchNorm layers to SyncBatchNorm (``--to ddp``): statistics over the whole global batch."""


DEFAULT_OPTIONS = Options()
