"""``--output-format text``: ``path:line:col: CODE message`` on stderr (design §1), coloured on a terminal."""

from __future__ import annotations

import click

from mgpu_migrate.output import ERROR, REVIEW, Run, kind_of

_COLOURS = {REVIEW: "yellow", ERROR: "red"}


def render(run: Run, quiet: bool) -> str:
    """The diagnostics, styled; ``click.echo`` drops the styles where stderr is not a terminal."""
    lines = []
    for diagnostic in run.diagnostics:
        kind = kind_of(diagnostic)
        if quiet and kind not in _COLOURS:
            continue
        place = click.style(f"{diagnostic.path}:{diagnostic.line}:{diagnostic.col}:", bold=True)
        code = click.style(diagnostic.code, fg=_COLOURS.get(kind, "green"), bold=True)
        lines.append(f"{place} {code} {diagnostic.message}\n")
    return "".join(lines)
