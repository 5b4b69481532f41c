"""The engine: source text in, new text and diagnostics out. No files, no command line.

This module stays cheap to import: the parser and the rules load only when a source could hold a
migration site (see ``might_need_migration``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mgpu_migrate.diagnostics import INTERNAL_ERROR, Diagnostic, error_summary
from mgpu_migrate.options import DEFAULT_OPTIONS, Options

TARGETS = ("balanced", "ddp")

# Every migration site spells one of these as the start of a name somewhere in the file: torch's
# `DataParallel`, PyTorch-Encoding's `DataParallelModel`/`DataParallelCriterion`, the functional
# `data_parallel`, torch's `parallel_apply` (DataParallel written by hand), and `apex` (whose DDP is a
# site for its import); a file that already calls `mgpu_runtime` is read again, so a partly migrated file
# is finished. Names that merely end in them, `DistributedDataParallel`, `FullyShardedDataParallel`,
# `fully_sharded_data_parallel`, are not sites.
_SITE_HINT = re.compile(rb"\b(?:DataParallel|data_parallel|parallel_apply\b|apex\b|mgpu_runtime\b)")
# Plain substring searches are ~10x faster than the alternation, and rule out almost every file first.
_SITE_WORDS = (b"DataParallel", b"data_parallel", b"parallel_apply", b"apex", b"mgpu_runtime")


def might_need_migration(source: bytes | str) -> bool:
    """Cheap test: False means the file certainly has nothing to migrate."""
    data = source.encode("utf-8", "surrogateescape") if isinstance(source, str) else source
    return any(word in data for word in _SITE_WORDS) and _SITE_HINT.search(data) is not None


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


def migrate_source(
    source: str, target: str, path: str = "<string>", options: Options = DEFAULT_OPTIONS
) -> MigrationResult:
    """Migrate one file's text to ``target`` ('balanced' or 'ddp')."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    if not might_need_migration(source):
        return MigrationResult(path, source, source)
    from mgpu_migrate.pipeline import run_pipeline

    try:
        return run_pipeline(source, target, path, options)
    except Exception as error:  # noqa: BLE001 -- the last guard: one odd file must never stop a run
        message = f"internal error ({error_summary(error)}); file left unchanged, please report"
        return MigrationResult(path, source, source, error=Diagnostic(path, 1, 1, INTERNAL_ERROR, message))
