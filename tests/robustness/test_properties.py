"""Property tests: DataParallel sites mixed into generated code shapes (see tests/robustness/shapes.py).

Whatever the shape: no crash, the output compiles, a second run changes nothing, and every DataParallel
call left in the output is one the tool reported for review or one a ``# noqa`` kept.
"""

import os

import libcst as cst
import pytest
from hypothesis import HealthCheck, assume, given, settings
from libcst.metadata import MetadataWrapper, PositionProvider

from mgpu_migrate.analysis.positions import Positions
from tests.robustness.shapes import modules
from tests.robustness.sweep import TARGETS, check_migration, round_trips

# CI runs a few dozen examples per test; MGPU_EXAMPLES=2000 hunts for longer.
SETTINGS = settings(
    max_examples=int(os.environ.get("MGPU_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def compiles(source: str) -> bool:
    try:
        compile(source, "<generated>", "exec", dont_inherit=True)
    except SyntaxError:
        return False
    return True


@pytest.mark.parametrize("target", TARGETS)
@SETTINGS
@given(module=modules())
def test_generated_shapes_migrate_safely(target, module):
    assume(compiles(module.source))
    tally = check_migration(module.source, target, "generated.py", module.sites, module.silenced)
    assert not tally.problems, "\n".join(tally.problems) + "\n--- source ---\n" + module.source


@SETTINGS
@given(module=modules())
def test_positions_match_libcst_position_provider(module):
    """The cheap positions (analysis/positions.py) are PositionProvider's, node for node."""
    assume(compiles(module.source) and round_trips(module.source))
    tree = cst.parse_module(module.source)
    expected = MetadataWrapper(tree, unsafe_skip_copy=True).resolve(PositionProvider)
    positions = Positions(tree, module.source)
    for node, span in expected.items():
        assert positions.start(node) == (span.start.line, span.start.column), type(node).__name__
        assert positions.end(node) == (span.end.line, span.end.column), type(node).__name__
