"""The engine: source text in, new text and diagnostics out. No files, no command line.

This module stays cheap to import: the parser and the rules load only when a source could hold a
migration site (see ``might_need_migration``).
"""

from __future__ import annotations

import re

from mgpu_migrate.diagnostics import INTERNAL_ERROR, Diagnostic, shorten
from mgpu_migrate.options import DEFAULT_OPTIONS, TARGETS, Options
from mgpu_migrate.results import MigrationResult

__all__ = ["TARGETS", "MigrationResult", "might_need_migration", "migrate_source"]

# Every migration site spells one of these somewhere in the file: torch's `DataParallel` (also as the base of
# a subclass), PyTorch-Encoding's `DataParallelModel`/`DataParallelCriterion`, the functional
# `data_parallel` itself (not `data_parallel_size`), and apex's parallel package (`apex.parallel`,
# `from apex import parallel`, or apex under another name), whose DistributedDataParallel is a site; a file
# that already calls `mgpu_runtime` is read again, so a partly migrated file is finished. Names that merely
# end or start with them (`DistributedDataParallel`, `get_data_parallel_group`, `DataParallelConfig`) and apex's
# other packages (`from apex.normalization import FusedLayerNorm`, `from apex import amp`) are not sites.
_SITE_HINT = re.compile(
    rb"\b(?:DataParallel(?:Model|Criterion)?|data_parallel|mgpu_runtime)\b"
    rb"|\bapex\s*\.\s*parallel\b"
    rb"|\bfrom\s+apex\s+import\s*(?:\([^)]*|(?:[^\n;]|\\\r?\n)*)\bparallel\b"
    rb"|\bimport\s+apex\s+as\b"
)
# Plain substring searches are ~10x faster than the alternation, and rule out almost every file first.
_SITE_WORDS = (b"DataParallel", b"data_parallel", b"apex", b"mgpu_runtime")


def might_need_migration(source: bytes | str) -> bool:
    """Cheap test: False means the file certainly has nothing to migrate."""
    data = source.encode("utf-8", "surrogateescape") if isinstance(source, str) else source
    return any(word in data for word in _SITE_WORDS) and _SITE_HINT.search(data) is not None


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
        message = f"internal error ({type(error).__name__}: {shorten(str(error), 60)}); file left unchanged, please report"
        return MigrationResult(path, source, source, error=Diagnostic(path, 1, 1, INTERNAL_ERROR, message))
