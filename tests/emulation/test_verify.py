"""``mgpu-migrate verify``, run as a user runs it: the original under the emulated DataParallel against the
migration at W processes or replicas. The slow tests run torch; the others stop before it."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mgpu_migrate.verify import same_line
from tests.cli_helpers import DP_SCRIPT, command, run_cli

SCRIPTS = Path(__file__).parents[2] / "fixtures" / "scripts"


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
@pytest.mark.parametrize(("target", "procs"), [("ddp", 2), ("ddp", 3), ("balanced", 2), ("balanced", 3)])
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
    result = verify("flat_script.py", "--to", "balanced", "--procs", "1", "--steps", "4", "--migrated", "flat_script.py", cwd=flat_script)
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
def test_a_run_that_fails_is_an_error_with_its_output(flat_script):
    (flat_script / "broken.py").write_text("import sys\nprint('loading')\nsys.exit('no data here')\n")
    result = verify("flat_script.py", "--to", "balanced", "--migrated", "broken.py", cwd=flat_script)
    assert result.returncode == 2
    assert "the migrated run failed (exit 1)" in result.stderr and "loading" in result.stderr and "no data here" in result.stderr


def test_verify_is_a_command_only_as_the_first_argument(tmp_path):
    (tmp_path / "verify").mkdir()
    (tmp_path / "verify" / "train.py").write_text(DP_SCRIPT)
    for args in (["./verify", "--to", "ddp", "--check", "--show-rewrites"], ["--to", "ddp", "--check", "--show-rewrites", "verify"]):
        result = run_cli(*args, cwd=tmp_path)
        assert result.returncode == 1 and b"train.py:3:9: MGP101" in result.stderr, result.stderr
    help_text = run_cli("verify", "--help", cwd=tmp_path)
    assert help_text.returncode == 0 and help_text.stdout.startswith(b"Usage: mgpu-migrate verify [OPTIONS] SCRIPT")
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
