"""``--output-format sarif``: SARIF 2.1.0, which code-scanning services (GitHub's among them) read.

One run, its rules the codes that occur (with their summaries and ``--explain`` pages), one result per
diagnostic. Relative paths are given against ``%SRCROOT%``, the directory the tool ran in.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path

from mgpu_migrate import __version__
from mgpu_migrate.output import ERROR, REVIEW, Run, code_help, display_path, kind_of, split_cell

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_LEVELS = {REVIEW: "warning", ERROR: "error"}


def _location(path: str) -> dict:
    if os.path.isabs(path):
        return {"uri": Path(path).as_uri()}
    return {"uri": urllib.parse.quote(display_path(path).replace(os.sep, "/")), "uriBaseId": "%SRCROOT%"}


def _rule(code: str, level: str) -> dict:
    summary, page = code_help(code)
    rule = {
        "id": code,
        "shortDescription": {"text": summary},
        "help": {"text": page or summary, "markdown": page or summary},
        "defaultConfiguration": {"level": level},
        "properties": {"explain": f"mgpu-migrate --explain {code}"},
    }
    if page:
        # The page's first section, without its heading ("## What it does").
        first = page.split("\n\n", 1)[0]
        rule["fullDescription"] = {"text": first.split("\n", 1)[-1] if first.startswith("#") else first}
    return rule


def document(run: Run) -> dict:
    diagnostics = run.diagnostics
    levels = {d.code: _LEVELS.get(kind_of(d), "note") for d in diagnostics}
    codes = sorted(levels)
    index = {code: position for position, code in enumerate(codes)}
    results = []
    for d in diagnostics:
        path, cell = split_cell(d.path)
        physical = {"artifactLocation": _location(path)}
        if cell is None:
            physical["region"] = {"startLine": d.line, "startColumn": d.col}
        prefix = "" if cell is None else f"cell {cell}, line {d.line}, column {d.col}: "
        result = {
            "ruleId": d.code,
            "ruleIndex": index[d.code],
            "level": levels[d.code],
            "message": {"text": prefix + d.message},
            "locations": [{"physicalLocation": physical}],
        }
        if cell is not None:
            result["properties"] = {"cell": cell, "line": d.line, "column": d.col}
        results.append(result)
    root = Path(os.getcwd()).as_uri() + "/"
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "mgpu-migrate",
                        "version": __version__,
                        "rules": [_rule(code, levels[code]) for code in codes],
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": root}},
                # A file it could not process is a result (MGP0xx), not a failure of the run.
                "invocations": [{"executionSuccessful": True}],
                "properties": {"target": run.target, "mode": run.mode},
                "results": results,
            }
        ],
    }


def render(run: Run) -> str:
    return json.dumps(document(run), indent=2) + "\n"
