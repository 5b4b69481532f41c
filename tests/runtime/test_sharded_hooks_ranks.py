"""Gradient hooks on the loop's global values over real processes (``--to ddp``): torchrun, gloo, 2 and 3 ranks.

Every case of ``hook_cases.py`` (``distributed_scripts/hook_cases_job.py``), at 7, 5 and 2 rows (uneven
pieces, an empty one), against the same case on the whole batch in one process, float64: the loss, the
gradients of the batch and of the parameter, and what the case kept (retained gradients, what a hook saw).
Over processes a hook that needs the whole gradient of a value already used is exact too: a rank's piece is
its own, hooked on itself, and the hook's collectives meet the other ranks'.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.hook_cases import CASES, WHOLE_AFTER_USE
from tests.runtime.sharded_cases import job_results

SCRIPT = Path(__file__).parent / "distributed_scripts" / "hook_cases_job.py"
TOLERANCE = 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("processes", [2, 3])
def test_hooks_over_processes_are_given_the_whole_gradient(tmp_path, processes):
    results = job_results(SCRIPT, processes, tmp_path)
    assert set(results) == {f"{case.__name__}/{rows}" for case in [*CASES, *WHOLE_AFTER_USE] for rows in (7, 5, 2)}
    assert {name: worst for name, worst in results.items() if not worst <= TOLERANCE} == {}
