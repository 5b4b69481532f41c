"""Where the time of one migration goes, in multiples of the bare parse of the same files.

Runs each file through the pipeline once for the total, then again piece by piece: the parse, each
analysis of ``FileAnalysis`` (its cached properties, first use, in the order they are declared, so a
property's time excludes those declared before it), each rule's ``apply``; what remains of the total is
applying the edits, the imports and the output checks.

    python benchmarks/bench_passes.py [--to ddp] [FILE_OR_DIR ...]   (default: the benchmark's 100 scripts)
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import libcst as cst

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_tree import build_dp_scripts  # noqa: E402

from mgpu_migrate.analysis import FileAnalysis  # noqa: E402
from mgpu_migrate.edits import Edits  # noqa: E402
from mgpu_migrate.pipeline import run_pipeline  # noqa: E402
from mgpu_migrate.program import decide  # noqa: E402
from mgpu_migrate.rules import rules_for  # noqa: E402
from mgpu_migrate.rules.base import CHECKS, PROGRAM, WRAPS  # noqa: E402


def analyses() -> list[str]:
    classes = reversed(FileAnalysis.__mro__)  # the shared index (ParsedFile) first, then what is built on it
    return [name for cls in classes for name, value in vars(cls).items() if isinstance(value, functools.cached_property)]


def measure(sources: list[str], target: str) -> dict[str, float]:
    spent: dict[str, float] = defaultdict(float)

    def clock(name, work):
        start = time.perf_counter()
        result = work()
        spent[name] += time.perf_counter() - start
        return result

    for source in sources:
        clock("total (run_pipeline)", lambda: run_pipeline(source, target, "bench.py"))
        module = clock("parse", lambda: cst.parse_module(source))
        analysis = FileAnalysis("bench.py", source, module)
        for name in analyses():
            clock(f"analysis: {name}", lambda: getattr(analysis, name))
        edits = Edits("bench.py")
        for rule in rules_for(target, WRAPS):
            clock(f"rule: {rule.__name__}", lambda: rule(target, analysis, edits).apply())
        program = clock("program verdict", lambda: decide(analysis, edits.replacements))
        for phase in (PROGRAM, CHECKS):
            rewritten = frozenset(edits.replacements)
            for rule in rules_for(target, phase):
                clock(f"rule: {rule.__name__}", lambda: rule(target, analysis, edits, program=program, rewritten=rewritten).apply())
        clock("diagnostics' lines (every one: no veto drops any here)", lambda: edits.place(analysis.position))
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--to", dest="target", default="ddp")
    args = parser.parse_args()
    if args.paths:
        files = [p for path in args.paths for p in (sorted(path.rglob("*.py")) if path.is_dir() else [path])]
    else:
        files = build_dp_scripts(Path(tempfile.mkdtemp(prefix="mgpu-passes-")))
    sources = [path.read_text() for path in files]
    measure(sources[:5], args.target)  # warm up imports and caches
    spent = measure(sources, args.target)
    parse = spent["parse"]
    pieces = sum(value for name, value in spent.items() if name.startswith(("parse", "analysis", "rule", "program", "diagnostics")))
    spent["the rest: edits, imports, checks"] = spent["total (run_pipeline)"] - pieces
    print(f"{len(sources)} files, --to {args.target}; parse: {parse:.3f} s\n")
    print("| piece | seconds | x parse |\n|---|---|---|")
    for name, value in sorted(spent.items(), key=lambda item: -item[1]):
        if value >= 0.005 * parse:
            print(f"| {name} | {value:.3f} | {value / parse:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
