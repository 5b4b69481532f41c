"""Per-file processing and what the command line prints about it."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from mgpu_migrate import files
from mgpu_migrate.diagnostics import READ_ERROR, Diagnostic
from mgpu_migrate.engine import migrate_source, might_need_migration

UNCHANGED, CHANGED, FAILED = "unchanged", "changed", "failed"


@dataclass
class FileOutcome:
    path: str
    status: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    diff: str = ""


def unified_diff(before: str, after: str, path: str) -> str:
    lines = []
    old, new = (path, path) if path.startswith("/") else (f"a/{path}", f"b/{path}")
    for line in difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True), old, new):
        lines.append(line)
        if not line.endswith(("\n", "\r")):
            lines.append("\n\\ No newline at end of file\n")
    return "".join(lines)


def process_file(path: str, target: str, write: bool, want_diff: bool) -> FileOutcome:
    """Migrate one file on disk. Never raises for a bad file: it comes back as FAILED, untouched."""
    try:
        source_file = files.read(path)
        if not might_need_migration(source_file.data):
            return FileOutcome(path, UNCHANGED)
        text = source_file.text
    except (OSError, SyntaxError, UnicodeDecodeError, LookupError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        return FileOutcome(path, FAILED, [Diagnostic(path, 1, 1, READ_ERROR, f"cannot read: {reason}")])
    result = migrate_source(text, target, path)
    if result.error is not None:
        return FileOutcome(path, FAILED, [result.error, *result.diagnostics])
    if not result.changed:
        return FileOutcome(path, UNCHANGED, result.diagnostics)
    if write:
        try:
            files.write_atomically(path, result.output, source_file.encoding)
        except (OSError, UnicodeEncodeError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            return FileOutcome(path, FAILED, [Diagnostic(path, 1, 1, READ_ERROR, f"cannot write: {reason}")])
    diff = unified_diff(result.source, result.output, path) if want_diff else ""
    return FileOutcome(path, CHANGED, result.diagnostics, diff)


def summary(outcomes: list[FileOutcome], target: str, dry_run: bool) -> str:
    changed = sum(o.status == CHANGED for o in outcomes)
    unchanged = sum(o.status == UNCHANGED for o in outcomes)
    failed = sum(o.status == FAILED for o in outcomes)
    review = sum(d.needs_review for o in outcomes for d in o.diagnostics)

    def plural(count: int, word: str) -> str:
        return f"{count} {word}{'' if count == 1 else 's'}"

    verb = "would be migrated" if dry_run else "migrated"
    text = (
        f"mgpu-migrate: {plural(changed, 'file')} {verb} to {target}, {unchanged} unchanged, {failed} failed; "
        f"{plural(review, 'site')} left for a manual look"
    )
    if target == "ddp" and changed and not dry_run:
        text += (
            "\nLaunch a migrated script with `torchrun --standalone --nproc_per_node=gpu SCRIPT.py`; "
            "plain `python SCRIPT.py` also uses every visible GPU."
        )
    return text
