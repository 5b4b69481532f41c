"""``DistributedDataParallel(..., replication_callbacks=True)``: a DataParallelWithCallback's synchronized BatchNorm
(the Synchronized-BatchNorm package's protocol, written for the tests in distributed_scripts/callback_batchnorm.py)
normalises over the global batch at W processes, as the original did over W emulated devices."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch
from torch import nn

from mgpu_runtime.distributed.replication_callbacks import linked, told_copies

SCRIPT = pathlib.Path(__file__).parent / "distributed_scripts" / "callback_batchnorm.py"
_LAUNCH = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}


def _environment(**extra: str) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if k not in _LAUNCH and not k.startswith(("MGPU_", "TORCHELASTIC_", "SLURM_"))}
    return {**kept, "OMP_NUM_THREADS": "1", **extra}


def _run(command: list[str], **extra: str) -> str:
    done = subprocess.run(command, env=_environment(**extra), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def _difference(first: dict, second: dict) -> float:
    assert first.keys() == second.keys()
    return max((first[key].double() - second[key].double()).abs().max().item() for key in first)


@pytest.mark.slow
@pytest.mark.parametrize("processes", [2, 3])
def test_linked_layers_normalise_over_the_global_batch_as_the_callbacks_did(tmp_path, processes):
    reference, migrated, unlinked = (tmp_path / f"{name}.pt" for name in ("reference", "migrated", "unlinked"))
    emulation = [sys.executable, "-m", "mgpu_runtime.emulation", "--devices", str(processes), "--float64"]
    expected = _run([*emulation, str(SCRIPT), "original", str(reference)])
    printed = _run([sys.executable, str(SCRIPT), "migrated", str(migrated)], MGPU_NPROC=str(processes))
    ours, theirs = torch.load(migrated), torch.load(reference)
    assert _difference(ours, theirs) < 1e-9
    # the running statistics stay the original's: its _compute_mean_std assigned them on a replica, lost with it
    assert torch.equal(ours["1.running_mean"], theirs["1.running_mean"])
    lines = [line for line in expected.splitlines() if line.startswith(("epoch", "evaluated"))]
    assert len(lines) == 4 and lines[:3] == [line for line in printed.splitlines() if line.startswith("epoch")]
    # Without the option each rank normalises over its own rows, and the last batch's 2 rows leave one per rank,
    # which BatchNorm refuses: the linked statistics are what trained the model.
    command = [sys.executable, str(SCRIPT), "migrated-unlinked", str(unlinked)]
    done = subprocess.run(command, env=_environment(MGPU_NPROC=str(processes)), capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "Expected more than 1 value per channel" in done.stdout + done.stderr


class _Unknown(nn.BatchNorm1d):
    def __data_parallel_replicate__(self, ctx, copy_id):
        self.copy_id = copy_id


def test_a_layer_with_a_callback_of_another_kind_is_refused_at_the_wrap():
    with pytest.raises(TypeError, match="meets its copies through __data_parallel_replicate__ in a way the runtime"):
        told_copies(nn.Sequential(nn.Linear(2, 2), _Unknown(2)))


def test_the_layer_is_plain_again_after_the_forward():
    namespace: dict = {}
    source = SCRIPT.read_text().split("mode, out = sys.argv")[0]
    exec(compile(source, str(SCRIPT), "exec"), namespace)
    layer = namespace["SynchronizedBatchNorm1d"](3)
    assert told_copies(nn.Sequential(layer)) == [layer]
    with linked([layer]):
        assert layer._is_parallel and layer._parallel_id == 1 and layer._slave_pipe is not None
    assert layer._is_parallel is False and layer._parallel_id is None and layer._slave_pipe is None
