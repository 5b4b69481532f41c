"""The loop's global values are collectives: one that only some ranks make is named within seconds.

A real torchrun job of two CPU processes (``distributed_scripts/main_process_metric.py``) computes a metric of
the batch on the main process only. Rank 0 waits in that sum; rank 1 goes on to the next forward, whose
exchange of output rows rank 0 never joins. The lockstep check (the heartbeat comparing blocked ranks' steps
and counts of collectives) must stop the job well before ``MGPU_TIMEOUT``, naming both statements.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixture_cases import HARNESS

SCRIPT = Path(__file__).parent / "distributed_scripts" / "main_process_metric.py"
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120


def _line(marker: str) -> int:
    return next(number for number, line in enumerate(SCRIPT.read_text().splitlines(), 1) if marker in line)


@pytest.mark.slow
def test_a_metric_computed_on_the_main_process_only_is_named_within_seconds():
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("MGPU_", "SLURM_")) and k not in ("RANK", "WORLD_SIZE")},
        "PYTHONPATH": os.pathsep.join([str(HARNESS), str(ROOT / "runtime"), str(ROOT)]),
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
        "MGPU_TIMEOUT": str(TIMEOUT_S),
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT)],
        env=environment, capture_output=True, text=True, timeout=TIMEOUT_S + 60,
    )
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "finished" not in output
    assert "wait in collectives that can never meet" in output, output[-3000:]
    assert f"main_process_metric.py:{_line('THE METRIC')}" in output
    assert f"main_process_metric.py:{_line('THE FORWARD')}" in output
    assert elapsed < TIMEOUT_S / 2, f"named after {elapsed:.0f} s: the timeout, not the check"
