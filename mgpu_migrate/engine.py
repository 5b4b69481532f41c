"""The engine: source text in, new text and diagnostics out. No files, no command line.

This module stays cheap to import: the parser and the rules load only when a source could hold a
migration site (see ``might_need_migration``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mgpu_migrate.diagnostics import Diagnostic

TARGETS = ("balanced", "ddp")

# Every migration site spells one of these somewhere in the file. `DistributedDataParallel` alone is
# not a site (the file already uses DDP), so it is excluded; apex's DDP is a site for its `apex` import.
_SITE_HINT = re.compile(rb"(?<!Distributed)DataParallel|data_parallel|apex")


def might_need_migration(source: bytes | str) -> bool:
    """Cheap test: False means the file certainly has nothing to migrate."""
    data = source.encode("utf-8", "surrogateescape") if isinstance(source, str) else source
    return _SITE_HINT.search(data) is not None


@dataclass
class MigrationResult:
    path: str
    source: str
    output: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    # Set when the file could not be processed; the output is then the unchanged source.
    error: Diagnostic | None = None

    @property
    def changed(self) -> bool:
        return self.error is None and self.output != self.source


def migrate_source(source: str, target: str, path: str = "<string>") -> MigrationResult:
    """Migrate one file's text to ``target`` ('balanced' or 'ddp')."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    if not might_need_migration(source):
        return MigrationResult(path, source, source)
    from mgpu_migrate.pipeline import run_pipeline

    return run_pipeline(source, target, path)
