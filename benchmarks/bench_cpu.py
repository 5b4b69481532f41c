"""CPU time (per core: user + sys of the process and its children) and wall time of ``mgpu-migrate --check``
against its anchors, side by side, so that a loaded or many-core machine does not hide the work done.

(b) DataParallel files: ``mgpu-migrate --check --to ddp -q -j 1 DIR`` against one process that imports libcst
    and parses the same files (the floor: what any LibCST codemod pays).
(t) A large real tree: ``mgpu-migrate --check --to ddp -q TREE`` (its default jobs) against ``ruff check``
    of the same tree (the speed anchor every Python developer knows).

Each command is a fresh process, run ``--runs`` times interleaved with its anchor; medians are reported.
The tool's modules are byte-compiled first, as ``pip install`` does (and as any first run does unless
``PYTHONDONTWRITEBYTECODE`` is set, as on the development machine): otherwise every start compiles the
tool's ~90 modules again (0.3 s of CPU), which no installed copy does, while libcst's are compiled already.

    python benchmarks/bench_cpu.py --dp DIR [--dp DIR ...] [--tree DIR ...] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tree import BARE_PARSE, RUFF, tool  # noqa: E402


def measured(command: list[str]) -> tuple[float, float]:
    """(CPU seconds of the command and its children, wall seconds)."""
    before = os.times()
    start = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, check=False)
    wall = time.perf_counter() - start
    after = os.times()
    # 2: a file the tool could not process (reported, the others still checked), which real trees may hold.
    if completed.returncode not in (0, 1, 2):
        raise SystemExit(f"{' '.join(command)} exited {completed.returncode}:\n{completed.stderr.decode()[-2000:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return cpu, wall


def compare(name: str, ours: list[str], anchor_name: str, anchor: list[str], runs: int) -> None:
    measured(ours), measured(anchor)  # warm the file cache
    times: dict[str, list[tuple[float, float]]] = {"ours": [], "anchor": []}
    for _ in range(runs):
        times["ours"].append(measured(ours))
        times["anchor"].append(measured(anchor))
    cpu = {key: statistics.median(t[0] for t in values) for key, values in times.items()}
    wall = {key: statistics.median(t[1] for t in values) for key, values in times.items()}
    print(f"\n{name}")
    print(f"    {'':<34} {'CPU (user+sys)':>15} {'wall':>9}")
    print(f"    {'mgpu-migrate':<34} {cpu['ours']:>13.3f} s {wall['ours']:>7.3f} s")
    print(f"    {anchor_name:<34} {cpu['anchor']:>13.3f} s {wall['anchor']:>7.3f} s")
    print(f"    {'ratio':<34} {cpu['ours'] / cpu['anchor']:>14.2f}x {wall['ours'] / wall['anchor']:>8.2f}x")


def byte_compile() -> None:
    """Write the bytecode of the ``mgpu_migrate`` the tool imports (the one this environment's path finds)."""
    compile_it = "import compileall, os, mgpu_migrate; compileall.compile_dir(os.path.dirname(mgpu_migrate.__file__), quiet=1)"
    subprocess.run([sys.executable, "-c", compile_it], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dp", type=Path, action="append", default=[], help="a folder of DataParallel files")
    parser.add_argument("--tree", type=Path, action="append", default=[], help="a large real source tree")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    byte_compile()
    print(f"cores: {len(os.sched_getaffinity(0))}; load average: {os.getloadavg()[0]:.2f}; runs: {args.runs} (medians)")
    for folder in args.dp:
        files = sum(1 for _ in folder.rglob("*.py"))
        compare(
            f"(b) {folder}: {files} files, --check --to ddp -q -j 1 against a bare parse",
            tool("--check", "--to", "ddp", "-q", "-j", "1", str(folder)),
            "import libcst + parse each file",
            [sys.executable, "-c", BARE_PARSE, str(folder)],
            args.runs,
        )
    for folder in args.tree:
        files = sum(1 for _ in folder.rglob("*.py"))
        compare(
            f"(t) {folder}: {files} files, --check --to ddp -q against ruff check",
            tool("--check", "--to", "ddp", "-q", str(folder)),
            "ruff check (default rules)",
            [*RUFF, str(folder)],
            args.runs,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
