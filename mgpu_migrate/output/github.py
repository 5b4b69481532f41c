"""``--output-format github``: GitHub Actions workflow commands, which annotate a pull request's diff.

Sites left for a person are warnings, files that could not be processed errors, rewrites notices.
"""

from __future__ import annotations

from mgpu_migrate.output import ERROR, REVIEW, Run, display_path, kind_of, split_cell

_LEVELS = {REVIEW: "warning", ERROR: "error"}


def _escape_data(text: str) -> str:
    # The runner decodes these three in a command's message.
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    # ... and in a property value, also the separators of the property list.
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render(run: Run) -> str:
    lines = []
    for diagnostic in run.diagnostics:
        level = _LEVELS.get(kind_of(diagnostic), "notice")
        path, cell = split_cell(diagnostic.path)
        properties = {"file": display_path(path), "line": str(diagnostic.line), "col": str(diagnostic.col)}
        where = ""
        if cell is not None:  # a line of the notebook's JSON would mean nothing: the annotation is the file's
            properties = {"file": properties["file"]}
            where = f"cell {cell}, line {diagnostic.line}: "
        properties["title"] = f"mgpu-migrate {diagnostic.code}"
        listed = ",".join(f"{key}={_escape_property(value)}" for key, value in properties.items())
        message = f"{where}{diagnostic.code} {diagnostic.message} (mgpu-migrate --explain {diagnostic.code})"
        lines.append(f"::{level} {listed}::{_escape_data(message)}\n")
    return "".join(lines)
