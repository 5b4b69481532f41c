"""End to end, --to ddp: pytorch/examples' checkpoint helper (save, then copy to the best when it improved).

The tool used to crash on it (MGP003). Now the save and the ``if is_best:`` holding the copy run on the main
process, then every process waits. The original runs with ``python`` (DataParallel without a GPU runs the
module as is); the migration runs under ``torchrun`` at 2 and 3 processes (gloo on the CPU, uneven shares of
the last batch), in float64: same final weights to 1e-9, the checkpoint and its copy written once, no hang.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_migrate.engine import migrate_source
from tests.fixture_cases import ROOT

torch = pytest.importorskip("torch")

SCRIPT = '''
import os
import shutil

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def save_checkpoint(state, is_best, filename):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, filename + ".best")


def main():
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    features = torch.randn(53, 6)
    labels = (features.sum(dim=1) > 0).long()
    loader = DataLoader(TensorDataset(features, labels), batch_size=10)
    model = nn.DataParallel(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for inputs, targets in loader:
            loss = criterion(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        is_best = epoch == 1
        save_checkpoint({"epoch": epoch, "model": model.module.state_dict()}, is_best, os.environ["FIXTURE_OUTPUT"])


if __name__ == "__main__":
    main()
'''


def _run(command: list[str], output: Path, cwd: Path) -> subprocess.CompletedProcess:
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SLURM_", "MGPU_", "TORCHELASTIC_")) and name not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    }
    environment.update(
        FIXTURE_OUTPUT=str(output),
        PYTHONPATH=os.pathsep.join([str(ROOT / "runtime"), str(ROOT)]),
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
    )
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_the_imagenet_save_helper_migrates_and_trains_alike(tmp_path: Path) -> None:
    result = migrate_source(SCRIPT, "ddp", "train.py")
    assert result.error is None and result.changed, result.error and result.error.format()
    assert "    if mgpu_runtime.is_main_process():\n        torch.save(state, filename)\n        if is_best:" in result.output
    # Each process trains on its share of every batch (else equal weights would prove nothing about DDP).
    assert "mgpu_runtime.distribute_loader(DataLoader(" in result.output
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "train.ddp.py").write_text(result.output)

    original = _run([sys.executable, "train.py"], tmp_path / "original.pt", tmp_path)
    assert original.returncode == 0, original.stdout + original.stderr
    expected = torch.load(tmp_path / "original.pt")
    for processes in (2, 3):
        output = tmp_path / f"ddp{processes}.pt"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", "train.ddp.py"]
        done = _run(command, output, tmp_path)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        saved, best = torch.load(output), torch.load(output.with_name(output.name + ".best"))
        assert saved["epoch"] == 2 and best["epoch"] == 1
        difference = max((expected["model"][key] - saved["model"][key]).abs().max().item() for key in expected["model"])
        assert difference <= 1e-9, f"{processes} processes: max weight difference {difference:.3g}"
