"""What a run says, in the forms review tools read: text, JSON, GitHub annotations, SARIF, a markdown report.

Every format is written from the same ``Run``: the per-file outcomes (status, diagnostics, the diff) and how
the tool was asked to run. The formats never import the engine or the rules, except ``code_help``, which
reads the code registry for the help text SARIF carries.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mgpu_migrate.diagnostics import Diagnostic
from mgpu_migrate.gitignore import work_tree

if TYPE_CHECKING:
    from mgpu_migrate.results import FileOutcome

FORMATS = ("text", "concise", "full", "json", "github", "sarif")
TEXT_FORMATS = ("text", "concise", "full")
# The formats that are one document on stdout (so stdout cannot also carry code or a diff).
DOCUMENT_FORMATS = ("json", "sarif")

REWRITE, REVIEW, ERROR = "rewrite", "review", "error"


def kind_of(diagnostic: Diagnostic) -> str:
    if diagnostic.is_rewrite:
        return REWRITE
    return REVIEW if diagnostic.needs_review else ERROR


def display_path(path: str) -> str:
    """A path as review tools expect it: relative ones without a leading ``./`` (``git apply`` and GitHub
    annotations want ``x.py``, not ``./x.py``), absolute ones as they are."""
    return path if os.path.isabs(path) or path.startswith("<") else os.path.normpath(path)


def diff_path(path: str) -> str:
    """The path a diff names, so that ``git apply`` takes it: relative to the current directory without
    ``./`` (``a/./x.py`` is refused); a file outside it, in a git work tree, relative to the tree's top, as
    ``git diff`` names it (``a/../x.py`` is refused: apply such a diff from the top); else absolute."""
    shown = display_path(path)
    if shown.startswith("<") or not shown.startswith(os.pardir + os.sep) and not os.path.isabs(shown):
        return shown
    absolute = os.path.abspath(path)
    top = work_tree(os.path.dirname(absolute))
    return os.path.relpath(absolute, top).replace(os.sep, "/") if top else absolute


def split_cell(path: str) -> tuple[str, int | None]:
    """A notebook diagnostic's path (``nb.ipynb:cell 3``) as the file and the cell; others have no cell."""
    match = re.fullmatch(r"(.*\.ipynb):cell (\d+)", path)
    return (match[1], int(match[2])) if match else (path, None)


@dataclass(frozen=True)
class Run:
    target: str
    mode: str
    """``write`` (files rewritten in place), ``check``, ``diff`` or ``stdin``."""
    outcomes: list[FileOutcome]

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return sorted(d for outcome in self.outcomes for d in outcome.diagnostics)

    @property
    def applied(self) -> bool:
        return self.mode == "write"


def code_help(code: str) -> tuple[str, str]:
    """A code's one-line summary and its explanation page (``--explain CODE``), from the code registry."""
    from mgpu_migrate.codes import lookup

    info = lookup(code)
    return (info.summary, info.page) if info is not None else (code, "")


def render(output_format: str, run: Run) -> str:
    """The report in a format for stdout (``json``, ``github``, ``sarif``)."""
    from importlib import import_module

    module = {"json": "json_report", "github": "github", "sarif": "sarif"}[output_format]
    return import_module(f"mgpu_migrate.output.{module}").render(run)
