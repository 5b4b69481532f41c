"""``--to ddp --style torch``: the plain-PyTorch scaffold, as a user calls it, and trained under real torchrun.

The golden outputs of ``fixtures/scripts`` in this style (``NAME.ddp-torch.py``) are checked, and run twice,
by ``test_fixtures.py``. Here: the command line and its settings, and end to end. A script whose semantics
allow exactness under DDP (no shuffle, a batch size and a dataset length that divide by the world size, a mean
over rows) must train under ``torchrun --nproc_per_node=2`` (gloo, CPU) to the single process's weights, in
float64 to 1e-9; the shuffled ``flat_script.ddp-torch.py`` must train and save once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import DP_SCRIPT, run_cli
from tests.codemod.e2e_runs import DRIVER, finish, plan
from tests.fixture_cases import FIXTURES

TOLERANCE = 1e-9

# Exact under the textbook scaffold: 52 rows (26 a process), batches of 10 (5 a process; the last global batch
# of 2 is 1 a process), no shuffle, a mean over rows. A main() called from the main block.
EXACT_SCRIPT = '''\
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    inputs = torch.randn(52, 6)
    targets = inputs @ torch.randn(6, 1) + 0.1 * torch.randn(52, 1)
    dataset = TensorDataset(inputs, targets)
    loader = DataLoader(dataset, batch_size=10)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1))
    model = nn.DataParallel(model)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rows = 0  # rows this process trained on: all of them in the original, half under 2 processes
    for epoch in range(3):
        for x, y in loader:
            rows += len(x)
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    torch.save({"model": model.module.state_dict(), "rows": rows}, os.environ["FIXTURE_OUTPUT"])


if __name__ == "__main__":
    main()
'''


def _codes(result: subprocess.CompletedProcess) -> list[str]:
    output = (result.stdout + result.stderr).decode()
    return [line.split()[1] for line in output.splitlines() if ": MGP" in line]


def test_style_torch_writes_no_runtime_and_a_second_run_changes_nothing(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(EXACT_SCRIPT)
    first = run_cli(str(script), "--to", "ddp", "--style", "torch")
    assert first.returncode == 0, first.stderr.decode()
    migrated = script.read_text()
    assert "mgpu_runtime" not in migrated and "nn.DataParallel" not in migrated
    for piece in (
        "dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')",
        "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))",
        "sampler = torch.utils.data.DistributedSampler(dataset, shuffle=False)",
        "DataLoader(dataset, batch_size=10 // dist.get_world_size(), sampler=sampler)",
        "if dist.get_rank() == 0:",
        "dist.destroy_process_group()",
    ):
        assert piece in migrated
    assert "set_epoch" not in migrated  # an unshuffled sampler's order does not depend on the epoch
    assert {"MGP160", "MGP161", "MGP162", "MGP163", "MGP299"} <= set(_codes(first))
    again = run_cli(str(script), "--to", "ddp", "--style", "torch", "--check")
    assert again.returncode == 0 and script.read_text() == migrated


def test_style_comes_from_the_settings_and_belongs_to_ddp(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.mgpu-migrate]\nto = "ddp"\nstyle = "torch"\n')
    (tmp_path / "train.py").write_text(DP_SCRIPT)
    assert run_cli("train.py", cwd=tmp_path).returncode == 0
    assert "torch.nn.parallel.DistributedDataParallel(" in (tmp_path / "train.py").read_text()
    (tmp_path / "other.py").write_text(DP_SCRIPT)
    usage = run_cli("other.py", "--to", "balanced", cwd=tmp_path)
    assert usage.returncode == 2 and b"--style torch is a style of --to ddp" in usage.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.mgpu-migrate]\nto = "ddp"\nstyle = "plain"\n')
    bad = run_cli("other.py", cwd=tmp_path)
    assert bad.returncode == 2 and b"style must be one of runtime, torch" in bad.stderr


def test_a_rewrite_only_the_runtime_makes_leaves_the_file(tmp_path):
    """masked_mean needs the runtime's per-device functional loss (MGP103): torch style leaves it whole."""
    script = tmp_path / "masked_mean.py"
    source = (FIXTURES / "scripts" / "masked_mean.py").read_text()
    script.write_text(source)
    result = run_cli(str(script), "--to", "ddp", "--style", "torch")
    assert result.returncode == 0 and script.read_text() == source
    assert _codes(result) == ["MGP295"]


def _torch_weights(path: Path):
    torch = pytest.importorskip("torch")
    return torch.load(path, map_location="cpu")


@pytest.mark.slow
def test_style_torch_trains_like_the_original_under_torchrun(tmp_path):
    torch = pytest.importorskip("torch")
    original, migrated = tmp_path / "exact.py", tmp_path / "exact.ddp-torch.py"
    original.write_text(EXACT_SCRIPT)
    migrated.write_text(EXACT_SCRIPT)
    assert run_cli(str(migrated), "--to", "ddp", "--style", "torch").returncode == 0
    flat = FIXTURES / "scripts" / "flat_script.ddp-torch.py"
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    # One torchrun job a script: a second process group in the same workers would reuse the first's store keys.
    # The original (in one interpreter) and both jobs start together; --standalone picks a free port for each.
    reference = tmp_path / "original.pt"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    jobs = {
        f"{' '.join(launcher[1:])} {script.name}": [*launcher, str(driver), plan([(script, output, None, None)], tmp_path)]
        for launcher, script, output in (
            ([sys.executable], original, "original"),
            (torchrun, migrated, "torchrun"),
            (torchrun, flat, "flat"),
        )
    }
    failures = finish(jobs, tmp_path)
    assert not failures, "\n\n".join(failures)
    for name in ("original", "torchrun", "flat"):
        assert not (tmp_path / f"{name}.pt.failed.0").exists(), (tmp_path / f"{name}.pt.failed.0").read_text()
    expected, got = _torch_weights(reference), _torch_weights(tmp_path / "torchrun.pt")
    assert (expected["rows"], got["rows"]) == (3 * 52, 3 * 26)  # the data was split, not trained twice
    expected, got = expected["model"], got["model"]
    assert expected.keys() == got.keys()
    for name in expected:
        assert expected[name].dtype == torch.float64
        assert torch.allclose(expected[name], got[name], rtol=0, atol=TOLERANCE), name
    # The shuffled flat script is not exact (MGP298, MGP299), but trains and is saved by rank 0 alone.
    flat_weights = _torch_weights(tmp_path / "flat.pt")
    assert all(torch.isfinite(tensor).all() for tensor in flat_weights.values())


def test_notes_on_the_program_go_when_the_file_is_left_whole():
    """A wrap that stays (dim=1) leaves the file: no word on the DDP program it did not become."""
    from mgpu_migrate.engine import migrate_source
    from mgpu_migrate.options import TORCH_STYLE, Options

    source = (
        "import torch.nn as nn\n"
        "a = nn.DataParallel(nn.Linear(2, 2), dim=1)\n"
        "model = nn.DataParallel(nn.Linear(2, 2))\n"
        "criterion = nn.CrossEntropyLoss()\n"
        "criterion(model(x), y).backward()\n"
    )
    result = migrate_source(source, "ddp", "left.py", Options(style=TORCH_STYLE))
    assert result.output == source
    assert {d.code for d in result.diagnostics} == {"MGP201", "MGP232"}
