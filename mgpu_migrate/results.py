"""What migrating one file gives: the new text and the diagnostics (``MigrationResult``: the engine's output, the
file engine's input), what the file engine reports of each file (``FileOutcome``: what the formats print), and the
change as a unified diff."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from mgpu_migrate.diagnostics import Diagnostic, source_lines


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


UNCHANGED, CHANGED, FAILED = "unchanged", "changed", "failed"


@dataclass
class FileOutcome:
    path: str
    status: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    diff: str = ""


def unified_diff(before: str, after: str, path: str) -> str:
    """The change as a unified diff that ``git apply`` takes; ``path`` as review tools show it
    (``output.display_path``: `git apply` rejects a/./x.py)."""
    lines = []
    old, new = (path, path) if path.startswith("/") else (f"a/{path}", f"b/{path}")
    for line in difflib.unified_diff(source_lines(before), source_lines(after), _git_quoted(old), _git_quoted(new)):
        lines.append(line)
        if not line.endswith(("\n", "\r")):
            lines.append("\n\\ No newline at end of file\n")
    return "".join(lines)


_GIT_ESCAPES = {"\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}


def _git_quoted(name: str) -> str:
    """A file name in a diff header as git writes it: in double quotes with C escapes when it holds a control
    character, a quote or a backslash (a newline would end the header line), else as it is."""
    escaped = "".join(map(_git_escaped, name))
    return name if escaped == name else f'"{escaped}"'


def _git_escaped(character: str) -> str:
    if character in _GIT_ESCAPES:
        return _GIT_ESCAPES[character]
    return f"\\{ord(character):03o}" if ord(character) < 0x20 or ord(character) == 0x7F else character
