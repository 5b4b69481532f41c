"""Real multi-process jobs train exactly as their DataParallel original trains on as many devices.

One script (distributed_scripts/train_scenarios.py) trains every scenario in float64. Its original runs under
the emulated nn.DataParallel (``python -m mgpu_runtime.emulation --devices W``; a CPU machine's, without
devices, for a world of one), beside each launch of its migration: plain python (a world of one), torchrun
with 2 and 3 processes, two torchrun "nodes" of 2 on loopback, MGPU_NPROC=2 (relaunched under torchrun), and
SLURM-style variables. Every launch must reproduce the original's final weights, logged losses, the values
its loop computed (masks, indexing, numpy, mixup draws), its evaluation after training and its sample
count within 1e-9; every rank must hold the same values; and every rank's generators and device count must
be what the original saw.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import socket
import subprocess
import sys
from typing import NamedTuple

import pytest
import torch

SCRIPT = pathlib.Path(__file__).parent / "distributed_scripts" / "train_scenarios.py"
TOLERANCE = 1e-9
LAUNCH_TIMEOUT = 240


def _load_script():
    spec = importlib.util.spec_from_file_location("train_scenarios", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _clean_environment(**extra: str) -> dict[str, str]:
    """This environment without launcher or runtime variables (the tests may themselves run under one)."""
    launcher = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in launcher and not name.startswith(("SLURM_", "MGPU_", "TORCHELASTIC_"))
    }
    return {**environment, "OMP_NUM_THREADS": "1", **extra}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run_together(commands: list[tuple[list[str], dict[str, str]]]) -> None:
    """Start every command at once (they form one job, or run side by side) and require each to succeed."""
    processes = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for command, env in commands
    ]
    failures = []
    for process in processes:
        try:
            output, _ = process.communicate(timeout=LAUNCH_TIMEOUT)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            output, _ = process.communicate()
            failures.append(f"timed out after {LAUNCH_TIMEOUT}s:\n{output[-4000:]}")
            continue
        if process.returncode != 0:
            failures.append(f"exit {process.returncode}: {' '.join(process.args)}\n{output[-4000:]}")
    assert not failures, "\n\n".join(failures)


def _torchrun(*options: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *options]


def _original(out: pathlib.Path, devices: int) -> tuple[list[str], dict[str, str]]:
    """The original under DataParallel on ``devices`` emulated devices, writing ``out/rank0.pt``."""
    emulation = [sys.executable, "-m", "mgpu_runtime.emulation", "--devices", str(devices)]
    return [*emulation, str(SCRIPT), str(out), "--original"], _clean_environment()


class Launch(NamedTuple):
    commands: list[tuple[list[str], dict[str, str]]]
    world: int
    processes_per_node: int


def plain(out: pathlib.Path) -> Launch:
    return Launch([([sys.executable, str(SCRIPT), str(out)], _clean_environment())], 1, 1)


def torchrun_2(out: pathlib.Path) -> Launch:
    return Launch([(_torchrun("--standalone", "--nproc_per_node=2", str(SCRIPT), str(out)), _clean_environment())], 2, 2)


def torchrun_3(out: pathlib.Path) -> Launch:
    return Launch([(_torchrun("--standalone", "--nproc_per_node=3", str(SCRIPT), str(out)), _clean_environment())], 3, 3)


def two_nodes(out: pathlib.Path) -> Launch:
    """Two torchrun agents, each a "node" of 2 processes, meeting through c10d rendezvous on loopback."""
    endpoint = f"127.0.0.1:{_free_port()}"
    nodes = [
        _torchrun(
            "--nnodes=2",
            "--nproc_per_node=2",
            f"--node_rank={node}",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint={endpoint}",
            "--rdzv_id=two-nodes",
            str(SCRIPT),
            str(out),
        )
        for node in (0, 1)
    ]
    return Launch([(command, _clean_environment()) for command in nodes], 4, 2)


def mgpu_nproc_2(out: pathlib.Path) -> Launch:
    """Started plainly with MGPU_NPROC=2: setup() relaunches the script under torchrun."""
    return Launch([([sys.executable, str(SCRIPT), str(out)], _clean_environment(MGPU_NPROC="2"))], 2, 2)


def slurm_2(out: pathlib.Path) -> Launch:
    """Two tasks as srun would start them: only SLURM's variables say who is who."""
    job = {
        "SLURM_NTASKS": "2",
        "SLURM_NODEID": "0",
        "SLURM_TASKS_PER_NODE": "2",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_JOB_ID": "4242",
        "MASTER_PORT": str(_free_port()),
    }
    tasks = [
        (
            [sys.executable, str(SCRIPT), str(out)],
            _clean_environment(**job, SLURM_PROCID=str(task), SLURM_LOCALID=str(task)),
        )
        for task in (0, 1)
    ]
    return Launch(tasks, 2, 2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "launch", [plain, torchrun_2, torchrun_3, two_nodes, mgpu_nproc_2, slurm_2], ids=lambda f: f.__name__
)
def test_trains_exactly_like_the_original_under_dataparallel(launch, tmp_path):
    job = launch(tmp_path / "migrated")
    # A world of one is a CPU machine's plain run: DataParallel without devices runs the module itself.
    devices = job.world if job.world > 1 else 0
    _run_together([*job.commands, _original(tmp_path / "original", devices)])
    original = torch.load(tmp_path / "original" / "rank0.pt")
    ranks = [torch.load(tmp_path / "migrated" / f"rank{rank}.pt") for rank in range(job.world)]
    _check_coordinates([result["coordinates"] for result in ranks], job.world, job.processes_per_node)
    problems = _setup_problems(original, ranks)
    unseeded = _load_script().UNSEEDED
    for name, expected in original["scenarios"].items():
        main = ranks[0]["scenarios"][name]
        if name not in unseeded:
            problems += _differences(name, main, expected)
        for attribute in ("seen", "length", "batch_size"):
            if main[attribute] != expected[attribute]:
                problems.append(f"{name}: {attribute} is {main[attribute]}, the original's {expected[attribute]}")
        for rank, other in enumerate(ranks[1:], start=1):
            scenario = other["scenarios"][name]
            if any(not torch.equal(scenario["weights"][k], v) for k, v in main["weights"].items()):
                problems.append(f"{name}: rank {rank}'s weights differ from rank 0's")
            for values in ("losses", "logged", "evaluation"):
                if scenario.get(values) != main.get(values):
                    problems.append(f"{name}: rank {rank}'s {values} differ from rank 0's")
    for result in ranks:
        checkpoint = result["scenarios"]["uneven_last_batch"]
        assert checkpoint["checkpoint_matches"]
        assert checkpoint["checkpoint_keys"] == original["scenarios"]["uneven_last_batch"]["checkpoint_keys"]
    assert not problems, "\n".join(problems)


def _setup_problems(original: dict, ranks: list[dict]) -> list[str]:
    """Every rank sees the original's device count, and draws rank 0's numbers after setup (python, numpy, torch),
    though each process seeded python and numpy from the OS and each rank drew numbers of its own before."""
    problems = []
    draws = ranks[0]["at_setup"]["draws"]
    if draws[2] != original["at_setup"]["draws"][2]:
        problems.append("rank 0's torch generator after setup is not the original's")
    for rank, result in enumerate(ranks):
        seen = result["at_setup"]
        if seen["device_count"] != original["at_setup"]["device_count"]:
            problems.append(f"rank {rank} sees {seen['device_count']} devices, the original {original['at_setup']['device_count']}")
        if seen["draws"] != draws:
            problems.append(f"rank {rank} drew {seen['draws']} after setup (python, numpy, torch), rank 0 {draws}")
    return problems


def _differences(name: str, migrated: dict, original: dict) -> list[str]:
    """Where a scenario of the migration is more than TOLERANCE from the original's."""
    problems = []
    for parameter, value in original["weights"].items():
        difference = (migrated["weights"][parameter] - value).abs().max().item()
        if difference > TOLERANCE:
            problems.append(f"{name}: {parameter} differs from the original's by {difference:.2e}")
    for values in ("losses", "logged", "evaluation"):
        if values not in original:
            continue
        mine, theirs = torch.tensor(migrated[values]), torch.tensor(original[values])
        if mine.shape != theirs.shape or not torch.allclose(mine, theirs, rtol=TOLERANCE, atol=TOLERANCE):
            problems.append(f"{name}: {values} {migrated[values]} != the original's {original[values]}")
    return problems


def _check_coordinates(coordinates: list[dict], world: int, processes_per_node: int) -> None:
    assert [c["rank"] for c in coordinates] == list(range(world))
    assert all(c["world_size"] == world for c in coordinates)
    assert [c["is_main_process"] for c in coordinates] == [rank == 0 for rank in range(world)]
    for c in coordinates:
        assert c["local_rank"] == c["rank"] % processes_per_node
        assert c["node_rank"] == c["rank"] // processes_per_node
        assert c["device"] == "cpu"
        assert c["reduced"] == [world * (world + 1) // 2, (world - 1) / 2]


FIRST_STEP = pathlib.Path(__file__).parent / "distributed_scripts" / "first_step.py"
# The tests that read the job of several modes run on one xdist worker (pyproject: --dist loadgroup), so it
# runs once.
FIRST_STEPS = pytest.mark.xdist_group("first_steps")


def _first_step(out: pathlib.Path, *modes: str, **environment: str) -> dict[str, list[dict]]:
    """Each mode's results, per rank: all the modes trained in turn by one torchrun job of 2 processes."""
    command = _torchrun("--standalone", "--nproc_per_node=2", str(FIRST_STEP), str(out), *modes)
    _run_together([(command, _clean_environment(**environment))])
    return _first_step_results(out, modes, 2)


def _first_step_results(out: pathlib.Path, modes, ranks: int) -> dict[str, list[dict]]:
    return {mode: [torch.load(out / mode / f"rank{rank}.pt") for rank in range(ranks)] for mode in modes}


class FirstSteps(NamedTuple):
    out: pathlib.Path
    modes: dict[str, list[dict]]
    originals: dict[str, dict]


@pytest.fixture(scope="module")
def first_steps(tmp_path_factory) -> FirstSteps:
    """One job for the modes that leave the processes able to go on: seeded whole batches first (the batches
    are compared at a process's first step), then the modes with distributed loaders; beside it, the
    DataParallel original of the modes that train like one, on 2 emulated devices."""
    out = tmp_path_factory.mktemp("first_steps")
    modes = ("seeded", "reinitialized", "divergent_save")
    compared = ("seeded", "reinitialized")
    job = _torchrun("--standalone", "--nproc_per_node=2", str(FIRST_STEP), str(out / "migrated"), *modes)
    emulation = [sys.executable, "-m", "mgpu_runtime.emulation", "--devices", "2"]
    original = [*emulation, str(FIRST_STEP), str(out / "original"), "--original", *compared]
    _run_together([(job, _clean_environment()), (original, _clean_environment())])
    originals = {mode: results[0] for mode, results in _first_step_results(out / "original", compared, 1).items()}
    return FirstSteps(out / "migrated", _first_step_results(out / "migrated", modes, 2), originals)


def _largest_difference(weights: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    return max((weights[name] - value).abs().max().item() for name, value in expected.items())


@pytest.mark.slow
@FIRST_STEPS
def test_whole_batches_that_differ_stop_the_first_step(tmp_path, first_steps):
    """A loader left whole, shuffled differently in each process: the run stops instead of training each
    process on batches of its own; the same batches everywhere train exactly like the original."""
    for result in _first_step(tmp_path / "refused", "unseeded")["unseeded"]:
        assert "trained their first step on whole batches that differ" in result["error"]
        assert "mgpu_runtime.distribute_loader(loader)" in result["error"]
    allowed = _first_step(tmp_path / "allowed", "unseeded", MGPU_ALLOW_DIFFERENT_BATCHES="1")["unseeded"]
    assert all("weights" in result for result in allowed)
    for result in first_steps.modes["seeded"]:
        assert _largest_difference(result["weights"], first_steps.originals["seeded"]["weights"]) <= TOLERANCE


@pytest.mark.slow
@FIRST_STEPS
def test_weights_changed_after_the_wrap_are_made_rank_0s_at_the_first_training_forward(first_steps):
    ranks = first_steps.modes["reinitialized"]
    for name, value in ranks[0]["weights"].items():
        assert torch.equal(ranks[1]["weights"][name], value), name
    assert _largest_difference(ranks[0]["weights"], first_steps.originals["reinitialized"]["weights"]) <= TOLERANCE
    assert any("rank 0's were copied to every process" in warning for warning in ranks[0]["warnings"])
    assert not any("rank 0's were copied" in warning for warning in ranks[1]["warnings"])
    # The seeded mode before it (one model for all) had nothing to copy.
    assert not any("rank 0's were copied" in warning for warning in first_steps.modes["seeded"][0]["warnings"])


@pytest.mark.slow
@FIRST_STEPS
def test_a_save_only_one_rank_reaches_does_not_wait_for_the_others(first_steps):
    # with the wait, rank 0 would wait forever and the job would not have ended
    ranks = first_steps.modes["divergent_save"]
    saved = torch.load(first_steps.out / "divergent_save" / "best.pt")["weight"]
    assert torch.equal(saved, ranks[0]["weights"]["weight"])


AUGMENTED = SCRIPT.parent / "augmented.py"


@pytest.mark.slow
def test_random_augmentation_is_the_originals_with_whole_batches(tmp_path):
    """A dataset that draws per sample: by default each rank loads only its rows, whose draws are not the
    original's numbers (the test shows they differ); MGPU_WHOLE_BATCHES=1 loads whole batches on every rank,
    and the float64 weights are those of the original on 2 emulated devices (2 processes, uneven last batch).
    One job trains both ways."""
    emulation = [sys.executable, "-m", "mgpu_runtime.emulation", "--devices", "2"]
    job = _torchrun("--standalone", "--nproc_per_node=2", str(AUGMENTED), str(tmp_path), "1", "0")
    original = [*emulation, str(AUGMENTED), str(tmp_path), "--original"]
    _run_together([(job, _clean_environment()), (original, _clean_environment())])
    original_weights = torch.load(tmp_path / "original.pt")
    differences = {
        whole: _largest_difference(torch.load(tmp_path / f"whole{whole}.pt"), original_weights) for whole in ("1", "0")
    }
    assert differences["1"] <= TOLERANCE, differences
    assert differences["0"] > 1e-3, differences


def test_a_bad_whole_batches_value_names_the_variable(monkeypatch):
    from mgpu_runtime.distributed.data import whole_batches_asked

    monkeypatch.setenv("MGPU_WHOLE_BATCHES", "yes")
    with pytest.raises(ValueError, match="MGPU_WHOLE_BATCHES='yes': expected 0 or 1"):
        whole_batches_asked()


MODULE_LEVEL = SCRIPT.parent / "module_level_main.py"


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_module_level_runtime_calls_before_setup_are_answered_by_the_jobs_processes(processes, tmp_path):
    """Started plainly with MGPU_NPROC=2, a script whose module-level code asks is_main_process() before the
    main block's setup() leaves one run directory (the process started plainly, about to be relaunched, is no
    main process: it made a second one), and every rank reads the main process's value of a clock skewed per rank
    (a call only the main process makes pairs with nothing). With MGPU_NPROC=1, the plain process answers alone."""
    environment = _clean_environment(MGPU_NPROC=str(processes), MGPU_TIMEOUT="60")
    _run_together([([sys.executable, str(MODULE_LEVEL), str(tmp_path)], environment)])
    assert len(list(tmp_path.glob("run-*"))) == 1, sorted(path.name for path in tmp_path.iterdir())
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(processes)]
    main = "0" if processes > 1 else "plain"
    assert ranks[0]["readings"][:4] == [f"first-{main}", f"main only-{main}", f"loop-{main}", f"loop-{main}"]
    for other in ranks[1:]:
        assert other["world"] == processes and other["readings"][:3] == [f"first-{main}", f"loop-{main}", f"loop-{main}"]
        # the main process's value did not pickle: told at once, not after MGPU_TIMEOUT
        assert "on the main process it raised" in other["readings"][3] and "pickle" in other["readings"][3], other
    if processes > 1:
        assert "pickle" in ranks[0]["readings"][4].lower(), ranks[0]
