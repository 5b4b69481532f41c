"""The cheap positions of analysis/positions.py are LibCST PositionProvider's, node for node, on real files."""

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from mgpu_migrate import old_keywords
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
        assert_same_positions(old_keywords.set_aside(path.read_text())[0])  # as the pipeline parses it


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


def assert_placed_like_position_provider(source, kinds=(cst.Call, cst.Name, cst.SimpleStatementLine, cst.For)):
    """Each node on its own, as a rule asks: placed from the statement that holds it."""
    module = cst.parse_module(source)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    for kind in kinds:
        for node in Positions(module, source)._tree.nodes(kind):
            positions = Positions(module, source)
            span = expected[node]
            assert positions.start(node) == (span.start.line, span.start.column), type(node).__name__
            assert positions.end(node) == (span.end.line, span.end.column), type(node).__name__


def test_each_node_alone_is_placed_as_position_provider_places_it():
    for path in sorted(p for p in FIXTURES.rglob("*.py") if is_input(p))[::7]:
        assert_placed_like_position_provider(old_keywords.set_aside(path.read_text())[0])


def test_statements_in_the_source_twice_or_nested_in_tabs_and_no_final_newline():
    # The first `x = f(1)` is found twice (and its block's statement twice too): placed from the module's start.
    assert_placed_like_position_provider(
        "def g():\n\tif a:\n\t\tx = f(1)\n\n\n\ndef h():\n\tif a:\n\t\tx = f(1)\n\t\ty = [\n  f(2)]\n# end\nz = f(3)"
    )
    assert_placed_like_position_provider("x = f(1)\nx = f(1)\n\n  \n# end\n")


def test_a_node_is_placed_without_generating_the_statements_before_its_own():
    source = "x = 1\n" * 1000 + "def main():\n    x = 1\n    model = torch.nn.DataParallel(model)\n"
    module = cst.parse_module(source)
    positions = Positions(module, source)
    call = module.body[-1].body.body[1].body[0].value
    assert positions.start(call) == (1003, 12)
    assert module.body[0] not in positions._state.spans and module.body[-1] not in positions._state.spans
