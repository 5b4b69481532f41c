"""mgpu_runtime.fail_together() (MGP141) under real torchrun jobs: an error one rank's replica raises in its forward
is raised on every rank, as DataParallel re-raised a replica's error in its one process, so a `try:` around the step
skips it on every rank and the copies of the model stay alike. The exactness against the emulated DataParallel is
the fixture failing_steps's (tests/codemod/test_ddp_e2e.py); here, what each rank sees."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from tests.codemod.e2e_runs import job_past_the_exit_abort
from tests.runtime.test_distributed_launches import _clean_environment

SCRIPT = pathlib.Path(__file__).parent / "distributed_scripts" / "failing_forward.py"
JOB_TIMEOUT = 150

pytestmark = pytest.mark.slow


def _job(mode: str, processes: int = 2, **environment: str) -> tuple[int, str]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", str(SCRIPT), mode
    ]
    # torch's gloo teardown aborts a process at its exit now and then on a loaded machine, after the job did its
    # work: run again once then (e2e_runs.job_past_the_exit_abort); a second abort stands.
    result = job_past_the_exit_abort(command, JOB_TIMEOUT, env=_clean_environment(MGPU_LOG="all", **environment))
    return result.returncode, result.stdout + result.stderr


def _weights(output: str) -> set[str]:
    return set(re.findall(r"rank \d weights (\S+)", output))


@pytest.mark.parametrize("processes", [2, 3])
def test_one_ranks_error_is_every_ranks_and_the_step_is_skipped_everywhere(processes):
    returncode, output = _job("one", processes)
    assert returncode == 0, output
    for rank in range(processes):
        assert f"rank {rank} step 2: skipped ValueError: Caught ValueError in replica 1 on device 1." in output
        assert f"rank {rank} step 3: ok" in output
    assert len(_weights(output)) == 1, output  # the copies stay alike


def test_the_lowest_failing_ranks_error_is_raised_as_dataparallel_raised_the_first_replicas():
    returncode, output = _job("both")
    assert returncode == 0, output
    for rank in (0, 1):
        assert f"rank {rank} step 2: skipped KeyError: " in output
    assert "Caught KeyError in replica 0 on device 0." in output and "ValueError" not in output
    assert len(_weights(output)) == 1


def test_an_error_class_no_other_rank_can_load_is_raised_as_a_runtime_error_of_its_name():
    returncode, output = _job("local")
    assert returncode == 0, output
    # a RuntimeError of its name (the class itself cannot reach the other ranks)
    assert "rank 0 step 2: skipped LocalError: Caught LocalError in replica 1 on device 1." in output
    assert len(_weights(output)) == 1


def test_an_error_in_one_ranks_backward_is_not_covered_and_stops_the_job():
    """What the MGP141 page says it leaves: DDP's reduction has started on the other rank; the job ends, loudly."""
    returncode, output = _job("backward", MGPU_TIMEOUT="20")
    assert returncode != 0
    assert "rank 0 step 3: ok" not in output


def test_a_world_of_one_raises_the_error_as_it_is():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "both"], env=_clean_environment(), capture_output=True, text=True,
        timeout=JOB_TIMEOUT, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "rank 0 step 2: skipped KeyError: \"rank 0's own\"" in result.stdout  # nothing exchanged, nothing wrapped
