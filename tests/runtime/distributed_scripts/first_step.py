"""What the runtime does at the first training step of a multi-process run, by mode (float64, batches of 7):

    python first_step.py OUT_DIR unseeded       whole batches (no distribute_loader), each process shuffling its own way
    python first_step.py OUT_DIR seeded         whole batches, every process seeded alike
    python first_step.py OUT_DIR reinitialized  weights re-drawn after the wrap with each process's own random numbers
    python first_step.py OUT_DIR divergent_save a save that only rank 0 reaches, wait=False

Several modes train one after the other in the same processes (``OUT_DIR seeded reinitialized``), each with
its own model and optimizer: a launch is what costs time. The whole batches are compared once a process, at
its first step, so a mode with whole batches comes first. Each process writes ``OUT_DIR/MODE/rank<R>.pt`` per
mode: the final weights and the warnings, or the error the first step raised.

``--original`` (first, then the modes ``seeded`` and ``reinitialized``) trains the DataParallel original
instead, for ``python -m mgpu_runtime.emulation --devices W``: ``nn.DataParallel``, the process's own seeds
those of rank 0.
"""

from __future__ import annotations

import pathlib
import sys
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_default_dtype(torch.float64)


def train(mode: str, out: pathlib.Path, original: bool) -> dict:
    if not original:
        import mgpu_runtime
        from mgpu_runtime.distributed.safety import DifferentBatchesError

        mgpu_runtime.setup()
    rank = 0 if original else mgpu_runtime.rank()
    generator = torch.Generator().manual_seed(7)
    x, y = torch.randn(30, 4, generator=generator), torch.randn(30, 2, generator=generator)
    loader = DataLoader(TensorDataset(x, y), batch_size=7, shuffle=True)
    torch.manual_seed(3)
    model = nn.DataParallel(nn.Linear(4, 2)) if original else mgpu_runtime.DistributedDataParallel(nn.Linear(4, 2))
    if mode in ("reinitialized", "divergent_save"):
        if not original:
            loader = mgpu_runtime.distribute_loader(loader)
        torch.manual_seed(1000 + rank)
        model.module.reset_parameters()  # after the wrap: each process draws its own weights
        torch.manual_seed(0)
    elif mode == "seeded":
        torch.manual_seed(0)  # the sampler draws its order from the global generator when iterated
    else:  # what an unseeded script gets: every process starts from its own random state
        torch.manual_seed(1000 + rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for _ in range(2):
                for inputs, targets in loader:
                    optimizer.zero_grad()
                    nn.functional.mse_loss(model(inputs), targets).backward()
                    optimizer.step()
        except Exception as error:
            if original or not isinstance(error, DifferentBatchesError):
                raise
            return {"error": str(error)}
    if mode == "divergent_save" and rank == 0:  # the other ranks never get here
        mgpu_runtime.save(model.module.state_dict(), out / mode / "best.pt", wait=False)
    return {
        "weights": {name: value.detach().clone() for name, value in model.module.state_dict().items()},
        "warnings": [str(warning.message) for warning in caught],
    }


if __name__ == "__main__":
    out, modes = pathlib.Path(sys.argv[1]), sys.argv[2:]
    original = modes[:1] == ["--original"]
    if original:
        modes = modes[1:]
    else:
        import mgpu_runtime
    for mode in modes:
        (out / mode).mkdir(parents=True, exist_ok=True)
        result = train(mode, out, original)
        torch.save(result, out / mode / f"rank{0 if original else mgpu_runtime.rank()}.pt")
