"""CPU time (per core: user + sys of the process and its children) and wall time of ``mgpu-migrate --check``
against its anchors, side by side, so that a loaded or many-core machine does not hide the work done.

(b) DataParallel files: ``mgpu-migrate --check --to ddp -q -j 1 DIR`` against one process that imports libcst
    and parses the same files (the floor: what any LibCST codemod pays).
(t) A large real tree: ``mgpu-migrate --check --to ddp -q TREE`` (its default jobs) against ``ruff check``
    of the same tree (the speed anchor every Python developer knows).

Each command is a fresh process, run ``--runs`` times interleaved with its anchor; medians are reported.
``--instructions`` also counts the instructions each (b) command executes, once, under valgrind's cachegrind
(about 60 s for 100 files): on a machine whose speed moves by 20% from one minute to the next (a shared
virtual machine), their ratio is the steady figure; it leaves out what memory costs (the garbage collector's
walks over a large heap cost more time than their instructions say).
The tool's modules are byte-compiled first, as ``pip install`` does (and as any first run does unless
``PYTHONDONTWRITEBYTECODE`` is set, as on the development machine): otherwise every start compiles the
tool's ~90 modules again (0.3 s of CPU), which no installed copy does, while libcst's are compiled already.

    python benchmarks/bench_cpu.py --dp DIR [--dp DIR ...] [--tree DIR ...] [--runs 5] [--instructions]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
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
    if completed.returncode not in (0, 1, 2) or b"Traceback (most recent call last)" in completed.stderr:
        # A traceback: the command failed to start (say, an install that points elsewhere), and timing it
        # would measure nothing.
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


def instructions(command: list[str]) -> int:
    """The instructions ``command`` executes (cachegrind's ``I refs``), its Python followed through its script."""
    executable = os.path.realpath(sys.executable)  # not a shim script that valgrind would measure instead
    # A console script is run by this Python itself, so that valgrind follows Python, not the script's
    # interpreter line (and the path it imports from stays the script's: not the current directory, as -m has).
    arguments = command[1:] if command[0] == sys.executable else command
    completed = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", executable, *arguments],
        capture_output=True,
        check=False,
    )
    found = re.search(rb"I\s+refs:\s+([\d,]+)", completed.stderr)
    if found is None:
        raise SystemExit(f"valgrind gave no count:\n{completed.stderr.decode()[-2000:]}")
    return int(found.group(1).replace(b",", b""))


def count(name: str, ours: list[str], anchor: list[str]) -> None:
    mine, theirs = instructions(ours), instructions(anchor)
    print(f"    {'instructions (one run each)':<34} {mine / 1e9:>11.2f} G  {theirs / 1e9:>6.2f} G   ratio {mine / theirs:.2f}x")


def byte_compile() -> None:
    """Write the bytecode of the ``mgpu_migrate`` the tool imports (the one this environment's path finds)."""
    compile_it = "import compileall, os, mgpu_migrate; compileall.compile_dir(os.path.dirname(mgpu_migrate.__file__), quiet=1)"
    subprocess.run([sys.executable, "-c", compile_it], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dp", type=Path, action="append", default=[], help="a folder of DataParallel files")
    parser.add_argument("--tree", type=Path, action="append", default=[], help="a large real source tree")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--instructions", action="store_true", help="also count (b)'s instructions under valgrind")
    args = parser.parse_args()
    if args.instructions and shutil.which("valgrind") is None:
        parser.error("--instructions needs valgrind")
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
        if args.instructions:
            count(
                folder.name,
                tool("--check", "--to", "ddp", "-q", "-j", "1", str(folder)),
                [sys.executable, "-c", BARE_PARSE, str(folder)],
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
