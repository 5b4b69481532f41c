"""``--report FILE``: the migration as a reviewer reads it, in markdown.

What changed in each file (short old/new form, from the diff), every site left for a person with its file
and line, the files that could not be processed, and how to launch the result.
"""

from __future__ import annotations

import re

from mgpu_migrate.output import Run, display_path, kind_of
from mgpu_migrate.results import CHANGED, FAILED

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")

LAUNCH = {
    "ddp": (
        "One process per GPU. On one machine: `torchrun --standalone --nproc_per_node=gpu SCRIPT.py` "
        "(or plainly `python SCRIPT.py`, which relaunches itself under torchrun on every visible GPU; "
        "`MGPU_NPROC=N` chooses N processes). Across machines: `torchrun --nnodes=2 --node_rank=R "
        "--nproc_per_node=gpu --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 SCRIPT.py` on each, or `srun` "
        "under SLURM."
    ),
    "balanced": "One process, as before: `python SCRIPT.py` uses every visible GPU.",
}


def _changes(diff: str, applied: bool) -> list[tuple[int, list[str], list[str]]]:
    """(line, removed, added) for each run of changed lines; the line in the new file when ``applied``."""
    changes: list[tuple[int, list[str], list[str]]] = []
    old_line = new_line = 0
    removed: list[str] = []
    added: list[str] = []
    start = 0

    def flush() -> None:
        nonlocal removed, added
        if removed and len(removed) == len(added):  # line for line: each its own old/new pair
            changes.extend((start + offset, [old], [new]) for offset, (old, new) in enumerate(zip(removed, added)))
        elif removed or added:
            changes.append((start, removed, added))
        removed, added = [], []

    for line in diff.splitlines()[2:]:
        hunk = _HUNK.match(line)
        if hunk:
            flush()
            old_line, new_line = int(hunk[1]), int(hunk[2])
        elif line.startswith("-"):
            if not (removed or added):
                start = new_line if applied else old_line
            removed.append(line[1:])
            old_line += 1
        elif line.startswith("+"):
            if not (removed or added):
                start = new_line if applied else old_line
            added.append(line[1:])
            new_line += 1
        elif line.startswith(" "):
            flush()
            old_line, new_line = old_line + 1, new_line + 1
    flush()
    return changes


def _change(line: int, removed: list[str], added: list[str]) -> str:
    if len(removed) <= 1 and len(added) <= 1 and all("`" not in text for text in removed + added):
        if not removed:
            return f"- line {line}: added `{added[0].strip()}`\n"
        if not added:
            return f"- line {line}: removed `{removed[0].strip()}`\n"
        return f"- line {line}: `{removed[0].strip()}` → `{added[0].strip()}`\n"
    body = "".join(f"    -{text}\n" for text in removed) + "".join(f"    +{text}\n" for text in added)
    return f"- line {line}:\n\n    ```diff\n{body}    ```\n"


def render(run: Run) -> str:
    changed = [o for o in run.outcomes if o.status == CHANGED]
    failed = [o for o in run.outcomes if o.status == FAILED]
    review = [d for d in run.diagnostics if kind_of(d) == "review"]
    verb = "migrated" if run.applied else "would be migrated"
    out = [
        f"# mgpu-migrate: migration to {run.target.replace(',', ' and ')}\n\n",
        f"{len(changed)} file{'s' * (len(changed) != 1)} {verb}, {len(failed)} failed; "
        f"{len(review)} site{'s' * (len(review) != 1)} left for a person.\n",
    ]
    if changed:
        out.append(f"\n## Files {'changed' if run.applied else 'that would change'}\n")
        for outcome in changed:
            out.append(f"\n### `{display_path(outcome.path)}`\n\n")
            out.extend(_change(*change) for change in _changes(outcome.diff, run.applied))
    if review:
        where = "in the files as they now are" if run.applied else "in the files as they are"
        out.append(f"\n## Sites for a person ({where})\n\n")
        out.extend(
            f"- `{display_path(d.path)}:{d.line}:{d.col}` {d.code}: {d.message} (`mgpu-migrate --explain {d.code}`)\n"
            for d in review
        )
    if failed:
        out.append("\n## Files that could not be processed (left unchanged)\n\n")
        out.extend(
            f"- `{display_path(d.path)}:{d.line}:{d.col}` {d.code}: {d.message}\n"
            for o in failed
            for d in o.diagnostics
            if kind_of(d) == "error"
        )
    launch = "\n\n".join(f"`--to {target}`: {LAUNCH[target]}" for target in run.target.split(","))
    out.append(f"\n## How to launch the result\n\n{launch}\n")
    return "".join(out)
