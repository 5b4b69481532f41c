"""A small training loop where one rank misbehaves at step 3, by mode:

    python faults.py exit_early      rank 1 calls sys.exit(0) (sys.exit(int(CODE)) with a second argument)
    python faults.py skip_backward   rank 1 skips the backward of step 3 (`continue`), then goes on
    python faults.py stall           rank 1 sleeps 60 s before its backward (the others wait in the reduction)
    python faults.py stall_barrier   rank 1 sleeps 60 s before a barrier (the others wait in the barrier)
    python faults.py rank0_loss      batches of the distributed loader; rank 0 alone computes an extra loss at step 3
    python faults.py no_backward     rank 1 makes no backward from step 3 on, 5 s a step, then all save (a barrier)
    python faults.py skip_last       rank 1 skips the backward of the last step (7), then all save (a barrier)
    python faults.py healthy         nobody misbehaves

Prints "started" (rank 0, at the step where rank 1 misbehaves) and "done <rank>" when a rank finishes its loop.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import mgpu_runtime


def main(mode: str) -> None:
    mgpu_runtime.setup()
    torch.manual_seed(0)
    model = mgpu_runtime.DistributedDataParallel(nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if mode == "rank0_loss":
        _loss_on_rank_0()
        return
    misbehaving_step = 7 if mode == "skip_last" else 3
    for step in range(8):
        x = torch.randn(6, 4)
        optimizer.zero_grad()
        loss = model(x).square().mean()
        if step == misbehaving_step and mgpu_runtime.rank() == 0:
            print("started", flush=True)
        if mgpu_runtime.rank() == 1 and (step == misbehaving_step or mode == "no_backward" and step > misbehaving_step):
            if mode == "exit_early":
                sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
            if mode in ("skip_backward", "skip_last"):
                continue
            if mode == "no_backward":
                time.sleep(5)
                continue
            if mode.startswith("stall"):
                time.sleep(60)
        if mode == "stall_barrier" and step == 3:
            mgpu_runtime.barrier()
        loss.backward()
        optimizer.step()
    if mode in ("no_backward", "skip_last"):
        mgpu_runtime.save(model.module.state_dict(), os.devnull)
    print("done", mgpu_runtime.rank(), flush=True)


def _loss_on_rank_0() -> None:
    # Sizes for which gloo does not notice the mismatch itself (it aborts on some): the ranks would wait.
    torch.set_default_dtype(torch.float64)
    model = mgpu_runtime.DistributedDataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(48, 4), torch.randn(48, 1))
    for step, (x, y) in enumerate(mgpu_runtime.distribute_loader(DataLoader(data, batch_size=6))):
        optimizer.zero_grad()
        output = model(x)
        loss = nn.functional.mse_loss(output, y)
        if step == 3 and mgpu_runtime.rank() == 0:
            print("started", flush=True)
            loss = loss + 0.1 * nn.functional.l1_loss(output, y)  # a sum over the ranks, on rank 0 only
        loss.backward()
        optimizer.step()
    print("done", mgpu_runtime.rank(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
