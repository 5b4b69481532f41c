"""CPU time of ``mgpu-migrate --check --to ddp -q -j 1 TREE`` for two checkouts of the tool, side by side.

For a change to what every file costs (the screen that decides which files are parsed: ``report.screen``,
``engine.might_start_a_program``): each checkout's tool runs over the same trees, interleaved, ``--runs``
times, as a fresh process; the CPU seconds of the process and its children are reported, their medians and
the ratio. A checkout is a directory holding ``mgpu_migrate/`` (a ``git worktree`` of an older commit).

    git worktree add --detach /tmp/base BASE_COMMIT
    python benchmarks/screen_cost.py --base /tmp/base --tree TREE [--tree TREE ...] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(checkout: Path, tree: str) -> float:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(checkout / "runtime")])}
    before = os.times()
    subprocess.run(
        [sys.executable, "-m", "mgpu_migrate", "--check", "--to", "ddp", "-q", "-j", "1", tree],
        env=environment, capture_output=True, cwd=tree,
    )
    after = os.times()
    return (after.children_user + after.children_system) - (before.children_user + before.children_system)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path, help="the other checkout (a worktree of an older commit)")
    parser.add_argument("--tree", required=True, action="append", help="a tree to check (repeatable)")
    parser.add_argument("--runs", type=int, default=5)
    arguments = parser.parse_args()
    for tree in arguments.tree:
        times: dict[str, list[float]] = {"base": [], "this": []}
        for _ in range(arguments.runs):
            for name, checkout in (("base", arguments.base), ("this", ROOT)):
                times[name].append(cpu_seconds(checkout, tree))
        base, this = statistics.median(times["base"]), statistics.median(times["this"])
        print(f"{tree}: base {base:.2f} s, this {this:.2f} s of CPU (medians of {arguments.runs}): {this / base:.2f}x", flush=True)


if __name__ == "__main__":
    main()
