"""``mgpu-migrate verify`` over every runnable fixture, as a user runs it, on both targets and each W.

    python benchmarks/verify_fixtures.py [--procs 2 3] [--to ddp balanced] [--steps 0] [--jobs 2] [NAME ...]

The runnable fixtures are the originals of ``fixtures/scripts/`` (``NAME.py``) and the fixture projects'
entry scripts that train on their own (``PROJECTS``). One ``verify`` command per target and W takes every
script without arguments of its own (each run as it runs alone), another each script with them. Prints a Markdown
table: script, target, W, the largest difference of the wrapped models' weights and buffers, and the verdict
(verified, not verified, left by the tool, or the run's error), then the wall time of the sweep.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# The projects' entry scripts that run as they are, with the arguments they are verified with: own_path's
# plain start runs its own distributed path with the original's batch over the processes (MGP139), which
# verify gives it explicitly.
PROJECTS = {
    "projects/utils_writers/train.py": (),
    "projects/own_path/train.py": ("--train_batch_size", "12"),
}
_LARGEST = re.compile(r"^largest difference: (\S+)")
CLI = [shutil.which("mgpu-migrate")] if shutil.which("mgpu-migrate") else [sys.executable, "-m", "mgpu_migrate"]


def runnable() -> dict[str, tuple[str, ...]]:
    """Every runnable fixture script (relative to fixtures/) with its arguments."""
    scripts = {f"scripts/{path.name}": () for path in sorted((FIXTURES / "scripts").glob("*.py")) if "." not in path.stem}
    return {**scripts, **PROJECTS}


def verify(scripts: list[str], args: tuple[str, ...], target: str, procs: int, steps: int) -> dict[str, tuple[str, str]]:
    """One ``verify`` of several scripts (relative to fixtures/, run from there): each one's largest difference
    and verdict, read from its section of the report."""
    command = [*CLI, "verify", *scripts, "--to", target, "--procs", str(procs), "--steps", str(steps)]
    result = subprocess.run([*command, *(["--", *args] if args else [])], cwd=FIXTURES, capture_output=True, text=True)
    if len(scripts) == 1 and result.returncode == 2:  # one script's failure ends the command with its message
        errors = [line for line in result.stderr.splitlines() if line.startswith("mgpu-migrate verify: ")]
        return {scripts[0]: ("-", errors[0].removeprefix("mgpu-migrate verify: ") if errors else result.stderr[-300:])}
    found, current = {}, scripts[0]
    for line in result.stdout.splitlines():
        if line.endswith(": no migration to verify"):
            found[line.split(": ")[0]] = ("-", "left by the tool")
        elif line.endswith(":") and line[:-1] in scripts:
            current = line[:-1]
        elif (largest := _LARGEST.match(line)) is not None:
            found[current] = (largest.group(1), "")
        elif line.startswith(("verified", "not verified", "error: ")):
            found[current] = (found.get(current, ("-", ""))[0], line.split(":")[0] if line.startswith(("verified", "not")) else line)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--to", nargs="+", default=["ddp", "balanced"])
    parser.add_argument("--steps", type=int, default=0, help="verify's --steps (0: each script to its end)")
    parser.add_argument("--jobs", type=int, default=2, help="verify runs at once")
    parser.add_argument("names", nargs="*", help="only these scripts (their stems)")
    options = parser.parse_args()
    scripts = {script: args for script, args in runnable().items() if not options.names or Path(script).stem in options.names}
    # One verify of every script without arguments per target and W, and one of each script with its own.
    groups = [([script for script, args in scripts.items() if not args], ())]
    groups += [([script], args) for script, args in scripts.items() if args]
    calls = [(group, args, target, procs) for target in options.to for procs in options.procs for group, args in groups if group]
    started = time.perf_counter()
    with ThreadPoolExecutor(options.jobs) as pool:
        results = list(pool.map(lambda call: verify(*call, options.steps), calls))
    print("| script | target | W | largest difference | verdict |")
    print("|---|---|---|---|---|")
    for (group, args, target, procs), found in zip(calls, results):
        for script in group:
            largest, verdict = found.get(script, ("-", "no report"))
            shown = f"{script} -- {' '.join(args)}" if args else script
            print(f"| {shown} | {target} | {procs} | {largest} | {verdict} |")
    print(f"\n{len(calls)} verify commands in {time.perf_counter() - started:.0f} s ({options.jobs} at once)")


if __name__ == "__main__":
    main()
