"""Module-level code that asks the runtime before any setup(): a run directory named by the clock, made on the
main process (as the codemod writes darts's), and readings of a clock skewed per rank.

``python module_level_main.py OUT`` with MGPU_NPROC=2: the first runtime call relaunches the script under
torchrun, so the process started plainly makes nothing; rank 0 makes the one run directory. Each rank writes
``OUT/rank<r>.json``: the readings it got from ``main_process_value``, and what it raised for a value that does
not pickle."""

import json
import os
import sys
import time

import mgpu_runtime

out = sys.argv[1]


def skewed_clock(label):
    """A stand-in for a clock that reads a different second on each process: its rank in the name."""
    return f"{label}-{os.environ.get('RANK', 'plain')}"


if mgpu_runtime.is_main_process():
    os.makedirs(os.path.join(out, f"run-{time.time_ns()}"))
mgpu_runtime.barrier()

readings = [mgpu_runtime.main_process_value(skewed_clock, "first")]
if mgpu_runtime.is_main_process():  # a call the main process alone makes pairs with nothing
    readings.append(mgpu_runtime.main_process_value(skewed_clock, "main only"))
for _ in range(2):
    readings.append(mgpu_runtime.main_process_value(skewed_clock, "loop"))
try:  # a value that does not pickle: every process hears why at once, none waits out MGPU_TIMEOUT
    mgpu_runtime.main_process_value(lambda: (lambda: None))
except Exception as error:
    readings.append(f"{type(error).__name__}: {error}")

if __name__ == "__main__":
    mgpu_runtime.setup()
    with open(os.path.join(out, f"rank{mgpu_runtime.rank()}.json"), "w") as file:
        json.dump({"world": mgpu_runtime.world_size(), "readings": readings}, file)
