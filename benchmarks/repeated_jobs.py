"""Run the same short 3-process torchrun job many times and count the runs that did not end well.

    python benchmarks/repeated_jobs.py 50        # under load: stress-ng --cpu 2 beside it

A run ends well when torchrun exits 0, every rank prints "done", and no thread of the runtime is alive after
its teardown (tests/runtime/distributed_scripts/short_job.py). Prints one line per failed run and a summary.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

SCRIPT = pathlib.Path(__file__).parents[1] / "tests" / "runtime" / "distributed_scripts" / "short_job.py"


def one_run(checkpoint: str) -> str | None:
    """None for a run that ended well, else what went wrong."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("MGPU_", "SLURM_"))}
    environment.update(MGPU_LOG="all", OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3", str(SCRIPT), checkpoint]
    try:
        result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        return "still running after 300 s"
    output = result.stdout + result.stderr
    if result.returncode != 0:
        return f"exit {result.returncode}: {output.strip().splitlines()[-1] if output.strip() else ''}"
    # Unanchored: with MGPU_LOG=all the ranks' lines may run into each other (a print is two writes).
    if sorted(re.findall(r"done (\d)", output)) != ["0", "1", "2"]:
        return "not every rank printed done"
    if sorted(re.findall(r"threads left on rank (\d): \[\]", output)) != ["0", "1", "2"]:
        return "a thread was left: " + "; ".join(re.findall(r"threads left on rank \d: \[[^]]*\]", output))
    return None


def main(runs: int) -> None:
    failures = 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as directory:
        for index in range(runs):
            failure = one_run(os.path.join(directory, "ckpt.pt"))
            if failure is not None:
                failures += 1
                print(f"run {index + 1}: {failure}", flush=True)
    print(f"{runs} runs of 3 processes, {failures} did not end well, {time.monotonic() - started:.0f} s in all")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
