"""Directories made once under --to ddp (MGP133, MGP132), in real processes: the race the original's shapes have
when every process runs them, and none after the migration.

A reduction of what reviewers found in real projects (crnn.pytorch's check-then-create right after set-up,
ncsn's delete-and-recreate of its log folder, audioset_tagging_cnn's ``create_folder`` helper, reid-strong-baseline's
check-then-create under a further condition, ``given``) does each shape
many times, every process lined up at the shape as they are just after their set-up, and counts what fails:
FileExistsError or a vanished path (``make``, ``reset``, ``helper``), or a file a process wrote into the folder
it had just reset and that another process's reset deleted (``lost``). It is migrated by the installed command
line, once as it is and once with ``# noqa`` at each of those rewrites (the migration the tool gave before them),
and each runs under ``torchrun --nproc_per_node=W`` (gloo, the CPU), W = 2 and 3.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.codemod.e2e_runs import environment

pytest.importorskip("torch")

WORLD_SIZES = (2, 3)
# Each run of the naive migration races this many times per shape. Measured on a shared 2-core machine, of 150:
# 2 to 17 check-then-creates failed, 4 to 137 resets, 4 to 16 helper calls, and 137 to 164 files were lost.
TRIALS = 200
# A loaded machine may line the processes up less closely: the naive migration is run again, up to this often,
# until every shape has failed at least once.
NAIVE_RUNS = 4
TIMEOUT_S = 300

FOLDERS = '''
import os


def create_folder(fd):
    if not os.path.exists(fd):
        os.makedirs(fd)
'''

REDUCTION = f'''
import json
import os
import shutil
import sys

import mgpu_runtime
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from folders import create_folder

root = sys.argv[1]


def lined_up():
    """Every process at the same line at once, as they are just after their set-up."""
    mgpu_runtime.barrier()


def make(path):
    if not os.path.exists(path):
        os.makedirs(path)


def make_given(path):
    if path and not os.path.exists(path):
        os.makedirs(path)


def reset(path):
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)


model = nn.DataParallel(nn.Linear(3, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(12, 3), torch.randn(12, 1)), batch_size=4)
for x, y in loader:
    loss = ((model(x) - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

rank = os.environ.get("RANK", "0")
failures = {{"make": 0, "given": 0, "reset": 0, "helper": 0, "lost": 0}}
for trial in range({TRIALS}):
    lined_up()
    try:
        make(os.path.join(root, "make", str(trial)))
    except OSError:
        failures["make"] += 1
    lined_up()
    try:
        make_given(os.path.join(root, "given", str(trial)))
    except OSError:
        failures["given"] += 1
    lined_up()
    try:
        create_folder(os.path.join(root, "helper", str(trial)))
    except OSError:
        failures["helper"] += 1
    lined_up()
    folder = os.path.join(root, "reset", str(trial))
    mine = os.path.join(folder, "rank" + rank)
    try:
        reset(folder)
        with open(mine, "w") as written:  # noqa: MGP134 -- each rank's own file: the race's evidence
            written.write(rank)
    except OSError:
        failures["reset"] += 1
        mine = None
    lined_up()
    if mine is not None and not os.path.exists(mine):
        failures["lost"] += 1
with open(os.path.join(root, "failures." + rank + ".json"), "w") as counted:  # noqa: MGP134 -- each rank's count
    json.dump(failures, counted)
'''


def _migrate(directory: Path, *options: str) -> str:
    """Migrate the reduction in ``directory`` in place with the command line, as a user runs it; its report."""
    done = subprocess.run(
        [sys.executable, "-m", "mgpu_migrate", "--to", "ddp", *options, str(directory)],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == (1 if "--diff" in options else 0), done.stdout + done.stderr
    return done.stdout + done.stderr


def _project(directory: Path, silenced: bool) -> Path:
    """The reduction, migrated; ``silenced``: with ``# noqa`` at each line the directory rewrites were made."""
    directory.mkdir()
    (directory / "pyproject.toml").write_text("")
    (directory / "folders.py").write_text(FOLDERS)
    script = directory / "train.py"
    script.write_text(REDUCTION)
    if silenced:
        # --diff reports the lines of the file as it is (an in-place run, those of the file it writes).
        rewrites = re.findall(r"train\.py:(\d+):\d+: (MGP13[23]) would be: ", _migrate(directory, "--diff"))
        assert len(rewrites) == 4, rewrites
        source = script.read_text().splitlines()
        for line, code in rewrites:
            source[int(line) - 1] += f"  # noqa: {code}"
        script.write_text("\n".join(source) + "\n")
    report = _migrate(directory)
    assert ("MGP133" in report) != silenced and ("MGP132" in report) != silenced, report
    return script


def _failures(script: Path, processes: int, run: Path) -> tuple[dict[str, int], str]:
    """Every rank's failures, summed, after one torchrun job of the script (and what it printed)."""
    run.mkdir()
    job = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", str(script), str(run)],
        cwd=script.parent,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    summed: dict[str, int] = {}
    counts = sorted(run.glob("failures.*.json"))
    assert len(counts) == processes, job.stderr[-3000:]
    for path in counts:
        for shape, count in json.loads(path.read_text()).items():
            summed[shape] = summed.get(shape, 0) + count
    return summed, job.stdout + job.stderr


@pytest.fixture(scope="module")
def reductions(tmp_path_factory):
    root = tmp_path_factory.mktemp("directories_race")
    return root, _project(root / "naive", silenced=True), _project(root / "migrated", silenced=False)


@pytest.mark.slow
@pytest.mark.parametrize("processes", WORLD_SIZES)
def test_the_naive_migration_races_and_the_migration_does_not(reductions, processes):
    root, naive, migrated = reductions
    assert "exist_ok=True" not in naive.read_text() and "exist_ok=True" in migrated.read_text()
    raced: dict[str, int] = {}
    for attempt in range(NAIVE_RUNS):
        failures, _ = _failures(naive, processes, root / f"naive-{processes}-{attempt}")
        raced = {shape: raced.get(shape, 0) + count for shape, count in failures.items()}
        if all(raced.values()):
            break
    else:
        pytest.fail(f"the naive migration did not race at {processes} processes in {NAIVE_RUNS} runs: {raced}")
    failures, printed = _failures(migrated, processes, root / f"migrated-{processes}")
    assert failures == {"make": 0, "given": 0, "reset": 0, "helper": 0, "lost": 0}, printed[-3000:]
