"""End to end, --to ddp: a model wrapped in one module and trained by the project's code in another (issue 23).

open-reid's shape (``fixtures/projects/trainer_class``: ``trainer.train(epoch, train_loader, optimizer)`` of a
trainer class whose base class holds the loop, and a trainer given its loader when built) and SCAN's
(``fixtures/projects/train_function``: ``scan_train(train_dataloader, model, ...)``, the loader from a builder
of ``utils/``, a loss that couples the batch's rows, several heads). The tool splits, in the script, the loader
that the other module's loop iterates, and leaves that module as it is.

Each case's original runs under DataParallel emulated on W devices, its committed migration (``NAME.ddp.py``
beside each file) under ``torchrun --nproc_per_node=W`` (gloo on the CPU), W = 2 and 3, both in float64, each
run in a folder of its own. Against the original: every tensor saved agrees within 1e-9; the lines printed are
the same (rank 0's, the job's); the batch sampler draws the same index batches in the same order (rank 0 runs
the original's sampler for the distributed loader), and no other rank draws a training batch of its own (the
training data is split: each loads only its rows), only the evaluation loader's, which stays whole; and the
files the scripts write are written once (the checkpoint list the project's helper appends to).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.codemod.e2e_runs import environment
from tests.fixture_cases import FIXTURES, is_input

torch = pytest.importorskip("torch")

WORLD_SIZES = (2, 3)
CASES = {
    "trainer_class": ("trainer_class", "train.py"),
    "trainer_epochs": ("trainer_class", "train_epochs.py"),
    "train_function": ("train_function", "scan.py"),
    # Conv-TasNet's: the loop one method call deeper, its loaders in a dict, a DataLoader subclass (rank 0 draws
    # its batches, for every rank), the trainer's module migrated with the script (its saves made once).
    "trainer_solver": ("trainer_class", "train_solver.py"),
    # A training function that appends each step's loss to a log: its module migrates with the script.
    "logged": ("train_function", "logged.py"),
}
# The cases whose validation loader stays whole: every rank draws its batches (the others' split or sent by rank 0).
EVALUATED_WHOLE = {"trainer_class", "trainer_epochs", "train_function"}
TOLERANCE = 1e-9
TIMEOUT_S = 600
OUTPUT = "out.pt"

# Runs the plan in argv[-1] in turn, as `python SCRIPT` would (runner.run: on W emulated devices when given), each
# run with its own FIXTURE_OUTPUT; per rank, what it printed and the index batches every BatchSampler drew, with
# the class of the sampler it drew them from. The modules a script imported from its own folder are dropped after
# it (another case has modules of the same names).
DRIVER = """
import contextlib, gc, json, os, sys
from torch.utils.data import BatchSampler
from mgpu_runtime.emulation import runner

drawn = []
original_iter = BatchSampler.__iter__

def recorded(self):
    for batch in original_iter(self):
        drawn.append([type(self.sampler).__name__, [int(index) for index in batch]])
        yield batch

BatchSampler.__iter__ = recorded
gc.freeze()  # torch's objects, out of each collection below
rank = os.environ.get("RANK", "0")
for script, output, devices in json.loads(sys.argv[-1]):
    os.environ["FIXTURE_OUTPUT"] = output
    drawn.clear()
    before = set(sys.modules)
    with open(f"{output}.lines.{rank}", "w") as lines, contextlib.redirect_stdout(lines):
        runner.run(script, [], devices=devices, float64=True)
    with open(f"{output}.batches.{rank}", "w") as batches:
        json.dump(drawn, batches)
    home = os.path.dirname(os.path.abspath(script))
    for name in set(sys.modules) - before:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(home):
            del sys.modules[name]
    gc.collect()
    gc.freeze()
"""


def _copy(project: str, directory: Path, migrated: bool) -> None:
    """The fixture project's inputs in ``directory``, or (``migrated``) each input's committed ``--to ddp`` migration."""
    source = FIXTURES / "projects" / project
    shutil.copytree(source, directory, ignore=shutil.ignore_patterns("*.ddp.*", "*.balanced.*", "*.diagnostics"))
    if migrated:
        for path in directory.rglob("*.py"):
            expected = source / path.relative_to(directory).with_name(f"{path.stem}.ddp.py")
            if is_input(path) and expected.exists():
                path.write_text(expected.read_text())


def _start(command: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=cwd, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Every run's folder, ``CASE-original-W`` and ``CASE-torchrun-W``, each holding what the run wrote."""
    root = tmp_path_factory.mktemp("handed_training")
    driver = root / "driver.py"
    driver.write_text(DRIVER)
    originals, migrations = [], {processes: [] for processes in WORLD_SIZES}
    for case, (project, entry) in CASES.items():
        for processes in WORLD_SIZES:
            home = root / f"{case}-code-original-{processes}"
            _copy(project, home, migrated=False)
            (root / f"{case}-original-{processes}").mkdir()
            originals.append((str(home / entry), str(root / f"{case}-original-{processes}" / OUTPUT), processes))
        home = root / f"{case}-code-migrated"
        _copy(project, home, migrated=True)
        for processes in WORLD_SIZES:
            (root / f"{case}-torchrun-{processes}").mkdir()
            migrations[processes].append((str(home / entry), str(root / f"{case}-torchrun-{processes}" / OUTPUT), None))
    jobs = {"the originals": _start([sys.executable, str(driver), json.dumps(originals)], root)}
    for processes, scripts in migrations.items():
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
        jobs[f"torchrun {processes}"] = _start([*launcher, str(driver), json.dumps(scripts)], root)
    failures = []
    for name, job in jobs.items():
        try:
            output, _ = job.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            job.kill()
            output, _ = job.communicate()
        if job.returncode != 0:
            failures.append(f"{name} failed ({job.returncode}):\n{output[-4000:]}")
    assert not failures, "\n\n".join(failures)
    return root


def _tensors(saved, prefix=""):
    if isinstance(saved, torch.Tensor):
        yield prefix, saved.to(torch.float64)
    elif isinstance(saved, (int, float)):
        yield prefix, torch.tensor(float(saved), dtype=torch.float64)
    elif isinstance(saved, dict):
        for key, value in saved.items():
            yield from _tensors(value, f"{prefix}.{key}" if prefix else str(key))


def _run(runs: Path, case: str, way: str, processes: int) -> Path:
    return runs / f"{case}-{way}-{processes}"


pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("handed_training_e2e")]
by_case_and_world = [pytest.mark.parametrize("processes", WORLD_SIZES), pytest.mark.parametrize("case", sorted(CASES))]


@by_case_and_world[0]
@by_case_and_world[1]
def test_the_weights_are_the_originals(runs, case, processes):
    original = dict(_tensors(torch.load(_run(runs, case, "original", processes) / OUTPUT)))
    migrated = dict(_tensors(torch.load(_run(runs, case, "torchrun", processes) / OUTPUT)))
    assert original and original.keys() == migrated.keys()
    apart = {name: (original[name] - migrated[name]).abs().max().item() for name in original}
    worst = max(apart, key=apart.get)
    assert apart[worst] <= TOLERANCE, f"{case} at {processes}: {worst} is {apart[worst]:.3g} apart"


@by_case_and_world[0]
@by_case_and_world[1]
def test_the_printed_lines_are_the_originals(runs, case, processes):
    original = (_run(runs, case, "original", processes) / f"{OUTPUT}.lines.0").read_text().splitlines()
    migrated = (_run(runs, case, "torchrun", processes) / f"{OUTPUT}.lines.0").read_text().splitlines()
    assert len(original) >= 3 and migrated == original


@by_case_and_world[0]
@by_case_and_world[1]
def test_the_batches_are_the_originals_and_split(runs, case, processes):
    """Rank 0 draws the original's index batches, in its order; the other ranks draw none of the shuffled
    training loader's (they load their rows of rank 0's), only the evaluation loader's, which stays whole."""
    original = json.loads((_run(runs, case, "original", processes) / f"{OUTPUT}.batches.0").read_text())
    migrated = _run(runs, case, "torchrun", processes)
    assert any(sampler == "RandomSampler" for sampler, _ in original)
    assert json.loads((migrated / f"{OUTPUT}.batches.0").read_text()) == original
    evaluation = [batch for batch in original if batch[0] != "RandomSampler"] if case in EVALUATED_WHOLE else []
    for rank in range(1, processes):
        assert json.loads((migrated / f"{OUTPUT}.batches.{rank}").read_text()) == evaluation


@by_case_and_world[0]
@by_case_and_world[1]
def test_the_files_are_written_once(runs, case, processes):
    original, migrated = _run(runs, case, "original", processes), _run(runs, case, "torchrun", processes)

    def written(run: Path) -> list[str]:
        return sorted(
            str(path.relative_to(run))
            for path in run.rglob("*")
            if path.is_file() and ".lines." not in path.name and ".batches." not in path.name
        )

    assert written(migrated) == written(original)
    listed = original / "checkpoints.txt"  # appended to by the project's save_checkpoint, once a save
    if listed.exists():
        assert len(listed.read_text().splitlines()) == 3
        assert (migrated / "checkpoints.txt").read_text() == listed.read_text()
    log = original / "train.log"  # appended to by the training function, once a step
    if log.exists():
        assert len(log.read_text().splitlines()) >= 9
        assert (migrated / "train.log").read_text() == log.read_text()
