"""Whole batches (no distribute_loader) in every process: the safety net's check that they are the same.

    python whole_batches.py OUT_DIR MODE     MODE: unseeded (each process shuffles its own way) or seeded

Each process writes ``OUT_DIR/rank<R>.pt``: the final weights, or the error the first step raised.
"""

from __future__ import annotations

import pathlib
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def train(mode: str) -> dict:
    import mgpu_runtime
    from mgpu_runtime.distributed.safety import DifferentBatchesError

    mgpu_runtime.setup()
    generator = torch.Generator().manual_seed(7)
    x, y = torch.randn(30, 4, generator=generator), torch.randn(30, 2, generator=generator)
    loader = DataLoader(TensorDataset(x, y), batch_size=6, shuffle=True)  # left whole, as MGP235 leaves it
    torch.manual_seed(3)
    model = mgpu_runtime.DistributedDataParallel(nn.Linear(4, 2))
    # The sampler draws its order from the global generator when iterated.
    if mode == "seeded":
        torch.manual_seed(0)
    else:  # what an unseeded script gets: every process starts from its own random state
        torch.manual_seed(1000 + mgpu_runtime.rank())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for _ in range(2):
            for inputs, targets in loader:
                optimizer.zero_grad()
                nn.functional.mse_loss(model(inputs), targets).backward()
                optimizer.step()
    except DifferentBatchesError as error:
        return {"error": str(error)}
    return {"weights": {name: value.detach().clone() for name, value in model.module.state_dict().items()}}


if __name__ == "__main__":
    out, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
    out.mkdir(parents=True, exist_ok=True)
    import mgpu_runtime

    torch.save(train(mode), out / f"rank{mgpu_runtime.rank()}.pt")
