"""Interleaved on/off blocks inside one torchrun job, shared by the runtime's step benchmarks.

Each benchmark alternates blocks of training steps with an environment switch unset ("on") and set to 0
("off"), read by the runtime while it runs; every rank switches at the same step. Each pair of blocks runs
in a random order (the same on every rank): a fixed order lines one side up with periodic work (the
heartbeat, the collector), which an A/A run (``--same``, both sides on) showed to be worth 5%.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

WORKER = "--worker"


def run_blocks(step: Callable[[], None], variable: str, blocks: int, steps: int, same: bool, label: str) -> None:
    """Time ``blocks`` pairs of ``steps``-step blocks with ``variable`` unset and 0; rank 0 prints the medians."""
    import mgpu_runtime

    for _ in range(steps):  # warm-up
        step()
    timings: dict[str, list[float]] = {"on": [], "off": []}
    order = random.Random(0)
    sides = [side for _ in range(blocks) for side in order.sample(["on", "off"], 2)]
    for side in sides:
        if side == "on" or same:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = "0"
        mgpu_runtime.barrier()
        started = time.perf_counter()
        for _ in range(steps):
            step()
        timings[side].append((time.perf_counter() - started) / steps)
    if mgpu_runtime.is_main_process():
        on, off = statistics.median(timings["on"]), statistics.median(timings["off"])
        print(f"{label}, step time, median of {blocks} blocks of {steps} steps: {on * 1e3:.3f} ms / "
              f"{off * 1e3:.3f} ms, difference {100 * (on - off) / off:+.2f}%")


def launch(script: str, processes: int, worker_arguments: Sequence[str], variable: str) -> None:
    """Run ``script`` as the worker of a torchrun job of ``processes`` CPU processes, ``variable`` unset."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
        script, WORKER, *worker_arguments,
    ]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    environment.pop(variable, None)
    subprocess.run(command, env=environment, check=True, timeout=1800)
