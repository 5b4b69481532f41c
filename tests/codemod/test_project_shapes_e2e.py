"""End to end, --to ddp, against the contract's reference: the shapes of real projects (issue 23) that train.

Each case is a fixture script (``fixtures/scripts/NAME.py``) or a fixture project (``fixtures/projects/DIR/``,
its entry script), with the committed migration beside each file (``NAME.ddp.py``). The original runs under
DataParallel emulated on W devices (``mgpu_runtime.emulation``), the migration under ``torchrun
--nproc_per_node=W`` (gloo on the CPU), W = 2 and 3, both in float64; every tensor the script saves
(``FIXTURE_OUTPUT``: the model, a head outside the wrap, logged numbers) must agree within 1e-9. A file left
with its own distributed path runs under the command its MGP231 diagnostic names, read from the tool's output
(N the processes, B the batch the original was given).

One interpreter runs every original in turn, and one torchrun job per W runs every migration in turn in its
workers, so torch is imported and the process group set up once per job (a script that sets up its own
process group runs in a job of its own). A project runs from a copy whose files are its migrations (a file the
tool leaves is copied as it is).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_migrate.engine import migrate_source
from tests.codemod.e2e_runs import environment as _environment
from tests.fixture_cases import FIXTURES, is_input

torch = pytest.importorskip("torch")

WORLD_SIZES = (2, 3)
# name -> (directory under fixtures/, the entry script, its arguments at each W)
# (own_path's migration runs with the command its MGP231 names, the original with its default batch of 12;
# chosen_gpus is given the config that chooses W GPUs, and the original runs on exactly those.)
OWN_PATH, OWN_PATH_BATCH = "own_path", 12
NO_ARGUMENTS = {processes: [] for processes in WORLD_SIZES}
CASES = {
    "margin_head": ("scripts", "margin_head.py", NO_ARGUMENTS),
    "frozen_backbone": ("scripts", "frozen_backbone.py", NO_ARGUMENTS),
    "frozen_discriminator": ("scripts", "frozen_discriminator.py", NO_ARGUMENTS),
    "two_backward_passes": ("scripts", "two_backward_passes.py", NO_ARGUMENTS),
    "trainer_two_passes": ("scripts", "trainer_two_passes.py", NO_ARGUMENTS),
    "frozen_after_wrap": ("projects/frozen_after_wrap", "train.py", NO_ARGUMENTS),
    "triplet_by_name": ("scripts", "triplet_by_name.py", NO_ARGUMENTS),
    "own_batches": ("scripts", "own_batches.py", NO_ARGUMENTS),
    "utils_writers": ("projects/utils_writers", "train.py", NO_ARGUMENTS),
    "directories": ("projects/directories", "train.py", NO_ARGUMENTS),
    "star_imports": ("projects/star_imports", "train.py", NO_ARGUMENTS),
    "random_transforms": ("projects/random_transforms", "train.py", NO_ARGUMENTS),
    "flat_entry": ("projects/flat_entry", "run.py", NO_ARGUMENTS),
    "evaluate_helper": ("projects/evaluate_helper", "train.py", NO_ARGUMENTS),
    OWN_PATH: ("projects/own_path", "train.py", NO_ARGUMENTS),
    "chosen_gpus": ("projects/chosen_gpus", "train.py", {2: ["--config", "two_gpus"], 3: ["--config", "three_gpus"]}),
    # The wrap held by a base class, trained by a subclass of another module, run from an entry script.
    "held_model": ("projects/held_model", "main.py", NO_ARGUMENTS),
}
TOLERANCE = 1e-9
TIMEOUT_S = 500

# Runs scripts one after the other in this interpreter (``runner.run``: as ``python SCRIPT`` would, on W
# emulated devices when given), each with its own FIXTURE_OUTPUT; the modules a script imported from its own
# directory are dropped after it, since another case may have modules of the same names.
_IN_TURN = """
import gc, json, os, sys
from mgpu_runtime.emulation import runner

gc.freeze()  # torch's objects, out of each collection below
for script, args, output, devices in json.loads(sys.argv[-1]):
    os.environ["FIXTURE_OUTPUT"] = output
    before = set(sys.modules)
    runner.run(script, args, devices=devices, float64=True)
    home = os.path.dirname(os.path.abspath(script))
    for name in set(sys.modules) - before:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(home):
            del sys.modules[name]
    gc.collect()
    gc.freeze()
"""


def _copy(case: str, directory: Path, migrated: bool) -> Path:
    """The case's files in ``directory``: the inputs, or (``migrated``) each input's ``--to ddp`` migration."""
    where, entry, _ = CASES[case]
    source = FIXTURES / where
    if where == "scripts":
        chosen = source / (f"{Path(entry).stem}.ddp.py" if migrated else entry)
        (directory / entry).write_text(chosen.read_text())
        return directory / entry
    shutil.copytree(source, directory, ignore=shutil.ignore_patterns("*.ddp.*", "*.balanced.*", "*.ddp-torch.*"), dirs_exist_ok=True)
    if migrated:
        for path in directory.rglob("*.py"):
            expected = source / path.relative_to(directory).with_name(f"{path.stem}.ddp.py")
            if is_input(path) and expected.exists():
                path.write_text(expected.read_text())
    return directory / entry


def _own_path_command(processes: int) -> list[str]:
    """The command MGP231 names for the fixture, for ``processes`` processes and the original's batch."""
    path = FIXTURES / CASES[OWN_PATH][0] / CASES[OWN_PATH][1]
    result = migrate_source(path.read_text(), "ddp", str(path))
    (message,) = [d.message for d in result.diagnostics if d.code == "MGP231"]
    command = message.split("`")[1].replace("B/N", str(OWN_PATH_BATCH // processes)).replace("=N", f"={processes}")
    words = command.split()
    assert words[:3] == ["torchrun", f"--nproc_per_node={processes}", "train.py"], command
    return words[3:]


def _start(command: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=cwd, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request):
    """Every selected case's saved tensors, by (case, run): 'original W' and 'torchrun W' (the cases of the tests
    this session runs: ``-k held_model`` runs that case's jobs alone)."""
    root = tmp_path_factory.mktemp("project_shapes")
    driver = root / "in_turn.py"
    driver.write_text(_IN_TURN)
    originals, migrations = [], {}
    selected = {getattr(item, "callspec", None) and item.callspec.params.get("case") for item in request.session.items}
    for case, (_, _, args) in CASES.items():
        if case not in selected:
            continue
        for processes in WORLD_SIZES:
            home = root / f"{case}-original{processes}"
            home.mkdir()
            script = _copy(case, home, migrated=False)
            originals.append((str(script), args[processes], str(root / f"{case}-original{processes}.pt"), processes))
        home = root / f"{case}-migrated"
        home.mkdir()
        script = _copy(case, home, migrated=True)
        for processes in WORLD_SIZES:
            job = (processes, case if case == OWN_PATH else "")
            launched = _own_path_command(processes) if case == OWN_PATH else args[processes]
            migrations.setdefault(job, []).append((str(script), launched, str(root / f"{case}-torchrun{processes}.pt"), None))
    jobs = {"the originals": _start([sys.executable, str(driver), json.dumps(originals)], root)}
    for (processes, alone), scripts in migrations.items():
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
        jobs[f"torchrun {processes} {alone}"] = _start([*command, str(driver), json.dumps(scripts)], root)
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
    return {path.stem: torch.load(path, map_location="cpu") for path in root.glob("*.pt")}


def _tensors(saved, prefix=""):
    """Every tensor in a saved object, by its path (``model.0.weight``), and every plain number."""
    if isinstance(saved, torch.Tensor):
        yield prefix, saved.to(torch.float64)
    elif isinstance(saved, (int, float)):
        yield prefix, torch.tensor(float(saved), dtype=torch.float64)
    elif isinstance(saved, dict):
        for key, value in saved.items():
            yield from _tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(saved, (list, tuple)):
        for index, value in enumerate(saved):
            yield from _tensors(value, f"{prefix}.{index}" if prefix else str(index))


@pytest.mark.slow
@pytest.mark.xdist_group("project_shapes_e2e")
@pytest.mark.parametrize("processes", WORLD_SIZES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_migration_trains_as_the_original_under_dataparallel(runs, case, processes):
    original = dict(_tensors(runs[f"{case}-original{processes}"]))
    migrated = dict(_tensors(runs[f"{case}-torchrun{processes}"]))
    assert original and original.keys() == migrated.keys()
    apart = {name: (original[name] - migrated[name]).abs().max().item() for name in original}
    worst = max(apart, key=apart.get)
    assert apart[worst] <= TOLERANCE, f"{case} at {processes}: {worst} is {apart[worst]:.3g} apart"
