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
import os
import random
import statistics
import subprocess
import sys
import time

WORKER = "--worker"


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

    for _ in range(steps):  # warm-up
        step()
    timings: dict[str, list[float]] = {"on": [], "off": []}
    # Each pair of blocks in a random order (the same on every rank): a fixed order lines one side up with
    # periodic work (the heartbeat, the collector), which an A/A run (--same) showed to be worth 5%.
    order = random.Random(0)
    sides = [side for _ in range(blocks) for side in order.sample(["on", "off"], 2)]
    for side in sides:
        if side == "on" or same:
            os.environ.pop("MGPU_LOCKSTEP", None)
        else:
            os.environ["MGPU_LOCKSTEP"] = "0"
        mgpu_runtime.barrier()
        started = time.perf_counter()
        for _ in range(steps):
            step()
        timings[side].append((time.perf_counter() - started) / steps)
    if mgpu_runtime.is_main_process():
        on, off = statistics.median(timings["on"]), statistics.median(timings["off"])
        label = "A/A (both sides on)" if same else "lockstep on / off"
        print(f"{label}, step time, median of {blocks} blocks of {steps} steps: {on * 1e3:.3f} ms / "
              f"{off * 1e3:.3f} ms, difference {100 * (on - off) / off:+.2f}%")


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
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={arguments.processes}",
        __file__, WORKER, "--blocks", str(arguments.blocks), "--steps", str(arguments.steps),
        *(["--same"] if arguments.same else []),
    ]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    environment.pop("MGPU_LOCKSTEP", None)
    subprocess.run(command, env=environment, check=True, timeout=1800)


if __name__ == "__main__":
    main()
