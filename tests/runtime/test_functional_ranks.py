"""``mgpu_runtime.data_parallel`` inside a job (``--to ddp``): DataParallel's forward over the ranks, each module's
gradients summed by a ``DistributedDataParallel`` the job keeps for it (``distributed/functional.py``).

``distributed_scripts/functional_job.py`` trains a module that is never wrapped through the functional form (BatchNorm
and dropout in ``forward``, 11 rows a batch: chunks 6+5 and 4+4+3, float64), calls it directly between the steps
(an evaluation, ``generate``), then drops it. The reference is the same script on torch's functional
``data_parallel`` under DataParallel emulated on W devices, in one process; the job runs under torchrun (gloo) at
W = 2 and 3. The losses the loop printed, what the direct calls gave and the final state (BatchNorm's running
statistics included) agree to 1e-9; the job made one wrapper and kept neither it nor the module once dropped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixture_cases import HARNESS

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).parent / "distributed_scripts" / "functional_job.py"
ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-9


def _environment() -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("MGPU_", "SLURM_")) and k not in ("RANK", "WORLD_SIZE")},
        "PYTHONPATH": os.pathsep.join([str(HARNESS), str(ROOT / "runtime"), str(ROOT)]),
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
    }


def _run(command: list[str]) -> None:
    done = subprocess.run(command, env=_environment(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("processes", [2, 3])
def test_the_functional_form_over_processes_is_dataparallels(tmp_path, processes):
    reference, migrated = tmp_path / "reference.pt", tmp_path / "migrated.pt"
    _run([sys.executable, str(SCRIPT), str(reference), "reference", str(processes)])
    _run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
            str(SCRIPT), str(migrated), "migrated", str(processes),
        ]
    )
    expected, got = torch.load(reference), torch.load(migrated)
    assert got["wrappers"] == 1  # the functional form ran as DDP, one wrapper for the module
    assert not got["kept"] and got["wrappers_after_drop"] == 0  # a dropped module is not kept by the job
    assert (got["losses"] - expected["losses"]).abs().max().item() <= TOLERANCE
    assert (got["evaluations"] - expected["evaluations"]).abs().max().item() <= TOLERANCE
    assert torch.equal(got["generated"], expected["generated"])
    assert got["state"].keys() == expected["state"].keys()
    worst = {name: (got["state"][name].double() - value.double()).abs().max().item() for name, value in expected["state"].items()}
    assert {name: error for name, error in worst.items() if not error <= TOLERANCE} == {}


def test_outside_a_job_it_is_the_balanced_function():
    import mgpu_runtime
    from mgpu_runtime.balanced.functional import data_parallel as balanced
    from mgpu_runtime.distributed.process_group import current_job

    current = current_job()
    assert current is None or current.group is None  # no job, or a world of one (another test's setup())
    module = torch.nn.Linear(3, 2)
    x = torch.randn(5, 3)
    assert torch.equal(mgpu_runtime.data_parallel(module, x), balanced(module, x))
    assert torch.equal(mgpu_runtime.data_parallel(module, (x,)), module(x))
