"""Writers of a migrated loop, once on the main process (``mgpu_runtime.on_main_process``, ``main_process_only``).

    torchrun --nproc_per_node=W written_once.py DIRECTORY

Every write is given the batch's global values (the model's outputs, held in pieces) or a file opened for writing.
A file is opened with ``"x"`` (exclusive creation), so a second process writing it fails; the log is appended to,
so a second process would repeat its lines. Rank 0 prints what every process read back after each ``with`` block.
A dataset that downloads its file when it is missing (``main_process_first``) is built by every process, the
main process's build first and alone: ``builds.txt`` holds each build's start and end, by rank.
"""

import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import mgpu_runtime


class Logger:
    """A project's log: its file made at construction."""

    def __init__(self, path):
        self.file = open(path, "x")  # noqa: SIM115 -- kept open, as a project's log is

    def write(self, line):
        self.file.write(line + "\n")
        self.file.flush()


def save_outputs(outputs, path):
    with open(path, "xb") as handle:
        torch.save(outputs.detach().clone(), handle)
    return "saved"


class Downloaded:
    """A dataset built with download=True, as torchvision's are: the file fetched when missing, then read."""

    def __init__(self, root, download=False):
        with open(os.path.join(root, "builds.txt"), "a") as log:
            log.write(f"start {mgpu_runtime.rank()}\n")
        path = os.path.join(root, "data.pt")
        if download and not os.path.exists(path):
            time.sleep(0.5)  # the fetch: a build of every process at once would all be here
            with open(path, "xb") as handle:  # a second fetch of the same file fails
                torch.save(torch.arange(12.0), handle)
        self.data = torch.load(path)
        with open(os.path.join(root, "builds.txt"), "a") as log:
            log.write(f"end {mgpu_runtime.rank()}\n")


directory = sys.argv[1]
mgpu_runtime.setup()
dataset = mgpu_runtime.main_process_first(Downloaded, directory, download=True)
assert dataset.data.sum().item() == 66.0
torch.set_default_dtype(torch.float64)
torch.manual_seed(0)
x, y = torch.randn(31, 4), torch.randn(31, 2)
model = mgpu_runtime.DistributedDataParallel(nn.Linear(4, 2))
loader = mgpu_runtime.distribute_loader(DataLoader(TensorDataset(x, y), batch_size=7))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
logger = mgpu_runtime.main_process_only(Logger, os.path.join(directory, "log.txt"))
for step, (inputs, targets) in enumerate(loader):
    output = model(inputs)
    loss = ((output - targets) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    said = mgpu_runtime.on_main_process(save_outputs, output, os.path.join(directory, f"outputs_{step}.pt"))
    assert said == ("saved" if mgpu_runtime.is_main_process() else None)
    mgpu_runtime.save(output.detach(), os.path.join(directory, f"saved_{step}.pt"))  # pickled whole, once
    logger.write(f"step {step} loss {loss.item():.12f} rows {len(output)}")
    with mgpu_runtime.main_process_only(open, os.path.join(directory, f"summary_{step}.txt"), "x") as handle:
        handle.write(f"{output.sum().item():.12f}\n")
    with open(os.path.join(directory, f"summary_{step}.txt")) as handle:  # every process reads it back
        read_back = handle.read().strip()
    print(f"step {step} read back {read_back}")
torch.save(model.module.state_dict(), os.path.join(directory, f"model_{mgpu_runtime.rank()}.state"))
