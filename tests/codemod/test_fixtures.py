"""Golden before/after fixtures: every case's output, its diagnostics, and a second run changing nothing."""

import pytest

from mgpu_migrate.engine import migrate_source
from tests.fixture_cases import cases


def diagnostic_lines(result):
    return [f"{d.line}:{d.col}: {d.code}" for d in result.diagnostics]


@pytest.mark.parametrize("case", cases(), ids=lambda case: case.id)
def test_fixture(case, update_fixtures):
    source = case.source.read_text()
    result = migrate_source(source, case.target, str(case.source), case.options)
    assert result.error is None, result.error.format()
    lines = diagnostic_lines(result)
    if update_fixtures:
        if result.changed:
            case.expected.write_text(result.output)
        elif case.expected.exists():
            case.expected.unlink()
        case.expected_diagnostics.write_text("".join(f"{line}\n" for line in lines))
    expected = case.expected.read_text() if case.expected.exists() else source
    assert result.output == expected
    assert lines == case.expected_diagnostics.read_text().splitlines()


@pytest.mark.parametrize("case", cases(), ids=lambda case: case.id)
def test_fixture_second_run_changes_nothing(case):
    once = migrate_source(case.source.read_text(), case.target, str(case.source), case.options).output
    twice = migrate_source(once, case.target, str(case.source), case.options)
    assert twice.output == once
    assert not [d for d in twice.diagnostics if d.is_rewrite]
