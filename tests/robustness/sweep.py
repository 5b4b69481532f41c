"""Run the tool over real Python found on any machine: the standard library and the installed site-packages.

Three sweeps, each for one target:

- ``sweep_tree``: copies files into a tree and runs the command line on it as a user would, twice. No file
  may crash the tool (MGP003); a file the tool says nothing about stays byte-identical; a rewritten file
  compiles; the second run finds nothing left to change.
- ``sweep_injected``: real files with DataParallel sites added (at the end of the module and as the first
  statement of the first function), so the rules meet real code around real sites. No crash; the output
  compiles; a second pass changes nothing; every DataParallel call left in the output has a review code
  (or a ``# noqa``). It parses every file, so it takes an even spread of the corpus.
- ``sweep_near_misses``: files that spell a DataParallel-like name the pre-filter skips
  (``DistributedDataParallel``, ``FullyShardedDataParallel`` ...), run through the pipeline directly:
  the rules must find nothing there either, or the pre-filter would be hiding sites.

``python -m tests.robustness.sweep [--full]`` prints the counts recorded in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from mgpu_migrate.analysis import FileAnalysis
from mgpu_migrate.analysis.names import DATA_PARALLEL, DATA_PARALLEL_FUNCTION
from mgpu_migrate.diagnostics import PARSE_ERROR, REVIEW_PREFIXES
from mgpu_migrate.engine import might_need_migration, migrate_source
from mgpu_migrate.files import source_file
from mgpu_migrate.options import TARGETS
from mgpu_migrate.pipeline import run_pipeline
from tests.cli_helpers import command

# What the pre-filter's names look like anywhere, not only at the start of a name.
_LOOSE_HINT = re.compile(rb"DataParallel|data_parallel|apex")
_LINES = re.compile(r"[^\r\n]*(?:\r\n?|\n)|[^\r\n]+\Z")
_DIAGNOSTIC = re.compile(r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<code>MGP\d{3}) ", re.MULTILINE)
_SUMMARY = re.compile(r"(?P<changed>\d+) files? (?:would be )?migrated to \w+, \d+ unchanged, \d+ failed")


@dataclass
class Tally:
    """What one sweep saw. ``problems`` must stay empty; parse errors are the corpus's own invalid files."""

    sweep: str
    target: str
    files: int = 0
    candidates: int = 0
    sites: int = 0
    rewrites: int = 0
    review: int = 0
    parse_errors: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for name in ("files", "candidates", "sites", "rewrites", "review", "parse_errors"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.problems += other.problems

    def row(self) -> str:
        return (
            f"| {self.sweep} | {self.target} | {self.files} | {self.candidates} | {self.sites} | {self.rewrites} "
            f"| {self.review} | {self.parse_errors} | {len(self.problems)} |"
        )


TABLE_HEADER = (
    "| sweep | target | files | reached the parser | sites | rewrites | left for review | "
    "invalid files (MGP002) | failures |\n|---|---|---|---|---|---|---|---|---|"
)


# -- the corpus ---------------------------------------------------------------------------------------
def corpus_roots() -> dict[str, Path]:
    paths = sysconfig.get_paths()
    return {"stdlib": Path(paths["stdlib"]), "purelib": Path(paths["purelib"])}


def corpus_files() -> list[tuple[str, Path]]:
    """Every ``*.py`` regular file of the standard library and site-packages, as (tree-relative name, path)."""
    found = []
    roots = corpus_roots()
    for label, root in roots.items():
        # site-packages lives inside the standard library's directory: walk it once, as itself.
        nested = {str(other) for other in roots.values() if root in other.parents}
        for directory, subdirectories, names in os.walk(root):
            subdirectories[:] = sorted(d for d in subdirectories if os.path.join(directory, d) not in nested)
            for name in sorted(names):
                path = os.path.join(directory, name)
                if name.endswith(".py") and not os.path.islink(path):
                    found.append((f"{label}/{os.path.relpath(path, root)}", Path(path)))
    return sorted(found)


def _data(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def candidates(corpus: list[tuple[str, Path]]) -> list[tuple[str, Path]]:
    """The files that pass the pre-filter (torch's own DataParallel files among them)."""
    return [item for item in corpus if might_need_migration(_data(item[1]))]


def quick_slice(corpus: list[tuple[str, Path]], others: int = 250) -> list[tuple[str, Path]]:
    """Every file that passes the pre-filter plus an even spread of the rest."""
    passing = candidates(corpus)
    rest = [item for item in corpus if item not in passing]
    stride = max(1, len(rest) // others)
    return sorted(passing + rest[::stride][:others])


def near_misses(corpus: list[tuple[str, Path]], count: int | None = None) -> list[tuple[str, Path]]:
    """Files that spell a site's name inside a longer one, which the pre-filter skips; the ``count``
    smallest when given."""
    found = [item for item in corpus if _LOOSE_HINT.search(data := _data(item[1])) and not might_need_migration(data)]
    return found if count is None else sorted(found, key=lambda item: len(_data(item[1])))[:count]


def decoded(path: Path) -> str | None:
    """The file's text when CPython accepts it as source; None for the corpus's invalid files."""
    try:
        text = source_file(str(path), path.read_bytes()).text
        compile(text, str(path), "exec", dont_inherit=True)
        return text
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, LookupError, RecursionError, MemoryError):
        return None


# -- sweep 1: the command line over a tree -------------------------------------------------------------
def _run_cli(*args: str) -> tuple[int, str]:
    result = subprocess.run([*command(), *args], capture_output=True, text=True, timeout=3600, check=False)
    return result.returncode, result.stderr


def sweep_tree(files: list[tuple[str, Path]], target: str, workdir: Path, jobs: int = 2) -> Tally:
    tally = Tally("tree (command line, in place, twice)", target, files=len(files))
    root = workdir / f"tree-{target}"
    for name, source in files:
        destination = root / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, destination)
    tally.candidates = sum(might_need_migration(_data(source)) for _, source in files)

    returncode, stderr = _run_cli("--to", target, "--jobs", str(jobs), str(root))
    by_path: dict[str, Counter] = {}
    for match in _DIAGNOSTIC.finditer(stderr):
        by_path.setdefault(os.path.relpath(match["path"], root), Counter())[match["code"]] += 1
    codes = sum(by_path.values(), Counter())
    tally.rewrites = sum(count for code, count in codes.items() if code.startswith("MGP1"))
    tally.review = sum(count for code, count in codes.items() if code.startswith(REVIEW_PREFIXES))
    tally.sites = tally.rewrites + tally.review
    tally.parse_errors = codes["MGP002"]
    if returncode not in (0, 2) or (returncode == 2) != bool(codes["MGP001"] + codes["MGP002"] + codes["MGP003"]):
        tally.problems.append(f"first run exited {returncode}:\n{stderr[-2000:]}")
    for name, source in files:
        after = (root / name).read_bytes()
        said = by_path.get(name, Counter())
        if said["MGP003"]:
            tally.problems.append(f"{source}: internal error (MGP003)")
        if after == source.read_bytes():
            continue
        if not any(code.startswith("MGP1") for code in said):
            tally.problems.append(f"{source}: changed without a rewrite diagnostic")
        try:
            compile(after, name, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as error:
            tally.problems.append(f"{source}: the rewritten file does not compile: {error}")

    returncode, stderr = _run_cli("--check", "--to", target, "--jobs", str(jobs), str(root))
    summary = _SUMMARY.search(stderr)
    if summary is None or summary["changed"] != "0" or returncode not in (0, 2):
        tally.problems.append(f"second run is not a no-op (exit {returncode}):\n{stderr[-2000:]}")
    shutil.rmtree(root)
    return tally


# -- sweep 2: real files with sites added ----------------------------------------------------------------
INJECTED_IMPORT = "import torch.nn as _mgpu_nn"
INJECTED_SITE = "_mgpu_model = _mgpu_nn.DataParallel(_mgpu_model)"


def inject_sites(text: str) -> tuple[str, int] | None:
    """``text`` with DataParallel sites added, and how many; None when no place for them was found."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    # Python's line breaks only (str.splitlines also breaks at form feeds), to match ast's line numbers.
    lines = _LINES.findall(text)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    sites = 1
    function = next((node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if function is not None and function.body[0].lineno > function.lineno:
        first = function.body[0]
        line = lines[first.lineno - 1]
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        if first.col_offset == len(indent):  # the statement starts its line
            lines.insert(first.lineno - 1, f"{indent}{INJECTED_SITE}{newline}")
            sites += 1
    injected = "".join(lines)
    if injected and not injected.endswith(("\n", "\r")):
        injected += newline
    injected += f"{newline}{INJECTED_IMPORT}{newline}{INJECTED_SITE}{newline}"
    try:
        compile(injected, "<injected>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return injected, sites


def torch_calls_left(source: str) -> int:
    """DataParallel calls (class or function) that still resolve to torch's in ``source``."""
    analysis = FileAnalysis("<output>", source, cst.parse_module(source))
    return len(analysis.calls_to(DATA_PARALLEL)) + len(analysis.calls_to(DATA_PARALLEL_FUNCTION))


def round_trips(source: str) -> bool:
    """Whether LibCST reproduces ``source`` exactly (it drops some trailing lines after whitespace-only ones)."""
    return cst.parse_module(source).code == source


def check_migration(source: str, target: str, path: str, sites: int, silenced: int = 0) -> Tally:
    """Migrate ``source`` (which compiles and holds ``sites`` DataParallel sites, ``silenced`` of them under
    ``# noqa``) and check what a rewrite must never break."""
    tally = Tally("", target, files=1, candidates=1, sites=sites)
    result = migrate_source(source, target, path)
    if result.error is not None:
        if result.error.code == PARSE_ERROR and not round_trips(source):
            tally.parse_errors += 1  # refused rather than lose the lines LibCST cannot reproduce
        else:
            tally.problems.append(f"{path}: {result.error.code} {result.error.message}")
        return tally
    tally.rewrites = sum(d.is_rewrite for d in result.diagnostics)
    tally.review = sum(d.needs_review for d in result.diagnostics)
    try:
        compile(result.output, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        tally.problems.append(f"{path}: output does not compile: {error}")
        return tally
    again = migrate_source(result.output, target, path)
    if again.error is not None or again.output != result.output:
        reason = again.error.message if again.error else "a second run changed the output again"
        tally.problems.append(f"{path}: not idempotent: {reason}")
    left = torch_calls_left(result.output)
    if left > tally.review + silenced:
        tally.problems.append(
            f"{path}: {left} DataParallel call(s) left, but only {tally.review} review diagnostic(s) "
            f"and {silenced} silenced site(s)"
        )
    return tally


def _check_injected(item: tuple[str, Path, str]) -> Tally:
    name, path, target = item
    text = decoded(path)
    injected = inject_sites(text) if text is not None else None
    if injected is None:
        return Tally("", target)
    return check_migration(injected[0], target, name, injected[1])


def sweep_injected(files: list[tuple[str, Path]], target: str, jobs: int = 2) -> Tally:
    tally = Tally("real files + injected sites (engine)", target)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for result in pool.map(_check_injected, [(name, path, target) for name, path in files], chunksize=4):
            tally.add(result)
    return tally


# -- sweep 3: the pre-filter hides nothing ---------------------------------------------------------------
def _check_near_miss(item: tuple[str, Path, str]) -> Tally:
    name, path, target = item
    text = decoded(path)
    if text is None:
        return Tally("", target, files=1, parse_errors=1)
    result = run_pipeline(text, target, name)
    tally = Tally("", target, files=1, candidates=1, sites=len(result.diagnostics))
    if result.error is not None or result.diagnostics or result.output != text:
        found = result.error or (result.diagnostics[0] if result.diagnostics else "a change")
        tally.problems.append(f"{path}: the pre-filter skips this file, yet the rules find {found}")
    return tally


def sweep_near_misses(files: list[tuple[str, Path]], target: str, jobs: int = 2) -> Tally:
    tally = Tally("pre-filter near misses (pipeline, no pre-filter)", target)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for result in pool.map(_check_near_miss, [(name, path, target) for name, path in files], chunksize=2):
            tally.add(result)
    return tally


# How much the quick slice (CI) and the full sweep parse: every file of the corpus through the whole
# pipeline would take hours on two cores, so the injected sweep takes an even spread.
QUICK_INJECTED, FULL_INJECTED = 40, 1000
QUICK_NEAR_MISSES = 12


def spread(files: list[tuple[str, Path]], count: int, max_bytes: int) -> list[tuple[str, Path]]:
    """An even spread of ``count`` files of at most ``max_bytes``, for the sweeps that parse every file."""
    small = [item for item in files if 0 < len(_data(item[1])) <= max_bytes]
    return small[:: max(1, len(small) // count)][:count]


def main(argv: list[str]) -> int:
    import tempfile
    import time

    full = "--full" in argv
    jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    corpus = corpus_files()
    files = corpus if full else quick_slice(corpus)
    injected = spread(corpus, FULL_INJECTED, 50_000) if full else spread(files, QUICK_INJECTED, 8000)
    print(f"corpus: {len(corpus)} files; {'full sweep' if full else 'quick slice'}", flush=True)
    print(TABLE_HEADER)
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as workdir:
        for target in TARGETS:
            for run in (
                lambda: sweep_tree(files, target, Path(workdir), jobs),
                lambda: sweep_injected(injected, target, jobs),
                lambda: sweep_near_misses(near_misses(corpus, None if full else QUICK_NEAR_MISSES), target, jobs),
            ):
                start = time.perf_counter()
                tally = run()
                print(f"{tally.row()} {time.perf_counter() - start:.0f} s", flush=True)
                problems += tally.problems
    print("\n".join(problems) or "no failures")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
