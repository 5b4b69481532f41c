"""Both targets over every project of the real-project corpus, as a maintainer would first try the tool.

For each project directory of the corpus (``<owner>__<repo>/``, listed in its ``MANIFEST.tsv``) and each
target, the tool runs as ``mgpu-migrate PROJECT --to TARGET --diff`` would (in this process, one file at a
time, nothing written) and this records: the DataParallel sites the manifest lists, the files that hold a
site hint, the files rewritten, the rewrites made (MGP1xx), the sites left for review (MGP2xx, by code), the
files that could not be parsed (MGP002, expected for Python 2 code), the tool errors (MGP003, or an exception
escaping the tool) and the time. The diffs and the diagnostics go to ``--keep DIR`` for review.

The verdicts are a person's (or a reviewing agent's), read from the kept diffs as each project's maintainer
would, and recorded in a verdict file (``--verdicts``, default ``benchmarks/verdicts/after.tsv``): one row a
project and target, with the fingerprint of what was reviewed, the verdict (``merge`` as is, ``edits``: merge
after edits, ``no``: not mergeable, ``left``: the tool leaves the project, or the files that train, for any
reason), the silent changes found (a diff that trains, saves, logs or prints differently with no diagnostic
saying so, found by reading or by running a reduction) and the reason of every verdict but ``merge``. A row
whose fingerprint is not the run's was reviewed on another diff: it counts as *unreviewed* until someone reads
the new one (``--fingerprints`` prints the run's). The totals go against the goal of issue 23.

    python benchmarks/real_projects.py [CORPUS] [--keep DIR] [--json FILE] [--only NAME,...] [--verdicts FILE]

CORPUS defaults to ``../shared/corpus`` relative to the repository. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import ast
import collections
import csv
import hashlib
import json
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mgpu_migrate.diagnostics import INTERNAL_ERROR, PARSE_ERROR
from mgpu_migrate.engine import might_need_migration
from mgpu_migrate.files import discover
from mgpu_migrate.report import CHANGED, process_files
from mgpu_migrate.started import name_roots

TARGETS = ("balanced", "ddp")
VERDICTS = ROOT / "benchmarks" / "verdicts" / "after.tsv"
MERGE, EDITS, NO, LEFT = "merge", "edits", "no", "left"
OUTCOMES = (MERGE, EDITS, NO, LEFT)
# Issue 23's goal, as shares of the projects: (merge as is, merge as is or after edits, left) at least, at least,
# at most; silent changes and tool errors are 0 for every target.
GOALS = {"ddp": (0.40, 0.70, 0.20), "balanced": (0.90, None, 0.10)}


@dataclass
class ProjectRun:
    project: str
    target: str
    manifest_sites: int
    hinted_files: int
    files_rewritten: int = 0
    rewrites: int = 0
    left: dict[str, int] = field(default_factory=dict)
    parse_errors: int = 0
    tool_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    fingerprint: str = ""

    @property
    def left_total(self) -> int:
        return sum(self.left.values())


def manifest(corpus: Path) -> list[dict[str, str]]:
    with open(corpus / "MANIFEST.tsv", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def site_count(dp_sites: str) -> int:
    """``path:line,line; path:line`` -> the number of lines listed."""
    return sum(len(group.split(":", 1)[1].split(",")) for group in dp_sites.split("; ") if ":" in group)


def run_project(corpus: Path, row: dict[str, str], target: str, keep: Path | None) -> ProjectRun:
    directory = corpus / row["dir"]
    name_roots([str(directory)])  # as `mgpu-migrate <project dir>` names it: its top, with no .git in the corpus
    found, _ = discover([str(directory)])
    hinted = sum(might_need_migration(Path(path).read_bytes()) for path in found)
    run = ProjectRun(row["dir"], target, site_count(row["dp_sites"]), hinted)
    start = time.perf_counter()
    try:
        outcomes = process_files(found, target, write=False, want_diff=True, jobs=1)
    except Exception:  # noqa: BLE001 -- a crash of the tool is what this benchmark is for
        run.seconds = time.perf_counter() - start
        run.tool_errors.append("crash: " + traceback.format_exc().strip().splitlines()[-1])
        return run
    run.seconds = time.perf_counter() - start
    left: collections.Counter[str] = collections.Counter()
    lines = []
    diffs = []
    for outcome in outcomes:
        run.files_rewritten += outcome.status == CHANGED
        for diagnostic in outcome.diagnostics:
            text = diagnostic.format().replace(str(corpus) + "/", "")
            lines.append(text)
            if diagnostic.code == INTERNAL_ERROR:
                run.tool_errors.append(text)
            elif diagnostic.code == PARSE_ERROR:
                run.parse_errors += 1
            elif diagnostic.is_rewrite:
                run.rewrites += 1
            elif diagnostic.needs_review:
                left[diagnostic.code] += 1
        if outcome.diff:
            diffs.append(outcome.diff.replace(str(corpus) + "/", ""))
    run.left = dict(sorted(left.items()))
    run.fingerprint = fingerprint("".join(diffs), lines)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{row['dir']}.{target}.diff").write_text("".join(diffs))
        (keep / f"{row['dir']}.{target}.diagnostics").write_text("\n".join(sorted(lines)) + ("\n" if lines else ""))
    return run


def fingerprint(diff: str, diagnostics: list[str]) -> str:
    """What a verdict was given on: the diff, and where each diagnostic is and its code (not its wording, which
    may be reworded without changing what a maintainer gets)."""
    places = sorted(" ".join(line.split(" ", 2)[:2]) for line in diagnostics)
    return hashlib.sha256((diff + "\n".join(places)).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Verdict:
    project: str
    target: str
    reviewed: str  # the fingerprint of the run that was read
    verdict: str
    silent: int
    reason: str


def read_verdicts(path: Path) -> dict[tuple[str, str], Verdict]:
    with open(path, newline="") as handle:
        rows = [Verdict(**{**row, "silent": int(row["silent"])}) for row in csv.DictReader(handle, delimiter="\t")]
    for row in rows:
        if row.verdict not in OUTCOMES:
            raise SystemExit(f"{path}: {row.project} ({row.target}): verdict {row.verdict!r} is none of {OUTCOMES}")
        if row.verdict != MERGE and not row.reason:
            raise SystemExit(f"{path}: {row.project} ({row.target}): a verdict other than merge needs its reason")
    return {(row.project, row.target): row for row in rows}


def share(count: int, total: int) -> str:
    return f"{count}/{total} ({100 * count / total:.0f}%)" if total else "-"


def verdict_tables(runs: list[ProjectRun], verdicts: dict[tuple[str, str], Verdict], label: str) -> str:
    """The totals against the goal, then each project's verdicts with their reasons."""
    out = [
        "| target | merge as is | merge after edits | merge + edits | not mergeable | left (any reason) | silent changes "
        "| tool errors | unreviewed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for target in TARGETS:
        mine = [run for run in runs if run.target == target]
        if not mine:
            continue
        total = len(mine)
        merge, edits, lowest_left = GOALS[target]
        out.append(
            f"| {target}, goal | >= {merge:.0%} | | {'>= %.0f%%' % (100 * edits) if edits else '-'} | | <= {lowest_left:.0%} "
            "| 0 | 0 | |"
        )
        given = [verdicts.get((run.project, target)) for run in mine]
        current = [v for v, run in zip(given, mine) if v is not None and v.reviewed == run.fingerprint]
        counts = collections.Counter(v.verdict for v in current)
        out.append(
            f"| {target}, {label} | {share(counts[MERGE], total)} | {share(counts[EDITS], total)} | "
            f"**{share(counts[MERGE] + counts[EDITS], total)}** | {share(counts[NO], total)} | "
            f"**{share(counts[LEFT], total)}** | {sum(v.silent for v in current)} | "
            f"{sum(len(run.tool_errors) for run in mine)} | {total - len(current)} |"
        )
    out += ["", "| project | " + " | ".join(target for target in TARGETS) + " |", "|---|" + "---|" * len(TARGETS)]
    for project in dict.fromkeys(run.project for run in runs):
        cells = []
        for target in TARGETS:
            run = next((run for run in runs if run.project == project and run.target == target), None)
            verdict = verdicts.get((project, target))
            if run is None:
                cells.append("")
            elif verdict is None or verdict.reviewed != run.fingerprint:
                cells.append(f"unreviewed ({run.fingerprint})")
            else:
                silent = f" **{verdict.silent} silent**" if verdict.silent else ""
                cells.append(f"**{verdict.verdict}**{silent}" + (f": {verdict.reason}" if verdict.reason else ""))
        out.append(f"| {project} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def markdown(runs: list[ProjectRun]) -> str:
    out = [
        "| project | target | manifest sites | hinted files | rewritten | rewrites | left (codes) | unparsable | tool errors | time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        codes = ", ".join(f"{code}x{count}" if count > 1 else code for code, count in run.left.items()) or "-"
        out.append(
            f"| {run.project} | {run.target} | {run.manifest_sites} | {run.hinted_files} | {run.files_rewritten} | "
            f"{run.rewrites} | {run.left_total}: {codes} | {run.parse_errors} | {len(run.tool_errors)} | "
            f"{run.seconds:.2f} s |"
        )
    for target in TARGETS:
        mine = [run for run in runs if run.target == target]
        if not mine:
            continue
        out.append(
            f"\n{target}: {len(mine)} projects, {sum(r.files_rewritten for r in mine)} files rewritten in "
            f"{sum(r.files_rewritten > 0 for r in mine)} projects, {sum(r.rewrites for r in mine)} rewrites, "
            f"{sum(r.left_total for r in mine)} sites left, {sum(len(r.tool_errors) for r in mine)} tool errors, "
            f"{sum(r.seconds for r in mine):.1f} s"
        )
    errors = [f"- {run.project} ({run.target}): {error}" for run in runs for error in run.tool_errors]
    if errors:
        out.append("\nTool errors:\n" + "\n".join(errors))
    return "\n".join(out)


def project_reading() -> str:
    """What project reading cost over the run: the modules it read (each once) and the time to parse them, and the
    trees the importer search read (each once) and the time to read them."""
    from mgpu_migrate.analysis import project

    paths = project.modules_read()
    start = time.perf_counter()
    for path in paths:
        try:
            ast.parse(Path(path).read_bytes())
        except (SyntaxError, ValueError):
            pass
    seconds = time.perf_counter() - start
    trees = project.trees_searched()
    files, megabytes = sum(tree[1] for tree in trees), sum(tree[2] for tree in trees) / 1e6
    start = time.perf_counter()
    for top, _, _ in trees:
        project._tree.__wrapped__(top)  # the search's reading, again, uncached
    searching = time.perf_counter() - start
    return (
        f"project reading: {len(paths)} modules read, once each; parsing them all again takes {seconds * 1000:.0f} ms\n"
        f"importer search: {len(trees)} trees, {files} files, {megabytes:.2f} MB read once each; reading them again "
        f"takes {searching * 1000:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="?", default=str(ROOT.parent / "shared" / "corpus"))
    parser.add_argument("--keep", type=Path, help="write each project's diff and diagnostics here")
    parser.add_argument("--json", type=Path, help="write the numbers as JSON here")
    parser.add_argument("--only", help="comma-separated project directories")
    parser.add_argument("--to", choices=TARGETS, action="append", help="a target (default: both)")
    parser.add_argument("--verdicts", type=Path, default=VERDICTS, help="the verdict file (default: %(default)s)")
    parser.add_argument("--label", default="after", help="the totals row's name (default: %(default)s)")
    parser.add_argument("--fingerprints", action="store_true", help="print each run's fingerprint, for the verdict file")
    args = parser.parse_args()
    corpus = Path(args.corpus).resolve()
    rows = manifest(corpus)
    if args.only:
        wanted = set(args.only.split(","))
        rows = [row for row in rows if row["dir"] in wanted]
    runs = [run_project(corpus, row, target, args.keep) for row in rows for target in (args.to or TARGETS)]
    if args.json:
        args.json.write_text(json.dumps([asdict(run) for run in runs], indent=1) + "\n")
    if args.fingerprints:
        for run in runs:
            print(f"{run.project}\t{run.target}\t{run.fingerprint}")
        return
    if args.verdicts.exists():
        print(verdict_tables(runs, read_verdicts(args.verdicts), args.label) + "\n")
    print(markdown(runs))
    print("\n" + project_reading())


if __name__ == "__main__":
    main()
