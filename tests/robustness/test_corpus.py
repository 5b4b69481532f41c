"""The tool over the standard library and site-packages: the quick slice here, the full sweep on demand.

See tests/robustness/sweep.py for what each sweep checks. Counts of the full sweep are in
benchmarks/RESULTS.md (``python -m tests.robustness.sweep --full``).
"""

import pytest

from tests.robustness import sweep


@pytest.fixture(scope="module")
def corpus():
    return sweep.corpus_files()


@pytest.fixture(scope="module")
def quick(corpus):
    return sweep.quick_slice(corpus)


def assert_clean(tally):
    assert not tally.problems, "\n".join(tally.problems)


@pytest.mark.parametrize("target", sweep.TARGETS)
def test_command_line_over_a_slice_of_real_code(quick, target, tmp_path):
    tally = sweep.sweep_tree(quick, target, tmp_path)
    assert_clean(tally)
    assert tally.files > 200 and tally.candidates > 0


@pytest.mark.parametrize("target", sweep.TARGETS)
def test_sites_injected_into_real_files_are_rewritten_safely(quick, target):
    tally = sweep.sweep_injected(sweep.spread(quick, sweep.QUICK_INJECTED, 8000), target)
    assert_clean(tally)
    assert tally.files >= 30 and tally.rewrites > 0


@pytest.mark.parametrize("target", sweep.TARGETS)
def test_the_prefilter_hides_no_site(corpus, target):
    tally = sweep.sweep_near_misses(sweep.near_misses(corpus, sweep.QUICK_NEAR_MISSES), target)
    assert_clean(tally)


@pytest.mark.robustness
@pytest.mark.parametrize("target", sweep.TARGETS)
def test_full_sweep(corpus, target, tmp_path):
    for tally in (
        sweep.sweep_tree(corpus, target, tmp_path),
        sweep.sweep_injected(sweep.spread(corpus, sweep.FULL_INJECTED, 50_000), target),
        sweep.sweep_near_misses(sweep.near_misses(corpus), target),
    ):
        assert_clean(tally)
