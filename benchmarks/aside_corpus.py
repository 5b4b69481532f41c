"""Rebuild an aside corpus (``/work/aside_corpus``, ``/work/aside2_corpus``) from its manifest.

The aside corpora hold real projects kept out of development (``benchmarks/verdicts/notes/s33-aside.md``,
``s34-aside2.md``); they live outside the repository, and their verdicts (``aside.tsv``, ``aside2.tsv``) are
tied to the exact trees by fingerprint. The manifests that pin the trees are kept in the repository:
``benchmarks/verdicts/aside.manifest.tsv`` and ``aside2.manifest.tsv`` (the columns of
``shared/corpus/MANIFEST.tsv``: dir, repo, commit, entry, dp_sites, shape).

For each manifest row this writes ``OUT/<dir>/``, the project's whole tree at ``commit``, by ``git archive
<commit> | tar -x`` from the bare git mirror ``MIRRORS/<owner>+<name>/repo`` (its ``.git`` if it has one),
and copies the manifest in as ``OUT/MANIFEST.tsv``. The mirrors are what the agent's fetch tool makes
(``fetch github:<owner>/<name>``); nothing is downloaded here. A mirror that is missing, or that lacks the
commit, is named and nothing is built (unless ``--skip-missing``). Files whose blobs the snapshot lacks (a few
large gifs) are left out of the tree and named; no Python file is.

    python benchmarks/aside_corpus.py benchmarks/verdicts/aside.manifest.tsv /work/aside_corpus
    python benchmarks/real_projects.py /work/aside_corpus --verdicts benchmarks/verdicts/aside.tsv --fingerprints
"""

from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import sys
from pathlib import Path

MIRRORS = Path("/work/.mirror")


def git_dir(mirrors: Path, repo: str) -> Path:
    owner, name = repo.split("/", 1)
    base = mirrors / f"{owner}+{name}" / "repo"
    return base / ".git" if (base / ".git").is_dir() else base


def git(directory: Path, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "--git-dir", str(directory), *args], input=data, capture_output=True)


def has_commit(directory: Path, commit: str) -> bool:
    return directory.is_dir() and git(directory, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0


def absent_blobs(directory: Path, commit: str) -> list[str]:
    """The paths of the commit's tree whose blobs the mirror does not hold."""
    listing = git(directory, "ls-tree", "-r", "-z", commit).stdout.decode("utf-8", "surrogateescape")
    blobs = []
    for entry in filter(None, listing.split("\0")):
        meta, path = entry.split("\t", 1)
        _, kind, obj = meta.split()
        if kind == "blob":
            blobs.append((obj, path))
    checked = git(directory, "cat-file", "--batch-check", data="".join(f"{obj}\n" for obj, _ in blobs).encode())
    answers = checked.stdout.decode().splitlines()
    return [path for (obj, path), answer in zip(blobs, answers) if answer.endswith(" missing")]


def escape(path: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in path)


def build(directory: Path, commit: str, into: Path) -> list[str]:
    """Write the commit's tree into ``into``; return the paths left out (blobs absent from the mirror)."""
    absent = absent_blobs(directory, commit)
    pathspec = ["--", ".", *(f":(exclude){escape(path)}" for path in absent)] if absent else []
    into.mkdir(parents=True)
    archive = subprocess.Popen(
        ["git", "--git-dir", str(directory), "archive", commit, *pathspec], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    untar = subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, capture_output=True)
    archive.stdout.close()
    errors = archive.stderr.read().decode(errors="replace")
    if archive.wait() != 0 or untar.returncode != 0:
        raise SystemExit(f"{into.name}: git archive {commit} failed:\n{errors}{untar.stderr.decode(errors='replace')}")
    return absent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="See the module docstring for the layout.")
    parser.add_argument("manifest", type=Path, help="a manifest, e.g. benchmarks/verdicts/aside.manifest.tsv")
    parser.add_argument("out", type=Path, help="the corpus directory to build, e.g. /work/aside_corpus")
    parser.add_argument("--mirrors", type=Path, default=MIRRORS,
                        help="where the fetched mirrors are, as <owner>+<name>/repo (default: %(default)s)")
    parser.add_argument("--only", help="comma-separated project directories (the manifest's dir column)")
    parser.add_argument("--replace", action="store_true", help="remove and rebuild project folders already there")
    parser.add_argument("--skip-missing", action="store_true", help="build the projects whose mirrors are there")
    args = parser.parse_args()

    with open(args.manifest, newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    if args.only:
        wanted = set(args.only.split(","))
        rows = [row for row in rows if row["dir"] in wanted]

    missing = []
    for row in rows:
        directory = git_dir(args.mirrors, row["repo"])
        if not directory.is_dir():
            missing.append(f"{row['repo']}: no mirror at {directory}")
        elif not has_commit(directory, row["commit"]):
            missing.append(f"{row['repo']}: the mirror at {directory} lacks commit {row['commit']}")
    if missing:
        print(f"{len(missing)} of {len(rows)} mirrors missing or without their commit:", file=sys.stderr)
        for line in missing:
            print("  " + line, file=sys.stderr)
        print("Fetch each first with the agent's fetch tool (fetch github:<owner>/<name>), "
              "or pass --mirrors DIR.", file=sys.stderr)
        if not args.skip_missing:
            return 1

    args.out.mkdir(parents=True, exist_ok=True)
    built = 0
    for row in rows:
        directory = git_dir(args.mirrors, row["repo"])
        if not has_commit(directory, row["commit"]):
            continue
        into = args.out / row["dir"]
        if into.exists() and any(into.iterdir()):
            if not args.replace:
                print(f"{row['dir']}: already there, left (--replace rebuilds it)", file=sys.stderr)
                continue
            shutil.rmtree(into)
        elif into.exists():
            into.rmdir()
        absent = build(directory, row["commit"], into)
        built += 1
        note = f" (left out, absent from the mirror: {', '.join(absent)})" if absent else ""
        print(f"{row['dir']}: {row['commit']}{note}")
    shutil.copyfile(args.manifest, args.out / "MANIFEST.tsv")
    print(f"{built} project(s) built into {args.out}; manifest copied to {args.out / 'MANIFEST.tsv'}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
