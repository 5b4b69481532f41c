"""A loop whose step sits in `try: ... except Exception: continue`, after mgpu_runtime.fail_together(); at step 2 a
replica fails, by mode:

    python failing_forward.py one        rank 1's forward raises ValueError
    python failing_forward.py both       rank 0's forward raises KeyError, rank 1's ValueError
    python failing_forward.py local      rank 1 raises an error class defined in a function (no pickle can load it)
    python failing_forward.py backward   rank 1's backward raises (not covered: the job stops)

Each rank prints "rank R step S: ok" or "rank R step S: skipped <type>: <first line>", then "rank R weights <sum>".
"""

from __future__ import annotations

import sys

import torch
from torch import nn

import mgpu_runtime


class Failing(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.mode = mode
        self.armed = False

    def forward(self, x):
        rank = mgpu_runtime.rank()
        if self.armed and self.mode == "both" and rank == 0:
            raise KeyError("rank 0's own")
        if self.armed and self.mode in ("one", "both") and rank == 1:
            raise ValueError("an image without boxes")
        if self.armed and self.mode == "local" and rank == 1:

            class LocalError(Exception):
                pass

            raise LocalError("made in a function")
        out = self.linear(x)
        if self.armed and self.mode == "backward" and rank == 1:
            out.register_hook(_raise)
        return out


def _raise(grad):
    raise RuntimeError("out of memory in the backward pass")


def main(mode: str) -> None:
    mgpu_runtime.setup()
    torch.manual_seed(0)
    inner = Failing(mode)
    model = mgpu_runtime.DistributedDataParallel(inner)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rank = mgpu_runtime.rank()
    for step in range(4):
        try:
            mgpu_runtime.fail_together()
            inner.armed = step == 2
            x = torch.arange(24.0).reshape(6, 4) / (step + 1)
            optimizer.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            optimizer.step()
            print(f"rank {rank} step {step}: ok", flush=True)
        except Exception as error:
            first = str(error).splitlines()[0]
            print(f"rank {rank} step {step}: skipped {type(error).__name__}: {first}", flush=True)
            continue
    total = sum(parameter.detach().double().sum().item() for parameter in model.parameters())
    print(f"rank {rank} weights {total:.12f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
