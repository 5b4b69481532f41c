"""The lockstep check's cost on a CPU training step (issue 14): interleaved blocks with it on and off.

    python benchmarks/bench_lockstep.py [--processes 2] [--blocks 20] [--steps 30] [--same]

Starts one torchrun job (gloo, CPU) training an MLP with ``mgpu_runtime.DistributedDataParallel`` and
``distribute_loader``-style even shares. The job alternates blocks of steps with ``MGPU_LOCKSTEP`` unset
and set to 0 (the check reads it at every reduction; every rank switches at the same step), each pair in a
random order, so both sides see the same machine load; it prints the median step time of each side and the
difference. ``--same`` keeps the check on in both sides: the difference it prints is the benchmark's own bias. A step is a
forward, a backward (the gradient reduction, where the check rides) and an SGD step.
"""

from __future__ import annotations

import argparse

from interleaved import WORKER, launch, run_blocks


def worker(blocks: int, steps: int, same: bool) -> None:
    import torch
    from torch import nn

    import mgpu_runtime

    mgpu_runtime.setup()
    torch.manual_seed(0)
    model = mgpu_runtime.DistributedDataParallel(
        nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    criterion = nn.CrossEntropyLoss()

    def step() -> None:
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()

    label = "A/A (both sides on)" if same else "lockstep on / off"
    run_blocks(step, "MGPU_LOCKSTEP", blocks, steps, same, label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--same", action="store_true", help="A/A run: the check on in both sides (the bias)")
    parser.add_argument(WORKER, action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        worker(arguments.blocks, arguments.steps, arguments.same)
        return
    worker_arguments = ["--blocks", str(arguments.blocks), "--steps", str(arguments.steps)]
    launch(__file__, arguments.processes, [*worker_arguments, *(["--same"] if arguments.same else [])], "MGPU_LOCKSTEP")


if __name__ == "__main__":
    main()
