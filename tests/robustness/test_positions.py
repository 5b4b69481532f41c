"""The cheap positions of analysis/positions.py are LibCST PositionProvider's, node for node, on real files."""

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from mgpu_migrate.analysis.positions import Positions
from tests.fixture_cases import FIXTURES, is_input
from tests.robustness import sweep


def assert_same_positions(source):
    module = cst.parse_module(source)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    positions = Positions(module, source)
    for node, span in reversed(list(expected.items())):  # the last first: the whole file is generated at once
        assert positions.start(node) == (span.start.line, span.start.column), type(node).__name__
        assert positions.end(node) == (span.end.line, span.end.column), type(node).__name__


def test_positions_match_on_the_fixture_scripts():
    for path in sorted(p for p in FIXTURES.rglob("*.py") if is_input(p)):
        assert_same_positions(path.read_text())


def test_positions_match_on_the_smallest_real_files_that_reach_the_parser():
    passing = [path for _, path in sweep.candidates(sweep.corpus_files())]
    sources = [sweep.decoded(path) for path in sorted(passing, key=lambda path: path.stat().st_size)[:8]]
    assert any(sources)
    for source in filter(None, sources):
        assert_same_positions(source)


def test_positions_stop_at_the_statement_asked_about():
    source = "import torch\nmodel = torch.nn.DataParallel(model)\n" + "x = 1\n" * 1000
    module = cst.parse_module(source)
    positions = Positions(module, source)
    call = module.body[1].body[0].value
    assert positions.start(call) == (2, 8)
    assert module.body[-1] not in positions._state.spans


def test_a_node_from_another_tree_is_a_key_error():
    source = "x = 1\n"
    positions = Positions(cst.parse_module(source), source)
    with pytest.raises(KeyError):
        positions.start(cst.parse_module(source).body[0])
