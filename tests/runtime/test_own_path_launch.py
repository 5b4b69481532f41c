"""``mgpu_runtime.launch_own_path``: a plain start of a script with its own distributed path relaunches it as W
processes, each given the batch option at the original's value over W; otherwise it runs the DataParallel
branch in one process, saying why on stderr (the end-to-end runs: tests/codemod/test_project_shapes_e2e.py)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import mgpu_runtime
from mgpu_runtime.distributed import own_path, rank_output
from mgpu_runtime.distributed.own_path import BATCH_VARIABLE, batch_given, with_batch

_LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
OPTION = ("--train_batch_size",)
SHORT = ("-b", "--batch-size")


@pytest.fixture
def plain(monkeypatch):
    """A plain start wanting two processes, whose exec is stood in for (it records the command and environment)."""
    for name in list(os.environ):
        if name in _LAUNCH_VARIABLES or name.startswith(("SLURM_", "MGPU_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("MGPU_NPROC", "2")
    relaunched: list[tuple[list[str], dict[str, str]]] = []

    def execve(path, command, environment):
        relaunched.append((command, environment))
        raise SystemExit("exec")

    monkeypatch.setattr(os, "execve", execve)
    return relaunched


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ([], (12, "")),
        (["--train_batch_size", "10"], (10, "")),
        (["--train_batch_size=8", "--epochs", "2"], (8, "")),
        (["--train_batch_size", "8", "--train_batch_size", "6"], (6, "")),  # the last one, as argparse reads
        (["--", "--train_batch_size", "8"], (12, "")),  # after --, no option
    ],
)
def test_the_batch_given(arguments, expected):
    assert batch_given(arguments, OPTION, 12) == expected


def test_short_and_attached_spellings():
    assert batch_given(["-b", "9"], SHORT, 4) == (9, "")
    assert batch_given(["-b9"], SHORT, 4) == (9, "")
    assert batch_given(["--batch-size=9"], SHORT, 4) == (9, "")
    assert with_batch(["-b9", "x"], SHORT, "3") == ["-b3", "x"]
    assert with_batch(["--batch-size", "9"], SHORT, "3") == ["--batch-size", "3"]
    assert with_batch(["--batch-size=9"], SHORT, "3") == ["--batch-size=3"]
    assert with_batch(["data"], SHORT, "3") == ["--batch-size", "3", "data"]


def test_what_cannot_be_read_is_said():
    assert batch_given(["--train_b", "8"], OPTION, 12)[1].startswith("--train_b may abbreviate --train_batch_size")
    assert batch_given(["--train_batch_size", "x"], OPTION, 12) == (None, "--train_batch_size 'x' is not a whole number of rows")
    assert batch_given([], OPTION, None)[1] == "no --train_batch_size given, and it has no default"
    assert batch_given(["@args.txt"], OPTION, 12) == (None, "@args.txt may hold --train_batch_size (arguments read from a file)")


def test_a_plain_start_relaunches_with_the_share_of_the_batch(plain, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train.py", "--epochs", "2"])
    monkeypatch.setattr(sys, "orig_argv", ["python", "train.py", "--epochs", "2"])
    with pytest.raises(SystemExit, match="exec"):
        mgpu_runtime.launch_own_path("--train_batch_size", 12)
    (command, environment), = plain
    assert "--nproc_per_node=2" in command and command[-3:] == ["train.py", "--epochs", "2"]  # the command line as it was
    assert environment[BATCH_VARIABLE] == "6" and environment["MGPU_RELAUNCHED"] == "1"
    assert "--train_batch_size 6 per process (12 over 2)" in capsys.readouterr().err


def test_its_processes_are_given_their_share(plain, monkeypatch):
    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29500", "MGPU_RELAUNCHED": "1", BATCH_VARIABLE: "6"}.items():
        monkeypatch.setenv(name, value)
    applied = []
    monkeypatch.setattr(rank_output, "apply", applied.append)
    monkeypatch.setattr(sys, "argv", ["train.py", "--train_batch_size=12", "--epochs", "2"])
    mgpu_runtime.launch_own_path("--train_batch_size", 12)
    assert sys.argv == ["train.py", "--train_batch_size=6", "--epochs", "2"] and len(applied) == 1
    assert not plain
    # No process group of the two: the script did not take its own path; its first step says so, once.
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    with pytest.raises(RuntimeError, match="relaunched as 2 processes to run its own distributed path"):
        optimizer.step()
    optimizer.step()


def test_under_a_launcher_of_the_users_own_nothing_changes(plain, monkeypatch):
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["train.py", "--train_batch_size", "3"])
    mgpu_runtime.launch_own_path("--train_batch_size", 12)
    assert sys.argv == ["train.py", "--train_batch_size", "3"] and not plain


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["--train_batch_size", "7"], "--train_batch_size 7 does not split evenly over 2 processes"),
        (["--train_b", "8"], "--train_b may abbreviate --train_batch_size"),
    ],
)
def test_what_does_not_split_runs_the_dataparallel_branch(plain, monkeypatch, capsys, arguments, said):
    monkeypatch.setattr(sys, "argv", ["train.py", *arguments])
    mgpu_runtime.launch_own_path("--train_batch_size", 12)
    err = capsys.readouterr().err
    assert not plain and err.count("\n") == 1 and said in err and "DataParallel branch in one process" in err
    assert BATCH_VARIABLE not in os.environ


def test_one_device_runs_as_it_is(plain, monkeypatch, capsys):
    monkeypatch.setenv("MGPU_NPROC", "1")
    monkeypatch.setattr(sys, "argv", ["train.py"])
    mgpu_runtime.launch_own_path("--train_batch_size", 12)
    assert not plain and capsys.readouterr().err == ""


def test_the_module_is_the_runtimes():
    assert mgpu_runtime.launch_own_path is own_path.launch_own_path


# Called after the script parsed its command line and let a configuration file override it (DialoGPT's
# `--config`): the batch it holds is split, and the relaunched processes are given their share on their command line.


def test_the_share_spelled_out_for_a_script_that_has_parsed():
    assert with_batch(["--train_batch_size=12", "--x"], OPTION, "6", spelled_out=True) == ["--train_batch_size", "6", "--x"]
    assert with_batch(["-b12", "x"], SHORT, "6", spelled_out=True) == ["--batch-size", "6", "x"]
    assert with_batch(["-b", "12"], SHORT, "6", spelled_out=True) == ["--batch-size", "6"]
    assert with_batch(["--config", "c.json"], OPTION, "6", spelled_out=True) == ["--train_batch_size", "6", "--config", "c.json"]


def test_a_plain_start_that_has_parsed_relaunches_with_the_share_on_the_command_line(plain, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train.py", "--config", "c.json"])
    monkeypatch.setattr(sys, "orig_argv", ["python", "-X", "utf8", "train.py", "--config", "c.json"])
    with pytest.raises(SystemExit, match="exec"):
        mgpu_runtime.launch_own_path("--train_batch_size", batch=16)  # the file's 16, not the command line's
    (command, environment), = plain
    assert command[command.index("-u") + 1 :] == ["-X", "utf8", "train.py", "--train_batch_size", "8", "--config", "c.json"]
    assert environment[BATCH_VARIABLE] == "8"
    assert "--train_batch_size 8 per process (16 over 2)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "batch", "said"),
    [
        ([], 7, "--train_batch_size 7 does not split evenly over 2 processes"),
        ([], None, "--train_batch_size None is not a whole number of rows"),
        (["--train_b", "8"], 8, "--train_b may abbreviate --train_batch_size"),
        (["@more.txt"], 8, "@more.txt may hold --train_batch_size"),
    ],
)
def test_a_batch_held_that_cannot_be_split_runs_the_dataparallel_branch(plain, monkeypatch, capsys, arguments, batch, said):
    monkeypatch.setattr(sys, "argv", ["train.py", *arguments])
    mgpu_runtime.launch_own_path("--train_batch_size", batch=batch)
    err = capsys.readouterr().err
    assert not plain and err.count("\n") == 1 and said in err and "DataParallel branch in one process" in err


def test_a_relaunched_process_that_has_parsed_checks_its_share(plain, monkeypatch):
    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29500", "MGPU_RELAUNCHED": "1", BATCH_VARIABLE: "8"}.items():
        monkeypatch.setenv(name, value)
    applied = []
    monkeypatch.setattr(rank_output, "apply", applied.append)
    monkeypatch.setattr(sys, "argv", ["train.py", "--train_batch_size", "8", "--config", "c.json"])
    mgpu_runtime.launch_own_path("--train_batch_size", batch=8)
    assert sys.argv == ["train.py", "--train_batch_size", "8", "--config", "c.json"] and len(applied) == 1
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    with pytest.raises(RuntimeError, match="relaunched as 2 processes"):  # no process group here: said at its step
        optimizer.step()
    # A configuration file that overrides the command line would train every process on the whole batch.
    with pytest.raises(RuntimeError, match="holds 16: its configuration file overrides the command line"):
        mgpu_runtime.launch_own_path("--train_batch_size", batch=16)
    assert not plain


def test_a_script_that_changed_its_arguments_is_not_relaunched_with_others(plain, monkeypatch):
    from mgpu_runtime.distributed.environment import LaunchEnvironmentError

    monkeypatch.setattr(sys, "argv", ["train.py", "--other"])
    monkeypatch.setattr(sys, "orig_argv", ["python", "train.py", "--config", "c.json"])
    with pytest.raises(LaunchEnvironmentError, match="changed sys.argv"):
        mgpu_runtime.launch_own_path("--train_batch_size", batch=16)
    assert not plain


_STANDS_ASIDE = """
import os, sys
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
import mgpu_runtime
from mgpu_runtime.distributed import process_group

mgpu_runtime.leave_to_own_path()
assert os.environ["MGPU_OWN_PATH_RUNS"] == "1"  # inherited by the processes the script starts (mp.spawn)
assert mgpu_runtime.world_size() == 1 and mgpu_runtime.rank() == 0 and mgpu_runtime.is_main_process()
mgpu_runtime.setup()
mgpu_runtime.barrier()
assert not dist.is_initialized() and not process_group.current_job().owns_process_group
loader = DataLoader(list(range(6)), batch_size=2)
assert mgpu_runtime.distribute_loader(loader) is loader
layer = torch.nn.Linear(2, 2)
wrapped = mgpu_runtime.DistributedDataParallel(layer, reduce_each_backward=True)
assert type(wrapped) is torch.nn.DataParallel and wrapped.module is layer
print("stood aside")
"""


def test_on_the_scripts_own_path_the_runtime_stands_aside(tmp_path):
    """``leave_to_own_path()`` (the codemod calls it right before a script starts its own distributed path itself,
    SimCLR's ``mp.spawn``): with two processes wanted (``MGPU_NPROC=2``), the runtime's calls there relaunch
    nothing and join no process group; each is one plain process's, and the migrated wrap is the original's
    ``nn.DataParallel`` (the run of that path: tests/codemod/test_project_shapes_e2e.py)."""
    import subprocess

    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in _LAUNCH_VARIABLES and not name.startswith(("SLURM_", "MGPU_"))
    }
    environment["MGPU_NPROC"] = "2"
    script = tmp_path / "aside.py"
    script.write_text(_STANDS_ASIDE)
    run = subprocess.run([sys.executable, str(script)], env=environment, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout == "stood aside\n", run.stdout + run.stderr[-3000:]
