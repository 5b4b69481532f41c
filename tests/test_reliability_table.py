"""The reliability table of benchmarks/RESULTS.md names, for each attack, the test that makes it: each named
test must exist (a function of that name in that file, and its parameter id among its ids), so the table
cannot claim what no test asserts."""

from __future__ import annotations

import ast
import re

from tests.fixture_cases import ROOT

RESULTS = ROOT / "benchmarks" / "RESULTS.md"
_ROW = re.compile(r"^\| [^|]+ \| .+ \| `(tests/[\w/]+\.py)::(\w+)(?:\[([\w-]+)\])?` \|$", re.MULTILINE)


def _section() -> str:
    text = RESULTS.read_text()
    start = text.index("## Reliability: every attack of round 3")
    return text[start : text.index("\n## ", start + 1)]


def test_every_test_the_table_names_exists():
    rows = _ROW.findall(_section())
    assert len(rows) >= 30
    for path, name, parameter in rows:
        source = (ROOT / path).read_text()
        functions = {node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)}
        assert name in functions, f"{path}::{name} is named in the table but does not exist"
        if parameter:
            assert f'"{parameter}"' in source or f"'{parameter}'" in source, f"{path}::{name}[{parameter}]: no such id"


def test_every_row_names_a_test_or_a_measurement():
    rows = [line for line in _section().splitlines() if line.startswith("| ") and not line.startswith(("| #", "| ---"))]
    for row in rows:
        assert _ROW.match(row) or row.endswith("| measured by hand (below) |"), row
