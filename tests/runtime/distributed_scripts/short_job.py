"""A short job that ends well: 3 training steps, a checkpoint, "done <rank>". At the very end (an exit handler
registered before the runtime's, so it runs after the runtime's teardown) it prints the threads still alive
in the process: the runtime's must all have ended by then.

    torchrun --standalone --nproc_per_node=3 short_job.py CHECKPOINT
"""

from __future__ import annotations

import atexit
import sys
import threading

import torch
from torch import nn

import mgpu_runtime


def _threads_left() -> None:
    others = sorted(thread.name for thread in threading.enumerate() if thread is not threading.main_thread())
    print(f"threads left on rank {mgpu_runtime.rank()}: {others}", flush=True)


atexit.register(_threads_left)
mgpu_runtime.setup()
torch.manual_seed(0)
model = mgpu_runtime.DistributedDataParallel(nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    model(torch.randn(6, 4)).square().mean().backward()
    optimizer.step()
mgpu_runtime.save(model.module.state_dict(), sys.argv[1])
print(f"done {mgpu_runtime.rank()}", flush=True)  # one write: print("done", rank) is four, which ranks cut
