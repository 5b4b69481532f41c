"""--to ddp: pytorch/examples' checkpoint helper (save, then copy to the best when it improved).

The tool used to crash on it (MGP003). Now the save and the ``if is_best:`` holding the copy run on the main
process, then every process waits. Here: the migration's text, and its runs among every migrated script's
(``tests/codemod/e2e_runs.py``): the original under the emulated DataParallel on 2 and 3 devices against the
migration under ``torchrun`` at 2 and 3 processes (gloo on the CPU, uneven shares of the last batch), and the
plain original against the migration as one process, in float64: same final weights to 1e-9, the checkpoint of
the last epoch and the copy of the best one written, no hang.
"""

from __future__ import annotations

import pytest

from mgpu_migrate.engine import migrate_source
from tests.codemod.e2e_runs import WORLD_SIZES, compare

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


def test_the_imagenet_save_helper_saves_on_the_main_process() -> None:
    result = migrate_source(SCRIPT, "ddp", "train.py")
    assert result.error is None and result.changed, result.error and result.error.format()
    assert "    if mgpu_runtime.is_main_process():\n        torch.save(state, filename)\n        if is_best:" in result.output
    # Each process trains on its share of every batch (else equal weights would prove nothing about DDP).
    assert "mgpu_runtime.distribute_loader(DataLoader(" in result.output


@pytest.mark.slow
@pytest.mark.xdist_group("e2e")
@pytest.mark.parametrize(("reference", "migrated"), [*((f"emulated{w}", f"torchrun{w}") for w in WORLD_SIZES), ("original", "python")])
def test_the_checkpoints_of_the_migration_are_the_originals(e2e_runs, reference, migrated):
    assert compare(e2e_runs, "save_best", reference, migrated) == []
    for way in (reference, migrated):
        checkpoint = e2e_runs("save_best", way).output
        best = checkpoint.with_name(checkpoint.name + ".best")
        import torch

        assert (torch.load(checkpoint)["epoch"], torch.load(best)["epoch"]) == (2, 1), way
