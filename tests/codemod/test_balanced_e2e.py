"""End to end, --to balanced: each runnable fixture script and its committed migration train to the same weights.

The original runs unchanged (``nn.DataParallel`` without a GPU runs the module as is); the migrated
``NAME.balanced.py`` runs with ``MGPU_CPU_REPLICAS=2`` and ``=3``, so every batch is split over CPU replicas,
the outputs stay per replica and the criterion combines the per-replica losses. Every script trains in
float64, so final weights must agree to 1e-9 (the measured differences are around 1e-16). Each run must
really have split its batches over the replicas: a script whose wrap sits under ``if n_gpu > 1`` with
``n_gpu`` counting CUDA devices never wraps on CPU replicas and would prove nothing, so it is not run here.

To keep the file fast on two cores, one Python process per script runs the three trainings one after the
other, each as ``__main__`` in fresh globals (``runpy``, what ``python NAME.py`` does), so torch is
imported once per script rather than three times. The runtime reads ``MGPU_CPU_REPLICAS`` when a wrapper
is built, so each run sees its own setting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.codemod.test_ddp_e2e import PER_DEVICE
from tests.fixture_cases import FIXTURES, ROOT

torch = pytest.importorskip("torch")

# Scripts whose wrap sits under `if n_gpu > 1` with n_gpu counting CUDA devices: on CPU they run unwrapped,
# as the original does with one device (the migration keeps such guards for --to balanced); hf_unguarded is
# the same shape wrapped unconditionally. PER_DEVICE scripts are compared with DDP (test_ddp_e2e.py).
GUARDED = {"hf_style"}
SCRIPTS = sorted(
    path
    for path in (FIXTURES / "scripts").glob("*.py")
    if "." not in path.stem and path.with_name(f"{path.stem}.balanced.py").exists() and path.stem not in GUARDED | PER_DEVICE
)
REPLICAS = (2, 3)
TOLERANCE = 1e-9
TIMEOUT_S = 180

# Runs each (script, replicas, output) of the JSON list in argv[1] as __main__, in order, and prints as the
# last line how many pieces the balanced model's outputs had, per run: proof that the replicas were used.
_DRIVER = """
import json, os, runpy, sys
import mgpu_runtime
from mgpu_runtime.balanced.outputs import pieces_of

pieces = []
forward = mgpu_runtime.DataParallelModel.forward

def counting_forward(self, *args, **kwargs):
    output = forward(self, *args, **kwargs)
    found = pieces_of(output)
    pieces[-1] = max(pieces[-1], len(found.values) if found else 1)
    return output

mgpu_runtime.DataParallelModel.forward = counting_forward
for script, replicas, output in json.loads(sys.argv[1]):
    os.environ.pop("MGPU_CPU_REPLICAS", None)
    if replicas:
        os.environ["MGPU_CPU_REPLICAS"] = str(replicas)
    os.environ["FIXTURE_OUTPUT"] = output
    sys.argv = [script]
    pieces.append(0)
    runpy.run_path(script, run_name="__main__")
print(json.dumps(pieces))
"""


def _weights(path: Path) -> dict:
    saved = torch.load(path, map_location="cpu")
    return saved["model"] if "model" in saved else saved


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
def test_balanced_migration_trains_like_the_original(script: Path, tmp_path: Path) -> None:
    migrated = script.with_name(f"{script.stem}.balanced.py")
    runs = [(str(script), None, str(tmp_path / "original.pt"))]
    runs += [(str(migrated), replicas, str(tmp_path / f"replicas{replicas}.pt")) for replicas in REPLICAS]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), str(ROOT)])}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU-replica path, also on a machine with a GPU
    env["OMP_NUM_THREADS"] = "1"  # the replicas are the parallelism; two cores are shared with other tests
    try:
        done = subprocess.run(
            [sys.executable, "-c", _DRIVER, json.dumps(runs)],
            cwd=script.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script.stem}: the three trainings did not finish in {TIMEOUT_S} s")
    assert done.returncode == 0, f"{script.stem} failed:\n{done.stdout}\n{done.stderr}"
    original_pieces, *migrated_pieces = json.loads(done.stdout.splitlines()[-1])
    assert original_pieces == 0
    for replicas, used in zip(REPLICAS, migrated_pieces):
        # At most `replicas`: main_argparse's device_ids=list(range(args.gpus)) asks for two of three.
        assert 1 < used <= replicas, (replicas, used)

    original = _weights(tmp_path / "original.pt")
    for replicas in REPLICAS:
        migrated_weights = _weights(tmp_path / f"replicas{replicas}.pt")
        assert migrated_weights.keys() == original.keys()
        difference = max((original[key] - migrated_weights[key]).abs().max().item() for key in original)
        print(f"{script.stem}: {replicas} replicas, max weight difference {difference:.3g}")
        assert difference <= TOLERANCE, f"{script.stem} with {replicas} replicas: max weight difference {difference:.3g}"
