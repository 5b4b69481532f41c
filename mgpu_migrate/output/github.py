"""``--output-format github``: GitHub Actions workflow commands, which annotate a pull request's diff.

Sites left for a person are warnings, files that could not be processed errors, rewrites notices.
"""

from __future__ import annotations

from mgpu_migrate.output import ERROR, REVIEW, Run, display_path, kind_of

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
        properties = {
            "file": display_path(diagnostic.path),
            "line": str(diagnostic.line),
            "col": str(diagnostic.col),
            "title": f"mgpu-migrate {diagnostic.code}",
        }
        listed = ",".join(f"{key}={_escape_property(value)}" for key, value in properties.items())
        message = f"{diagnostic.code} {diagnostic.message} (mgpu-migrate --explain {diagnostic.code})"
        lines.append(f"::{level} {listed}::{_escape_data(message)}\n")
    return "".join(lines)
