"""What migrating one file gives: the new text and the diagnostics (``MigrationResult``: the engine's output, the
file engine's input), and what the file engine reports of each file (``FileOutcome``: what the formats print)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mgpu_migrate.diagnostics import Diagnostic


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
