"""End to end, --to balanced: each runnable fixture script and its committed migration train to the same weights.

The original runs unchanged (``nn.DataParallel`` without a GPU runs the module as is); the migrated
``NAME.balanced.py`` runs with ``MGPU_CPU_REPLICAS=2`` and ``=3``, so every batch is split over CPU replicas,
the outputs stay per replica and the criterion combines the per-replica losses. Every script trains in
float64, so final weights must agree to 1e-9 (the measured differences are around 1e-16). Each run must
really have split its batches over the replicas: a script whose wrap sits under ``if n_gpu > 1`` with
``n_gpu`` counting CUDA devices never wraps on CPU replicas and would prove nothing, so it is not run here.

To keep the file fast on two cores, two Python processes (started together, half the scripts each) run
every script's three trainings one after the other, each as ``__main__`` in fresh globals (``runpy``, what
``python NAME.py`` does), so torch is imported twice in all rather than once a script. The runtime reads
``MGPU_CPU_REPLICAS`` when a wrapper is built, so each run sees its own setting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.codemod.test_ddp_e2e import PER_DEVICE, _finish
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

# Runs each (script, replicas, output) of the JSON list in argv[1] as __main__, in order, and prints as the
# last line how many pieces the balanced model's outputs had, per run: proof that the replicas were used.
# A script's reference cycles are collected before the next run starts, as the end of its process would.
_DRIVER = """
import gc, json, os, runpy, sys
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
    gc.collect()
print(json.dumps(pieces))
"""


def _weights(path: Path) -> dict:
    saved = torch.load(path, map_location="cpu")
    return saved["model"] if "model" in saved else saved


def _start(runs: list[tuple[str, int | None, str]]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), str(ROOT)])}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU-replica path, also on a machine with a GPU
    env["OMP_NUM_THREADS"] = "1"  # the replicas are the parallelism; two cores are shared with other tests
    return subprocess.Popen(
        [sys.executable, "-c", _DRIVER, json.dumps(runs)],
        cwd=FIXTURES / "scripts",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # the counts, printed at the end, stay the last line
        text=True,
    )


@pytest.mark.slow
def test_balanced_migrations_train_like_the_originals(tmp_path: Path) -> None:
    assert len(SCRIPTS) > 10, SCRIPTS
    halves = {f"the trainings of {', '.join(script.stem for script in half)}": half for half in (SCRIPTS[0::2], SCRIPTS[1::2])}
    drivers = {}
    for name, half in halves.items():
        runs = []
        for script in half:
            runs.append((str(script), None, str(tmp_path / f"{script.stem}-original.pt")))
            migrated = script.with_name(f"{script.stem}.balanced.py")
            runs += [(str(migrated), replicas, str(tmp_path / f"{script.stem}-replicas{replicas}.pt")) for replicas in REPLICAS]
        drivers[name] = _start(runs)
    outputs, problems = _finish(drivers)
    for name, output in outputs.items():
        if drivers[name].returncode == 0:
            problems += _problems(halves[name], json.loads(output.splitlines()[-1]), tmp_path)
    assert not problems, "\n".join(problems)


def _problems(scripts: list[Path], pieces: list[int], tmp_path: Path) -> list[str]:
    """Each script's three runs: the original's outputs whole, the migration's in pieces, the same weights."""
    problems = []
    for index, script in enumerate(scripts):
        original_pieces, *migrated_pieces = pieces[3 * index : 3 * index + 3]
        if original_pieces != 0:
            problems.append(f"{script.stem}: the original's model split its outputs")
        for replicas, used in zip(REPLICAS, migrated_pieces):
            # At most `replicas`: main_argparse's device_ids=list(range(args.gpus)) asks for two of three.
            if not 1 < used <= replicas:
                problems.append(f"{script.stem} with {replicas} replicas: outputs in {used} pieces")
        problems += _differences(script.stem, tmp_path)
    return problems


def _differences(name: str, tmp_path: Path) -> list[str]:
    original = _weights(tmp_path / f"{name}-original.pt")
    differences = []
    for replicas in REPLICAS:
        migrated_weights = _weights(tmp_path / f"{name}-replicas{replicas}.pt")
        if migrated_weights.keys() != original.keys():
            differences.append(f"{name} with {replicas} replicas: other parameters than the original's")
            continue
        difference = max((original[key] - migrated_weights[key]).abs().max().item() for key in original)
        print(f"{name}: {replicas} replicas, max weight difference {difference:.3g}")
        if difference > TOLERANCE:
            differences.append(f"{name} with {replicas} replicas: max weight difference {difference:.3g}")
    return differences
