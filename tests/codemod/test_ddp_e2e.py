"""End to end, --to ddp: each runnable fixture script and its committed migration train to the same weights.

The original runs unchanged with ``python`` (``nn.DataParallel`` without a GPU runs the module as is). The
committed ``NAME.ddp.py`` runs three times: under ``torchrun --standalone --nproc_per_node=2`` and ``=3``
(gloo on the CPU, each batch split by the distributed loader, uneven shares) and with plain ``python`` (a
world of one). Every script trains in float64, so final weights must agree with the original's to 1e-9: in
float32 summation-order rounding through ReLU ties reaches 1e-3 even when the runtime is exact.

One torchrun job per world size runs every migrated script in turn in its workers (each as ``__main__``,
``runpy``), so torch is imported and the process group set up once per worker rather than once per script;
the originals and the single-process runs go in turn in one more interpreter. All three start together;
torchrun's ``--standalone`` picks a free port for each job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_migrate.engine import migrate_source
from mgpu_migrate.options import Options
from tests.codemod.test_save_best_e2e import SCRIPT as SAVE_BEST_SCRIPT
from tests.fixture_cases import FIXTURES, ROOT

torch = pytest.importorskip("torch")

# The shapes the issue names (flat, main() with argparse and train/eval functions, a trainer class, HF style
# with the loss in the model and n_gpu guards, two heads), and every other runnable script with a migration.
REQUIRED = ("flat_script", "main_argparse", "trainer_class", "hf_style", "two_headed")
SCRIPTS = tuple(
    sorted(
        path.stem
        for path in (FIXTURES / "scripts").glob("*.py")
        if "." not in path.stem and path.with_name(f"{path.stem}.ddp.py").exists()
    )
)
WORLD_SIZES = (2, 3)
TOLERANCE = 1e-9
# Scripts whose model normalises over each device's rows (BatchNorm without --sync-bn): the original in one
# process normalises over the whole batch, DataParallel on N GPUs over each chunk. Their reference is the
# balanced migration on N CPU replicas, which is DataParallel's split; DDP on N processes must match it.
PER_DEVICE = {"batchnorm_last_batch"}
# ... and migrated with --sync-bn, the same script normalises over the global batch: exactly the original,
# also as one process on a CPU (torch's SyncBatchNorm refuses CPU tensors; the runtime's runs there).
SYNC_BN = "batchnorm_last_batch"
TIMEOUT_S = 400
# Variables of a launcher or of the runtime that an outer job (or a developer's shell) may have set.
_LAUNCH_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}


def _environment() -> dict[str, str]:
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in _LAUNCH_VARIABLES and not name.startswith(("SLURM_", "MGPU_", "TORCHELASTIC_", "FIXTURE_"))
    }
    return {
        **environment,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), str(ROOT)]),
        "CUDA_VISIBLE_DEVICES": "",  # gloo on the CPU, also on a machine with GPUs
        "OMP_NUM_THREADS": "1",
    }


def _start(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        cwd=FIXTURES / "scripts",
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _weights(path: Path) -> dict:
    saved = torch.load(path, map_location="cpu")
    return saved["model"] if isinstance(saved, dict) and "model" in saved else saved


# Runs scripts one after the other in one interpreter, as `python SCRIPT` would (importing torch once
# instead of once a script): each as __main__, with its own argv and FIXTURE_OUTPUT.
# A script's reference cycles (a generator of its own suspended over a loader, whose frame holds the script's
# globals) are collected before the next script starts, as the end of its process would.
_IN_TURN = """
import gc, json, os, runpy, sys
for script, output, *replicas in json.loads(sys.argv[-1]):
    os.environ.pop("MGPU_CPU_REPLICAS", None)
    if replicas:
        os.environ["MGPU_CPU_REPLICAS"] = str(replicas[0])
    os.environ["FIXTURE_OUTPUT"] = output
    sys.argv = [script]
    runpy.run_path(script, run_name="__main__")
    gc.collect()
"""


def _finish(runs: dict[str, subprocess.Popen]) -> tuple[dict[str, str], list[str]]:
    """Wait for every run (started with its output piped, stderr into stdout): what each printed, and the
    failures, described."""
    outputs, failures = {}, []
    for run, process in runs.items():
        try:
            outputs[run], _ = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            failures.append(f"{run} did not finish in {TIMEOUT_S} s:\n{output[-2000:]}")
            continue
        if process.returncode != 0:
            failures.append(f"{run} failed:\n{outputs[run][-4000:]}")
    return outputs, failures


@pytest.mark.slow
def test_ddp_migrations_train_like_the_originals(tmp_path: Path) -> None:
    assert set(REQUIRED) <= set(SCRIPTS), f"missing migrated scripts: {set(REQUIRED) - set(SCRIPTS)}"
    # One test that starts every run at once: one torchrun job per migrated script, and the originals and
    # the single-process runs in turn in one more interpreter. One test is not split across xdist workers.
    in_turn = [
        (f"{name}{suffix}.py", str(tmp_path / f"{name}-{run}.pt"))
        for name in SCRIPTS
        for suffix, run in (("", "original"), (".ddp", "python"))
    ]
    in_turn += [
        (f"{name}.balanced.py", str(tmp_path / f"{name}-balanced{replicas}.pt"), replicas)
        for name in sorted(PER_DEVICE)
        for replicas in WORLD_SIZES
    ]
    synchronized = tmp_path / f"{SYNC_BN}.sync-bn.ddp.py"
    migrated = migrate_source((FIXTURES / "scripts" / f"{SYNC_BN}.py").read_text(), "ddp", "x.py", Options(sync_bn=True))
    synchronized.write_text(migrated.output)
    in_turn.append((str(synchronized), str(tmp_path / "sync-bn-python.pt")))
    # pytorch/examples' checkpoint helper (test_save_best_e2e.py), also run by every job.
    save_best = {"": tmp_path / "save_best.py", ".ddp": tmp_path / "save_best.ddp.py"}
    save_best[""].write_text(SAVE_BEST_SCRIPT)
    save_best[".ddp"].write_text(migrate_source(SAVE_BEST_SCRIPT, "ddp", "train.py").output)
    in_turn += [(str(save_best[suffix]), str(tmp_path / f"save_best-{run}.pt")) for suffix, run in (("", "original"), (".ddp", "python"))]
    runs = {"the originals and `python NAME.ddp.py`": _start([sys.executable, "-c", _IN_TURN, json.dumps(in_turn)])}
    driver = tmp_path / "in_turn.py"
    driver.write_text(_IN_TURN)
    for processes in WORLD_SIZES:
        scripts = [(f"{name}.ddp.py", str(tmp_path / f"{name}-torchrun{processes}.pt")) for name in SCRIPTS]
        scripts.append((str(synchronized), str(tmp_path / f"sync-bn-torchrun{processes}.pt")))
        scripts.append((str(save_best[".ddp"]), str(tmp_path / f"save_best-torchrun{processes}.pt")))
        runs[f"torchrun --nproc_per_node={processes}"] = _start(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={processes}",
                str(driver),
                json.dumps(scripts),
            ]
        )
    _, failures = _finish(runs)
    assert not failures, "\n\n".join(failures)

    differences = []
    for name in SCRIPTS:
        original = _weights(tmp_path / f"{name}-original.pt")
        for run in (*(f"torchrun{processes}" for processes in WORLD_SIZES), "python"):
            weights = _weights(tmp_path / f"{name}-{run}.pt")
            assert weights.keys() == original.keys(), f"{name} ({run}): other parameters than the original's"
            reference = original
            if name in PER_DEVICE and run != "python":
                # Per-device statistics really differ from the whole batch's: the comparison means something.
                assert _difference(original, weights) > 1e-3, f"{name} ({run}) normalised over the whole batch"
                reference = _weights(tmp_path / f"{name}-balanced{run.removeprefix('torchrun')}.pt")
            difference = _difference(reference, weights)
            print(f"{name} ({run}): max weight difference {difference:.3g}")
            if difference > TOLERANCE:
                differences.append(f"{name} ({run}): max weight difference {difference:.3g}")
            # What a script logged and kept beside the weights (losses, counts, accuracies): the original's.
            metrics = _metrics(tmp_path / f"{name}-original.pt")
            if metrics is not None:
                logged = (_metrics(tmp_path / f"{name}-{run}.pt") - metrics).abs().max().item()
                if logged > TOLERANCE:
                    differences.append(f"{name} ({run}): logged metrics differ by {logged:.3g}")
    original = _weights(tmp_path / f"{SYNC_BN}-original.pt")
    for run in (*(f"torchrun{processes}" for processes in WORLD_SIZES), "python"):
        difference = _difference(original, _weights(tmp_path / f"sync-bn-{run}.pt"))
        print(f"{SYNC_BN} --sync-bn ({run}): max weight difference {difference:.3g}")
        if difference > TOLERANCE:
            differences.append(f"{SYNC_BN} --sync-bn ({run}): max weight difference {difference:.3g}")
    differences += _save_best_differences(tmp_path)
    assert not differences, "\n".join(differences)


def _save_best_differences(tmp_path: Path) -> list[str]:
    """The checkpoint helper's runs: the last epoch's checkpoint and the copy of the best (epoch 1) written,
    with the original's weights."""
    original = torch.load(tmp_path / "save_best-original.pt")
    differences = []
    for run in (*(f"torchrun{processes}" for processes in WORLD_SIZES), "python"):
        output = tmp_path / f"save_best-{run}.pt"
        saved, best = torch.load(output), torch.load(output.with_name(output.name + ".best"))
        if (saved["epoch"], best["epoch"]) != (2, 1):
            differences.append(f"save_best ({run}): epochs {saved['epoch']} and {best['epoch']} saved, not 2 and 1")
        difference = _difference(original["model"], saved["model"])
        print(f"save_best ({run}): max weight difference {difference:.3g}")
        if difference > TOLERANCE:
            differences.append(f"save_best ({run}): max weight difference {difference:.3g}")
    return differences


def _metrics(path: Path):
    saved = torch.load(path, map_location="cpu")
    return saved.get("metrics") if isinstance(saved, dict) else None


def _difference(reference: dict, weights: dict) -> float:
    return max((reference[key] - weights[key]).abs().max().item() for key in reference)
