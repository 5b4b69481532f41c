"""``--output-format json``: one document, described by ``mgpu_migrate/schemas/report-v1.json``.

The schema is versioned: a field is added within a version; removing or changing one makes version 2.
"""

from __future__ import annotations

import json

from mgpu_migrate import __version__
from mgpu_migrate.output import Run, display_path, kind_of, split_cell
from mgpu_migrate.results import CHANGED

SCHEMA_VERSION = 1
SCHEMA_ID = "https://mgpu-migrate.invalid/schemas/report-v1.json"


def document(run: Run) -> dict:
    files = []
    for outcome in run.outcomes:
        if outcome.status != CHANGED and not outcome.diagnostics:
            continue
        fix = {"diff": outcome.diff, "applied": run.applied} if outcome.diff else None
        files.append({"path": display_path(outcome.path), "status": outcome.status, "fix": fix})
    diagnostics = []
    for diagnostic in run.diagnostics:
        path, cell = split_cell(diagnostic.path)
        entry = {"path": display_path(path), "line": diagnostic.line, "column": diagnostic.col}
        if cell is not None:
            entry["cell"] = cell
        entry.update(code=diagnostic.code, kind=kind_of(diagnostic), message=diagnostic.message)
        diagnostics.append(entry)
    counts = {status: sum(o.status == status for o in run.outcomes) for status in ("changed", "unchanged", "failed")}
    return {
        "$schema": SCHEMA_ID,
        "version": SCHEMA_VERSION,
        "tool": {"name": "mgpu-migrate", "version": __version__},
        "target": run.target,
        "mode": run.mode,
        "files": files,
        "diagnostics": diagnostics,
        "summary": {**counts, "review": sum(d["kind"] == "review" for d in diagnostics)},
    }


def render(run: Run) -> str:
    return json.dumps(document(run), indent=2) + "\n"
