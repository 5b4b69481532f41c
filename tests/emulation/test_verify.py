"""``mgpu-migrate verify``, run as a user runs it: the original under the emulated DataParallel against the
migration at W processes or replicas. The slow tests run torch; the others stop before it."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from mgpu_migrate.verify import same_line
from tests.cli_helpers import DP_SCRIPT, command, run_cli
from tests.codemod.e2e_runs import BALANCED_SCRIPTS, DDP_SCRIPTS, ORIGINALS
from tests.codemod.test_ddp_e2e import UNTRAINABLE_ON_SEVERAL

FIXTURES = Path(__file__).parents[2] / "fixtures"
SCRIPTS = FIXTURES / "scripts"
# The fixture projects' entry scripts that train as they are, without arguments (own_path's take some).
PROJECT_SCRIPTS = ["projects/utils_writers/train.py", "projects/spawned_own_path/train.py"]
OWN_PATH = "projects/own_path/train.py"


def verify(*args: str, cwd: Path, **environment: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*command(), "verify", *args], cwd=cwd, capture_output=True, text=True, timeout=400, env={**os.environ, **environment}
    )


@pytest.fixture
def flat_script(tmp_path) -> Path:
    """The README's example in a directory of its own, with a directory for temporary files beside it."""
    (tmp_path / "project").mkdir()
    (tmp_path / "temporary").mkdir()
    shutil.copy(SCRIPTS / "flat_script.py", tmp_path / "project")
    return tmp_path / "project"


@pytest.mark.slow
# (The sweep below verifies one step of this script too, at --to ddp 2 and --to balanced 3.)
@pytest.mark.parametrize(("target", "procs"), [("ddp", 3), ("balanced", 2)])
def test_the_tools_migration_of_the_readme_example_verifies_and_writes_nothing_of_the_users(flat_script, target, procs):
    temporary = flat_script.parent / "temporary"
    result = verify("flat_script.py", "--to", target, "--procs", str(procs), "--steps", "0", cwd=flat_script, TMPDIR=str(temporary))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"original: nn.DataParallel emulated on {procs} devices: 12 optimizer steps, 2 lines printed"
    assert lines[1].startswith(f"migrated: --to {target} at {procs} ") and lines[1].endswith(": 12 optimizer steps, 2 lines printed")
    assert lines[-2:] == ["printed lines: the same", f"verified: the migration trains as the original on {procs} devices, within 1e-09"]
    assert "MGP101 DataParallel replaced" in result.stderr  # the tool's diagnostics of the migration it verified
    assert sorted(os.listdir(flat_script)) == ["flat_script.py"]
    assert [name for name in os.listdir(temporary) if name.startswith("mgpu-verify-")] == []  # (torch keeps caches there)


@pytest.mark.slow
def test_a_script_against_itself_on_one_device_is_zero_apart(flat_script):
    # (--data naming the script itself, or twice, links nothing more: its copy is in each run's directory already.)
    result = verify(
        "flat_script.py", "--to", "balanced", "--procs", "1", "--steps", "4", "--migrated", "flat_script.py",
        "--data", "flat_script.py", "--data", "flat_script.py", cwd=flat_script,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "largest difference: 0 in model 0 '0.weight' (tolerance 1e-09)" in result.stdout.splitlines()
    assert "4 optimizer steps, 0 lines printed" in result.stdout  # stopped before the epoch's line


@pytest.mark.slow
def test_a_wrong_migration_is_past_the_tolerance_and_named_by_its_tensor(flat_script):
    wrong = (SCRIPTS / "flat_script.balanced.py").read_text().replace("lr=0.1", "lr=0.11")
    (flat_script / "wrong.py").write_text(wrong)
    result = verify("flat_script.py", "--to", "balanced", "--steps", "3", "--migrated", "wrong.py", cwd=flat_script)
    assert result.returncode == 1, result.stdout + result.stderr
    differs = [line for line in result.stdout.splitlines() if line.startswith("differs: ")]
    assert len(differs) == 1 and differs[0].startswith("differs: model 0 '") and differs[0].endswith("past the tolerance 1e-09")
    assert result.stdout.splitlines()[-1] == "not verified: the migration trains differently from the original on 2 devices"


@pytest.mark.slow
def test_a_head_trained_outside_the_wrap_is_compared_too(tmp_path):
    """margin_head's optimizer steps a head the wrap does not hold: a migration that trains it otherwise is
    named by the head's place in the optimizer."""
    shutil.copy(SCRIPTS / "margin_head.py", tmp_path)
    migration = (SCRIPTS / "margin_head.balanced.py").read_text()
    wrong = migration.replace('{"params": head.parameters()}', '{"params": head.parameters(), "lr": 0.11}')
    assert wrong != migration
    (tmp_path / "wrong.py").write_text(wrong)
    result = verify("margin_head.py", "--to", "balanced", "--steps", "2", "--migrated", "wrong.py", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    differs = [line for line in result.stdout.splitlines() if line.startswith("differs: ")]
    assert len(differs) == 1 and differs[0].startswith("differs: optimizer 0 parameter 4 (trained outside the wrapped models) is "), differs


@pytest.mark.slow
def test_a_run_that_fails_is_an_error_with_its_output(flat_script):
    (flat_script / "broken.py").write_text("import sys\nprint('loading')\nsys.exit('no data here')\n")
    result = verify("flat_script.py", "--to", "balanced", "--migrated", "broken.py", cwd=flat_script)
    assert result.returncode == 2
    assert "the migrated run failed (exit 1)" in result.stderr and "loading" in result.stderr and "no data here" in result.stderr


def _sections(report: str, scripts: list[str]) -> dict[str, list[str]]:
    """Each script's lines in the report of several: under its name, or the one line of a script left."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in report.splitlines():
        name = line.split(": ")[0]
        if re.fullmatch(r"\d+ of \d+ migrations? verified, .*", line):
            break  # the count that ends the report
        if line.endswith(": no migration to verify") and name in scripts:
            sections[name] = [line]
        elif line.endswith(":") and line[:-1] in scripts:
            current = sections.setdefault(line[:-1], [])
        elif current is not None and line:
            current.append(line)
    return sections


@pytest.mark.slow
@pytest.mark.parametrize(("target", "procs"), [("ddp", 2), ("balanced", 3)])
def test_every_runnable_fixture_verifies_in_one_command(target, procs):
    """One step of each runnable fixture, all in one command, on each target and one W each (the sweep of
    both W to the scripts' ends is in benchmarks/RESULTS.md): each migration verifies, each script the tool
    leaves says so, and the one DataParallel could not train on several devices fails there as it did."""
    scripts = [f"scripts/{name}.py" for name in ORIGINALS] + PROJECT_SCRIPTS
    result = verify(*scripts, "--to", target, "--procs", str(procs), "--steps", "1", cwd=FIXTURES)
    sections = _sections(result.stdout, scripts)
    assert sorted(sections) == sorted(scripts), result.stdout + result.stderr[-3000:]
    migrated = {f"scripts/{name}.py" for name in (DDP_SCRIPTS if target == "ddp" else BALANCED_SCRIPTS)} | set(PROJECT_SCRIPTS)
    untrainable = f"scripts/{UNTRAINABLE_ON_SEVERAL}.py"
    for script, lines in sections.items():
        if script not in migrated:
            assert lines == [f"{script}: the tool leaves it as it is (--to {target}): no migration to verify"]
        elif script == untrainable:
            assert lines == [f"error: the original run failed (exit 1) under nn.DataParallel emulated on {procs} devices"], lines
        else:
            assert lines[-1] == f"verified: the migration trains as the original on {procs} devices, within 1e-09", (script, lines)
            # One step each, and the same lines printed before it (the transfer-learning tutorial prints its epoch's
            # header first).
            made = [line.rpartition(": ")[2] for line in lines[:2]]
            assert made[0] == made[1] and made[0].startswith("1 optimizer step, "), (script, lines)
    verified = len(migrated - {untrainable})
    left = len(scripts) - len(migrated)
    assert result.stdout.splitlines()[-1] == f"{verified} of {len(migrated)} migrations verified, {left} scripts left by the tool"
    if untrainable in migrated:
        assert result.returncode == 2 and "grad can be implicitly created only for scalar outputs" in result.stderr
        assert f"{untrainable}: the original run failed (exit 1) under nn.DataParallel emulated on {procs} devices" in result.stderr
    else:
        assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_a_files_own_distributed_path_is_launched_plainly_with_the_originals_batch_over_the_processes():
    """own_path's migration (MGP139) is started as its user starts it, `python train.py` with MGPU_NPROC=2: the
    runtime relaunches it on its own DDP path, --train_batch_size 6 each, which trains as the fallback did with 12
    under DataParallel, to the end of the script."""
    result = verify(OWN_PATH, "--to", "ddp", "--procs", "2", "--steps", "0", cwd=FIXTURES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[:2] == [
        "original: nn.DataParallel emulated on 2 devices: 12 optimizer steps, 0 lines printed",
        "migrated: --to ddp at 2 processes (a plain start, relaunched under torchrun on its own distributed path, gloo): "
        "12 optimizer steps, 0 lines printed",
    ]


@pytest.mark.slow
def test_a_batch_the_processes_do_not_divide_is_not_verified():
    result = verify(OWN_PATH, "--to", "ddp", "--procs", "3", "--steps", "1", "--", "--train_batch_size", "10", cwd=FIXTURES)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == (
        "not verified: --train_batch_size 10 does not split evenly over 3 processes, so the migration ran its "
        "DataParallel branch (the original's) in one process; give a batch the 3 processes divide after --"
    )


def test_a_files_own_distributed_path_left_with_its_command_needs_the_originals_batch(tmp_path):
    """A default that is no whole number: the file is left (MGP231) with the torchrun command of its own path,
    which verify launches with the original's batch given after --."""
    source = (FIXTURES / "projects" / "own_path" / "train.py").read_text()
    (tmp_path / "train.py").write_text(source.replace('"--train_batch_size", type=int, default=12', '"--train_batch_size", type=int, default=int("12")'))
    (tmp_path / "pyproject.toml").write_text("")
    cases = {
        (): "give the original's batch B after --, as in: -- --train_batch_size B",
        ("--", "--train_batch_size=10"): "--train_batch_size 10: the original's batch must split evenly over the 3 processes",
    }
    for args, message in cases.items():
        result = verify("train.py", "--to", "ddp", "--procs", "3", *args, cwd=tmp_path)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)


def test_verify_is_a_command_only_as_the_first_argument(tmp_path):
    (tmp_path / "verify").mkdir()
    (tmp_path / "verify" / "train.py").write_text(DP_SCRIPT)
    for args in (["./verify", "--to", "ddp", "--check", "--show-rewrites"], ["--to", "ddp", "--check", "--show-rewrites", "verify"]):
        result = run_cli(*args, cwd=tmp_path)
        assert result.returncode == 1 and b"train.py:3:9: MGP101" in result.stderr, result.stderr
    help_text = run_cli("verify", "--help", cwd=tmp_path)
    assert help_text.returncode == 0 and help_text.stdout.startswith(b"Usage: mgpu-migrate verify [OPTIONS] SCRIPT... [-- SCRIPT_ARGS...]")
    assert b"mgpu-migrate verify SCRIPT.py --to ddp" in run_cli("--help").stdout
    assert run_cli("verify", "--to", "ddp", cwd=tmp_path).returncode == 2  # `verify` itself, without its SCRIPT


def test_usage_errors_stop_before_any_run(tmp_path):
    (tmp_path / "train.py").write_text(DP_SCRIPT)
    (tmp_path / "book.ipynb").write_text("{}")
    cases = {
        ("train.py",): "choose a target with --to",
        ("train.py", "--to", "ddp", "--data", str(tmp_path)): "give an existing path inside the current directory",
        ("train.py", "--to", "ddp", "--data", "missing.csv"): "give an existing path inside the current directory",
        ("book.ipynb", "--to", "ddp"): "verify runs scripts",
        ("train.py", "--to", "balanced", "--style", "torch"): "--style torch is a style of --to ddp",
        ("train.py", "train.py", "--to", "ddp", "--migrated", "train.py"): "--migrated is the migration of one SCRIPT",
    }
    for args, message in cases.items():
        result = verify(*args, cwd=tmp_path)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)


def test_a_script_the_tool_leaves_has_nothing_to_verify(tmp_path):
    (tmp_path / "plain.py").write_text("import torch\nx = torch.ones(3)\n")
    result = verify("plain.py", "--to", "ddp", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "plain.py: the tool leaves it as it is (--to ddp): no migration to verify\n"


@pytest.mark.parametrize(
    ("original", "migrated", "same"),
    [
        ("epoch 0: loss 0.6931", "epoch 0: loss 0.6931", True),
        ("epoch 0: loss 0.6931", "epoch 0: loss 0.6932", True),  # one unit of the last digit: a rounding
        ("epoch 0: loss 0.6931", "epoch 0: loss 0.6933", False),
        ("loss 1.5e-03", "loss 1.6e-03", True),
        ("correct 12 of 53", "correct 13 of 53", False),  # integers are counts: equal or different
        ("epoch 0: loss 0.6931", "epoch 1: loss 0.6931", False),
        ("loss 0.6931", "loss: 0.6931", False),
    ],
)
def test_printed_lines_are_the_same_up_to_the_rounding_of_their_last_digit(original, migrated, same):
    assert same_line(original, migrated) is same


def test_a_float_printed_in_full_may_differ_by_the_tolerance_relative_to_its_size():
    """BERT-pytorch prints `avg_loss` as Python's repr of a float: the order of a sum moves its 16th digit."""
    original, migrated = "avg_loss=10.396511077880859", "avg_loss=10.396511077880857"
    assert not same_line(original, migrated)
    assert same_line(original, migrated, 1e-9)
    assert not same_line("avg_loss=10.396511077880859", "avg_loss=10.396511177880859", 1e-9)
    assert not same_line("step 1000000001", "step 1000000002", 1e-9)  # integers are counts, whatever their size


def test_weights_that_are_nan_in_both_runs_verify_nothing():
    """NaN against NaN is no difference, and no agreement either: both trainings broke down."""
    import torch

    from mgpu_runtime.emulation.compare import compare

    def state(weight):
        return {"steps": 2, "models": [{"wrapper": "DataParallel", "state": {"weight": weight, "bias": torch.zeros(2)}}]}

    broken = torch.full((2, 3), float("nan"))
    assert compare(state(broken), state(broken.clone()))["mismatches"] == [
        "model 0: 'weight' is NaN in both runs: their agreement proves nothing"
    ]
    assert compare(state(torch.ones(2, 3)), state(torch.ones(2, 3)))["mismatches"] == []
