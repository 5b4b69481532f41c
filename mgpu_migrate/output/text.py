"""``--output-format text`` (or ``concise``): ``path:line:col: CODE message`` on stderr (design §1), coloured on
a terminal; ``full`` adds the line of code under each, a caret at the column, and where the code is explained.
"""

from __future__ import annotations

import functools
import os

import click

from mgpu_migrate.diagnostics import LINE_BREAK

from mgpu_migrate.output import ERROR, REVIEW, Run, display_path, kind_of
from mgpu_migrate.results import CHANGED

_COLOURS = {REVIEW: "yellow", ERROR: "red"}


@functools.lru_cache(maxsize=64)
def _lines(path: str) -> list[str]:
    """A file's lines as they are now on disk (after an in-place rewrite, the new ones); none if unreadable."""
    from mgpu_migrate import files

    try:
        return LINE_BREAK.split(files.source_file(path, files.read(path)[0]).text)
    except (OSError, SyntaxError, UnicodeDecodeError, LookupError):
        return []


def _frame(path: str, line: int, col: int) -> str:
    if path.startswith("<") or path.endswith(".ipynb") or ":cell " in path or not os.path.isfile(path):
        return ""
    lines = _lines(path)
    if not 1 <= line <= len(lines):
        return ""
    gutter = f"{line:>5} | "
    text = lines[line - 1].expandtabs(1)
    return f"{gutter}{text}\n{' ' * (len(gutter) - 2)}| {' ' * (col - 1)}{click.style('^', fg='cyan', bold=True)}\n"


def render(run: Run, quiet: bool, full: bool = False) -> str:
    """The diagnostics, styled; ``click.echo`` drops the styles where stderr is not a terminal."""
    lines = []
    for diagnostic in run.diagnostics:
        kind = kind_of(diagnostic)
        if quiet and kind not in _COLOURS:
            continue
        place = click.style(f"{display_path(diagnostic.path)}:{diagnostic.line}:{diagnostic.col}:", bold=True)
        code = click.style(diagnostic.code, fg=_COLOURS.get(kind, "green"), bold=True)
        lines.append(f"{place} {code} {diagnostic.message}\n")
        if full:
            lines.append(_frame(diagnostic.path, diagnostic.line, diagnostic.col))
            lines.append(f"      = help: mgpu-migrate --explain {diagnostic.code}\n\n")
    return "".join(lines)


def changed_files(run: Run) -> str:
    """With the rewrites not listed (``--check``'s default): one line for each file that would change."""
    return "".join(
        f"{click.style(display_path(outcome.path), bold=True)}: would be migrated "
        "(--show-rewrites lists the rewrites)\n"
        for outcome in run.outcomes
        if outcome.status == CHANGED
    )


_DIFF_STYLES = (("+++", {"bold": True}), ("---", {"bold": True}), ("@@", {"fg": "cyan"}), ("+", {"fg": "green"}), ("-", {"fg": "red"}))


def coloured_diff(diff: str) -> str:
    """A unified diff with git's colours (``click.echo`` drops them where colour is off)."""
    lines = []
    for line in diff.splitlines(keepends=True):
        style = next((style for start, style in _DIFF_STYLES if line.startswith(start)), None)
        body = line.rstrip("\r\n")
        lines.append(click.style(body, **style) + line[len(body):] if style and body else line)
    return "".join(lines)
