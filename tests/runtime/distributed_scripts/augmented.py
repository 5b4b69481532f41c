"""A dataset that draws per sample (random augmentation in ``__getitem__``), trained in float64.

    python augmented.py OUT_DIR --original   the original: nn.DataParallel (under the emulation), a plain loader
    python augmented.py OUT_DIR 1 0          its migration (mgpu_runtime), however it is launched, trained
                                             once per MGPU_WHOLE_BATCHES value, in turn in the same processes

Writes the final weights to OUT_DIR/original.pt or OUT_DIR/whole<VALUE>.pt (the main process). The runtime
reads MGPU_WHOLE_BATCHES when a loader is distributed, so the variable is set there for each training.
"""

from __future__ import annotations

import os
import pathlib
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SAMPLES, BATCH = 20, 6


class Augmented(Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(SAMPLES, 4, generator=generator)
        self.y = torch.randn(SAMPLES, 2, generator=generator)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        # A random jitter and flip per sample, from the process's global generator (as torchvision's do).
        x = self.x[index] + 0.1 * torch.rand(4)
        return (x.flip(0) if torch.rand(()) < 0.5 else x), self.y[index]


def main(out: pathlib.Path, original: bool) -> None:
    torch.set_default_dtype(torch.float64)
    if not original:
        import mgpu_runtime

        mgpu_runtime.setup()
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    loader = DataLoader(Augmented(), batch_size=BATCH, shuffle=True)
    if original:
        model = nn.DataParallel(model)
    else:
        model = mgpu_runtime.DistributedDataParallel(model)
        loader = mgpu_runtime.distribute_loader(loader)  # reads MGPU_WHOLE_BATCHES
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    if original or mgpu_runtime.is_main_process():
        torch.save(model.module.state_dict(), out)


if __name__ == "__main__":
    out_dir, settings = pathlib.Path(sys.argv[1]), sys.argv[2:]
    if settings == ["--original"]:
        main(out_dir / "original.pt", original=True)
    else:
        for value in settings:
            os.environ["MGPU_WHOLE_BATCHES"] = value
            main(out_dir / f"whole{value}.pt", original=False)
