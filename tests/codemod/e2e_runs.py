"""The end-to-end runs that the e2e tests share: each runnable fixture script against the reference of its migration.

The reference is the original as it runs under ``nn.DataParallel`` on W devices, emulated on the CPU
(``mgpu_runtime.emulation``), at W = 2 and 3 (uneven chunks), and the original as one plain process. The
committed ``NAME.ddp.py`` runs under ``torchrun --nproc_per_node=2`` and ``=3`` (gloo, the CPU) and as one
plain process (a world of one); ``NAME.balanced.py`` runs with ``MGPU_CPU_REPLICAS=2`` and ``=3``. Every run is
float64 (the scripts set it, and the runner does too), saves its weights where ``FIXTURE_OUTPUT`` says, and
its printed lines are kept (under torchrun, rank 0's: the job's).

All the runs start at once and are few processes: one interpreter runs the originals (plain and emulated) and
the worlds of one in turn, two run the balanced migrations, and one torchrun job per world size runs every
migrated script in its workers. Each script runs as ``python NAME.py`` would (``runner.run``: ``__main__``, its
argv, its directory on ``sys.path``), so torch is imported and the process group set up once per process. The
tests of ``test_ddp_e2e.py``, ``test_balanced_e2e.py`` and ``test_save_best_e2e.py`` read the same runs
(``e2e_runs``, a session fixture of their xdist group).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mgpu_migrate.engine import migrate_source
from mgpu_migrate.options import Options
from tests.fixture_cases import FIXTURES, HARNESS, ROOT

SCRIPTS = FIXTURES / "scripts"
WORLD_SIZES = (2, 3)
TOLERANCE = 1e-9
TIMEOUT_S = 900


def _runnable(target: str) -> list[str]:
    return sorted(
        path.stem for path in SCRIPTS.glob("*.py") if "." not in path.stem and path.with_name(f"{path.stem}.{target}.py").exists()
    )


ORIGINALS = sorted(path.stem for path in SCRIPTS.glob("*.py") if "." not in path.stem)
DDP_SCRIPTS = _runnable("ddp")
BALANCED_SCRIPTS = _runnable("balanced")
# Migrated with --sync-bn, this script normalises over the global batch: the one plain process's statistics,
# not DataParallel's per-device ones (torch's SyncBatchNorm refuses CPU tensors; the runtime's runs there).
SYNC_BN = "batchnorm_last_batch"
# A script of PyTorch 0.3's years (`.cuda(async=True)`): not Python from 3.7 on until MGP136 renames the keyword.
LEGACY_ASYNC = FIXTURES / "shapes" / "legacy_async.py"
# Variables of a launcher or of the runtime that an outer job (or a developer's shell) may have set.
_LAUNCH_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}

# Runs each run of the JSON plan in argv[1] in turn, as `python SCRIPT` would (runner.run): its FIXTURE_OUTPUT,
# MGPU_CPU_REPLICAS (the runtime reads it at import and for each wrapper: asked again for each run) and, for an
# original, W emulated devices. What it prints goes to its lines file (one per rank); a run that fails is
# written down and the next one runs; the most replicas a balanced model of the run split over is written too
# (proof that the replicas ran). A script's reference cycles are collected before the next starts; what
# survives a collection (torch's modules, above all) is frozen out of the next ones, each of which would
# otherwise walk every object torch made (0.14 s a run, a third of the e2e job's time).
DRIVER = """
import contextlib, gc, json, os, sys, traceback
import mgpu_runtime
from mgpu_runtime.balanced import devices
from mgpu_runtime.emulation import runner

gc.freeze()

replicas = []
build = mgpu_runtime.DataParallelModel.__init__

def counted(self, *args, **kwargs):
    build(self, *args, **kwargs)
    replicas.append(len(self.device_ids))

mgpu_runtime.DataParallelModel.__init__ = counted
# The functional form (mgpu_runtime.data_parallel, MGP105 and MGP107) splits over the replicas it resolves.
from mgpu_runtime.balanced import functional
forward = functional.parallel_forward

def counted_forward(module, inputs, kwargs, devices, *args, **kwargs2):
    replicas.append(len(devices.replicas))
    return forward(module, inputs, kwargs, devices, *args, **kwargs2)

functional.parallel_forward = counted_forward
rank = os.environ.get("RANK", "0")
for run in json.loads(sys.argv[1]):
    replicas.clear()
    os.environ.pop("MGPU_CPU_REPLICAS", None)
    if run["replicas"]:
        os.environ["MGPU_CPU_REPLICAS"] = str(run["replicas"])
    devices.emulate_cpu_replicas()
    os.environ["FIXTURE_OUTPUT"] = run["output"]
    failure = None
    with open(f"{run['output']}.lines.{rank}", "w") as lines, contextlib.redirect_stdout(lines):
        try:
            runner.run(run["script"], devices=run["devices"], float64=True)
        except BaseException:
            failure = traceback.format_exc()[-4000:]
    if failure is not None:
        with open(f"{run['output']}.failed.{rank}", "w") as written:
            written.write(failure)
    with open(f"{run['output']}.replicas", "w") as written:
        written.write(str(max(replicas, default=0)))
    gc.collect()
    gc.freeze()
"""


@dataclass(frozen=True)
class Run:
    """One training run: what it saved, what it printed (rank 0's), and how it failed, if it did."""

    output: Path

    @property
    def failure(self) -> str | None:
        failed = self.output.with_name(f"{self.output.name}.failed.0")
        return failed.read_text() if failed.exists() else None

    @property
    def replicas(self) -> int:
        """The most replicas a ``DataParallelModel`` of the run split its batches over (0: none built)."""
        return int(self.output.with_name(f"{self.output.name}.replicas").read_text())

    @property
    def lines(self) -> list[str]:
        return self.output.with_name(f"{self.output.name}.lines.0").read_text().splitlines()

    def saved(self):
        import torch

        return torch.load(self.output, map_location="cpu")

    def weights(self) -> dict:
        saved = self.saved()
        return saved["model"] if isinstance(saved, dict) and "model" in saved else saved


class Runs:
    """Every run, by script and how it ran: ``original`` (one plain process), ``emulated1``, ``emulated2``,
    ``emulated3`` (under the emulated DataParallel; on one device, only the originals ``one_device()`` names),
    ``python`` (the ddp migration as one process), ``torchrun2``, ``torchrun3``, ``balanced2``, ``balanced3``."""

    def __init__(self, directory: Path, problems: list[str]) -> None:
        self.directory = directory
        self.problems = problems  # jobs that did not finish

    def __call__(self, script: str, way: str) -> Run:
        return Run(self.directory / f"{script}-{way}.pt")


def environment() -> dict[str, str]:
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in _LAUNCH_VARIABLES and not name.startswith(("SLURM_", "MGPU_", "TORCHELASTIC_", "FIXTURE_"))
    }
    return {
        **environment,
        "PYTHONPATH": os.pathsep.join([str(HARNESS), str(ROOT / "runtime"), str(ROOT)]),
        "PYTHONHASHSEED": "0",
        "CUDA_VISIBLE_DEVICES": "",  # gloo on the CPU, also on a machine with GPUs
        "OMP_NUM_THREADS": "1",
    }


def plan(runs: list[tuple[Path, str, int | None, int | None]], directory: Path) -> str:
    return json.dumps(
        [
            {"script": str(script), "output": str(directory / f"{name}.pt"), "devices": devices, "replicas": replicas}
            for script, name, devices, replicas in runs
        ]
    )


def extra_scripts(directory: Path) -> dict[str, tuple[Path, Path]]:
    """The scripts the runs add to the fixtures', each as (original, ddp migration): the sync-bn migration of
    ``SYNC_BN``, pytorch/examples' checkpoint helper (``test_save_best_e2e.py``) and ``LEGACY_ASYNC``, whose
    original no Python from 3.7 on parses: its reference is the original with the keyword PyTorch 0.4 renamed,
    as it runs on a PyTorch that has only that name (its balanced migration runs too)."""
    from tests.codemod.test_save_best_e2e import SCRIPT as SAVE_BEST

    legacy = directory / f"{LEGACY_ASYNC.stem}.py"
    legacy.write_text(LEGACY_ASYNC.read_text().replace("async=", "non_blocking="))
    synchronized = directory / f"{SYNC_BN}.sync-bn.ddp.py"
    synchronized.write_text(migrate_source((SCRIPTS / f"{SYNC_BN}.py").read_text(), "ddp", "x.py", Options(sync_bn=True)).output)
    save_best, save_best_ddp = directory / "save_best.py", directory / "save_best.ddp.py"
    save_best.write_text(SAVE_BEST)
    save_best_ddp.write_text(migrate_source(SAVE_BEST, "ddp", "train.py").output)
    return {
        "sync-bn": (SCRIPTS / f"{SYNC_BN}.py", synchronized),
        "save_best": (save_best, save_best_ddp),
        LEGACY_ASYNC.stem: (legacy, LEGACY_ASYNC.with_name(f"{LEGACY_ASYNC.stem}.ddp.py")),
    }


def one_device() -> list[str]:
    """The originals whose run under DataParallel on one device a test reads (``test_fixture_references.py``:
    a plain forward trains there as one process does, dropout differs)."""
    from tests.emulation.test_fixture_references import DEVICE_DEPENDENT, PLAIN_IN_FORWARD

    return sorted(name for name, counts in {**PLAIN_IN_FORWARD, **DEVICE_DEPENDENT}.items() if 1 in counts)


def run_all(directory: Path) -> Runs:
    """Start every run at once and wait for them all."""
    extras = extra_scripts(directory)
    ddp = {name: (SCRIPTS / f"{name}.py", SCRIPTS / f"{name}.ddp.py") for name in DDP_SCRIPTS}
    ddp.update(extras)
    originals = {name: SCRIPTS / f"{name}.py" for name in ORIGINALS}
    originals |= {name: original for name, (original, _) in extras.items() if name != "sync-bn"}
    references = [(script, f"{name}-original", None, None) for name, script in originals.items()]
    references += [(script, f"{name}-emulated{w}", w, None) for name, script in originals.items() for w in WORLD_SIZES]
    references += [(originals[name], f"{name}-emulated1", 1, None) for name in one_device()]
    references += [(migrated, f"{name}-python", None, None) for name, (_, migrated) in ddp.items()]
    balanced = [(SCRIPTS / f"{name}.balanced.py", name) for name in BALANCED_SCRIPTS]
    balanced.append((LEGACY_ASYNC.with_name(f"{LEGACY_ASYNC.stem}.balanced.py"), LEGACY_ASYNC.stem))
    halves = [balanced[0::2], balanced[1::2]]
    jobs: dict[str, list[str]] = {"the originals and the worlds of one": [sys.executable, "-c", DRIVER, plan(references, directory)]}
    for index, half in enumerate(halves):
        runs = [(script, f"{name}-balanced{w}", None, w) for script, name in half for w in WORLD_SIZES]
        jobs[f"the balanced migrations ({index + 1} of 2)"] = [sys.executable, "-c", DRIVER, plan(runs, directory)]
    driver = directory / "driver.py"
    driver.write_text(DRIVER)
    for processes in WORLD_SIZES:
        runs = [(migrated, f"{name}-torchrun{processes}", None, None) for name, (_, migrated) in ddp.items()]
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
        jobs[f"torchrun --nproc_per_node={processes}"] = [*launcher, str(driver), plan(runs, directory)]
    return Runs(directory, finish(jobs, directory))


def finish(jobs: dict[str, list[str]], directory: Path) -> list[str]:
    """Start every job's command at once in ``directory`` and wait for them all: the ones that failed, or did
    not finish, described with their output."""
    started = {
        name: subprocess.Popen(
            command, cwd=directory, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for name, command in jobs.items()
    }
    problems = []
    for name, process in started.items():
        try:
            output, _ = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            problems.append(f"{name} did not finish in {TIMEOUT_S} s:\n{output[-3000:]}")
            continue
        if process.returncode != 0:
            problems.append(f"{name} failed:\n{output[-3000:]}")
    return problems


def difference(reference: dict, weights: dict) -> float:
    return max((reference[key].double() - weights[key].double()).abs().max().item() for key in reference)


def compare(runs: Runs, script: str, reference: str, migrated: str, reference_script: str | None = None) -> list[str]:
    """What differs between two runs of a script (the reference's may be another's: the original of a variant):
    a failure, the saved weights past the tolerance, a printed line."""
    from mgpu_migrate.verify import same_line

    first, second = runs(reference_script or script, reference), runs(script, migrated)
    for run, way in ((first, reference), (second, migrated)):
        if run.failure is not None:
            return [f"{script} ({way}) failed:\n{run.failure}"]
    problems = []
    expected, found = first.weights(), second.weights()
    if expected.keys() != found.keys():
        return [f"{script} ({migrated}): other tensors than {reference}'s"]
    # What a script logged and kept beside the weights (losses, counts, accuracies) is compared as a weight.
    metrics = [run.saved().get("metrics") if isinstance(run.saved(), dict) else None for run in (first, second)]
    if metrics[0] is not None:
        expected, found = {**expected, "metrics": metrics[0]}, {**found, "metrics": metrics[1]}
    apart = difference(expected, found)
    print(f"{script}: {migrated} against {reference}, max weight difference {apart:.3g}")
    if apart > TOLERANCE:
        problems.append(f"{script} ({migrated}): max weight difference {apart:.3g} from {reference}")
    lines = (first.lines, second.lines)
    if len(lines[0]) != len(lines[1]) or not all(same_line(a, b) for a, b in zip(*lines)):
        problems.append(f"{script} ({migrated}): printed {lines[1]}, {reference} printed {lines[0]}")
    return problems


# What a gloo process prints when torch's C++ teardown aborts it after its script has ended (no Python frame left,
# SIGABRT): a gloo worker thread drops a finished collective's work, which takes the GIL, while the main thread
# is already finalizing the interpreter (a core dump's stacks: ``mgpu_runtime/distributed/leaving.py``). Seen
# under load in a project's own DDP path, about once in ten to twenty runs, also when the script destroys its
# group; the runtime's own exit leaves the GIL to those threads first (``let_the_gloo_threads_finish``), after
# which 40 loaded runs of such a script did not abort (2 of 40 did without it).
EXIT_ABORT = "terminate called without an active exception"


def job_past_the_exit_abort(
    command: list[str],
    timeout: float,
    before_again: Callable[[], None] | None = None,
    attempts: int = 2,
    **options,
) -> subprocess.CompletedProcess:
    """A multi-process job, run again (at most ``attempts`` runs in all) while a process aborted in torch's
    teardown at its exit (``EXIT_ABORT``; torchrun then stops its peers, maybe before they saved), after
    ``before_again`` (what the run left to be undone); the last abort, or any other failure, stands."""
    run = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **options)
    for _ in range(attempts - 1):
        if run.returncode == 0 or EXIT_ABORT not in run.stderr:
            break
        if before_again is not None:
            before_again()
        run = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **options)
    return run
