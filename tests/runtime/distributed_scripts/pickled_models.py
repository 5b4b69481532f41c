"""Trains a small model a few steps through a runtime wrapper, then pickles the whole wrapped model.

``pickled_models.py OUT TARGET...`` trains once per target into ``OUT/TARGET``: ``ddp`` (under torchrun or
plain python, the migration of ``torch.save(model, path)``: ``mgpu_runtime.save(model, path)``; the model
has a SyncBatchNorm layer, which runs as the runtime's CPU layer, and beside it a frozen teacher, which is a
``FrozenModule``), ``balanced`` (with ``MGPU_CPU_REPLICAS=2``: ``torch.save`` of a ``DataParallelModel``).
Beside ``model.pt`` (and ``teacher.pt``) it writes the bare module's weights (``weights.pt``) and the
wrapper's ``state_dict`` keys (``keys.pt``): plain data, for a loader to compare with.
"""

from __future__ import annotations

import pathlib
import sys

import mgpu_runtime
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_default_dtype(torch.float64)


def main(out: pathlib.Path, target: str) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(10, 3), torch.randn(10, 2)
    loader = DataLoader(TensorDataset(x, y), batch_size=5, shuffle=True)
    out.mkdir(parents=True, exist_ok=True)
    normalisation = nn.SyncBatchNorm(4) if target == "ddp" else nn.Identity()
    bare = nn.Sequential(nn.Linear(3, 4), normalisation, nn.ReLU(), nn.Linear(4, 2))
    if target == "ddp":
        mgpu_runtime.save(mgpu_runtime.DistributedDataParallel(nn.Linear(3, 2).requires_grad_(False)), out / "teacher.pt")
        model = mgpu_runtime.DistributedDataParallel(bare)
        loader = mgpu_runtime.distribute_loader(loader)
    else:
        model = mgpu_runtime.DataParallelModel(bare)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for inputs, targets in loader:
        optimizer.zero_grad()
        criterion(model(inputs), targets).backward()
        optimizer.step()
    save = mgpu_runtime.save if target == "ddp" else torch.save
    save(model, out / "model.pt")
    save(model.module.state_dict(), out / "weights.pt")
    save(list(model.state_dict()), out / "keys.pt")


if __name__ == "__main__":
    for name in sys.argv[2:]:
        main(pathlib.Path(sys.argv[1]) / name, name)
