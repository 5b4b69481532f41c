"""Writers run once, on the main process, in a job of 2 and 3 CPU processes (``mgpu_runtime.on_main_process``,
``main_process_only``, and ``save`` given the model's outputs), as in one process.

``distributed_scripts/written_once.py`` gives every writer the batch's global values (the model's outputs, held
in pieces), which every process must join in making whole: a writer that made them whole on the main process
alone would wait forever. Each file is created exclusively (``"x"``), so a second writer fails the job; the log
is appended to, so a second writer would repeat its lines; every process reads back what the main process
wrote in a ``with`` block, which must be complete when the block ends. A dataset that downloads its file is built
by the main process first, alone, then by the others (``main_process_first``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixture_cases import HARNESS

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).parent / "distributed_scripts" / "written_once.py"
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240


def _environment() -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("MGPU_", "SLURM_")) and k not in ("RANK", "WORLD_SIZE")},
        "PYTHONPATH": os.pathsep.join([str(HARNESS), str(ROOT / "runtime"), str(ROOT)]),
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
        "MGPU_TIMEOUT": "60",
    }


def _run(directory: Path, processes: int) -> str:
    command = [sys.executable, str(SCRIPT), str(directory)]
    if processes > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *command[1:]]
    done = subprocess.run(command, env=_environment(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    directory = tmp_path_factory.mktemp("alone")
    return directory, _run(directory, 1)


@pytest.mark.slow
@pytest.mark.parametrize("processes", (2, 3))
def test_each_file_is_written_once_and_read_back_complete(alone, tmp_path, processes):
    directory, printed = alone
    assert _run(tmp_path, processes) == printed  # what rank 0 read back, line for line
    written = sorted(path.name for path in tmp_path.iterdir() if not path.name.startswith("model_"))
    assert written == sorted(path.name for path in directory.iterdir() if not path.name.startswith("model_"))
    assert (tmp_path / "log.txt").read_text() == (directory / "log.txt").read_text()
    assert len((tmp_path / "log.txt").read_text().splitlines()) == 5
    builds = (tmp_path / "builds.txt").read_text().splitlines()
    assert builds[:2] == ["start 0", "end 0"] and sorted(builds[2:]) == sorted(f"{way} {rank}" for rank in range(1, processes) for way in ("start", "end")), builds
    assert (directory / "builds.txt").read_text().splitlines() == ["start 0", "end 0"]
    for step in range(5):
        ours = torch.load(tmp_path / f"outputs_{step}.pt")
        theirs = torch.load(directory / f"outputs_{step}.pt")
        assert ours.shape == theirs.shape and (ours - theirs).abs().max().item() <= 1e-9
        assert (torch.load(tmp_path / f"saved_{step}.pt") - theirs).abs().max().item() <= 1e-9
        assert (tmp_path / f"summary_{step}.txt").read_text() == (directory / f"summary_{step}.txt").read_text()
    states = [torch.load(tmp_path / f"model_{rank}.state") for rank in range(processes)]
    for name, value in torch.load(directory / "model_0.state").items():
        assert all((state[name] - value).abs().max().item() <= 1e-9 for state in states), name


FIGURES = Path(__file__).parent / "distributed_scripts" / "figures_closed.py"


@pytest.mark.slow
def test_the_figures_a_tensorboard_writer_is_given_are_closed_on_every_process(tmp_path):
    """``add_figure`` closes its figures on the main process; the stand-in closes them on the others (a figure,
    a list of them), and keeps the one given ``close=False``, as one process does. One event file is written."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(FIGURES), str(tmp_path)]
    done = subprocess.run(command, env={**_environment(), "MGPU_LOG": "all"}, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("rank")) == [
        "rank 0 open figures True",
        "rank 1 open figures True",
    ], done.stdout + done.stderr[-2000:]
    assert len([path for path in tmp_path.iterdir() if path.name.startswith("events.out.tfevents")]) == 1


SHARED_RESULTS = Path(__file__).parent / "distributed_scripts" / "shared_results.py"


@pytest.mark.slow
@pytest.mark.parametrize("processes", [2, 3])
def test_a_visdom_clients_results_are_the_main_processes_on_every_process(tmp_path, processes):
    """A visdom-kind stand-in returns the main process's window id on every process, so a script that keeps it
    and appends to it (``win=window``) draws each point once, into the one window, as one process did; a call
    the main process alone makes pairs with nothing."""
    drawing = tmp_path / "drawing.txt"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
        str(SHARED_RESULTS), str(drawing),
    ]
    done = subprocess.run(command, env={**_environment(), "MGPU_LOG": "all"}, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    windows = "['window_1', 'window_1', 'window_1', 'window_1', 'window_1'] window_5"
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("rank")) == [
        f"rank {rank} windows {windows}" for rank in range(processes)
    ], done.stdout + done.stderr[-2000:]
    assert drawing.read_text().splitlines() == [
        "window_1 None [0] [0.0]",
        "window_2 None [0] [1.0]",
        "window_1 append [1] [0.5]",
        "window_3 None [1] [1.0]",
        "window_1 append [2] [1.0]",
        "window_4 None [2] [1.0]",
        "window_5 None [0] [2.0]",
    ]
