"""The registry of diagnostic codes: what each means, which rule owns it, and its ``--explain`` page.

Codes are stable (users silence them with ``# noqa: CODE``, scripts grep for them):

* ``MGP0xx`` (kind ``error``): the file itself could not be processed; it is left byte-identical.
* ``MGP1xx`` (kind ``rewrite``): a rewrite the tool made. Its page is the owning rule's doc (What it does /
  Why is this bad? / Example / Use instead / Fix safety).
* ``MGP2xx`` and ``MGP3xx`` (kind ``review``): a site left as it was, for a person to look at. Its page says what the tool
  found, why it left the site, and what to do.
* kind ``retired``: a code no rule reports any more. Its number is never reused, so a ``# noqa`` or a
  ``select``/``ignore`` that names it still means what it meant; its page says why it went.

Each code has one home. A review code is a ``diagnostics.Review`` declared in the module of the rule that
emits it, with its whole page (name, summary, why, what to do), and listed in the rule's ``REVIEW_CODES``; a
rewrite code is the rule's ``CODE``, whose page is the rule's doc. This module only collects them (a code
declared twice is an error) and holds the pages of the file codes (``MGP0xx``) and of the retired codes, which
have no rule left to hold them. Importing it imports the rules
(and libcst): only ``--explain`` and ``--list-codes`` need it.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mgpu_migrate.diagnostics import (
    FILE_CHANGED,
    INTERNAL_ERROR,
    OUTSIDE_TREE,
    PARSE_ERROR,
    READ_ERROR,
    TOO_LARGE,
    Code,
    Review,
    Rewrite,
)

if TYPE_CHECKING:
    from mgpu_migrate.rules.base import Rule

ERROR, REWRITE, REVIEW, RETIRED = "error", "rewrite", "review", "retired"


@dataclass(frozen=True)
class CodeInfo:
    code: str
    name: str
    kind: str  # "error" | "rewrite" | "review" | "retired"
    summary: str  # one line
    page: str  # the --explain markdown page
    rule: str | None  # owning rule class name


# The files the tool could not process: (name, summary, what happened, what to do).
_ERROR_PAGES = {
    READ_ERROR: (
        "read-error",
        "the file could not be read",
        "The path does not exist, cannot be opened, or its bytes do not decode in the encoding the file declares "
        "(a PEP 263 coding line, a BOM, else UTF-8).",
        "Check the path and the file's encoding. The other files of the run are still processed; the exit "
        "status is 2.",
    ),
    PARSE_ERROR: (
        "parse-error",
        "the file could not be parsed, or not rewritten without losing text",
        "The file is not valid Python for both CPython and LibCST (a syntax error, code nested too deeply), or "
        "LibCST would drop comments or blank lines after the last statement (they follow a whitespace-only "
        "line), so writing its output would lose them. The file is left byte-identical.",
        "Fix the syntax error the message points at; for lost trailing lines, remove the whitespace-only line "
        "near the end of the file. The exit status is 2.",
    ),
    INTERNAL_ERROR: (
        "internal-error",
        "the tool failed on this file; it is left unchanged",
        "A rule or the rewrite itself failed (an exception, or a rewrite that did not compile). The tool never "
        "writes such a file, and goes on with the others.",
        "Please report it with the file (or a reduction of it). Until then, migrate the file by hand or silence "
        "the site with `# noqa`.",
    ),
    FILE_CHANGED: (
        "file-changed",
        "the file changed on disk while the tool ran; it was not written",
        "Between reading the file and replacing it, its size, modification time or content changed (an editor "
        "saved it, or another mgpu-migrate run wrote it). Writing the migration would have lost that edit, so "
        "the file keeps what is on disk now.",
        "Run the tool again on the file: it reads the new content. The exit status of this run is 2.",
    ),
    OUTSIDE_TREE: (
        "outside-tree",
        "a symlink in a walked directory leads out of it; skipped",
        "A directory walk found a symbolic link to a file outside the directory given on the command line. "
        "Rewriting it would change a file nobody named (as black, the tool skips such links).",
        "Name the link's target on the command line to migrate it, or leave it as it is.",
    ),
    TOO_LARGE: (
        "too-large",
        "the file is over the size limit; not parsed, left as it is",
        "A file that mentions DataParallel is larger than `max-file-size` (default 2MB). Generated files of that "
        "size take minutes and gigabytes to analyse, so the tool leaves them.",
        "Raise the limit for the run (`--max-file-size 20MB`, or `max-file-size` in `[tool.mgpu-migrate]`; 0 "
        "for no limit), or exclude the file.",
    ),
}

# Codes no rule reports any more: (name, what it said, why it went, what to do). The runtime contract (issue 22)
# made their sites exact: outside the model's forward every value the loop computes is the global batch's.
_CONTRACT = (
    "Under the runtime's contract the training loop sees what DataParallel's gather gave it: the loader's batches "
    "and the wrapped model's outputs are the global batch's values, held in pieces, and whatever the loop computes "
    "from them (a loss, its normaliser, a count, a metric) is the original's on every process and replica."
)
_RETIRED_PAGES = {
    "MGP102": (
        "criterion-wrap",
        "criterion on a wrapped model's outputs wrapped in the runtime's criterion for the target",
        f"{_CONTRACT} torch's losses on them are one loss over the global batch (local numerators over global "
        "denominators), so a criterion needs no wrapper on either target: the tool leaves it as the original wrote it.",
        "Nothing. `mgpu_runtime.DataParallelCriterion` and `mgpu_runtime.DistributedCriterion`, which earlier versions "
        "wrote, now only call their criterion: they may stay, or be unwrapped.",
    ),
    "MGP203": (
        "criterion-used-otherwise",
        "the criterion is used other than by calling it; not wrapped, its loss is computed on the gathered output",
        f"It named a criterion the balanced rewrite could not wrap. No criterion is wrapped any more (MGP102). {_CONTRACT}",
        "Nothing.",
    ),
    "MGP204": (
        "loss-not-splittable",
        "the loss is not one the runtime can split exactly (a custom loss, CTCLoss, a per-sample weight); not wrapped",
        f"{_CONTRACT} A loss with no rule of its own (a custom loss, `CTCLoss`, a per-sample weight) is computed on the "
        "global value it gathers: exact, only slower.",
        "Nothing.",
    ),
    "MGP205": (
        "loss-out-of-sight",
        "no loss on this model's outputs is computed in this file: the outputs go to code the tool cannot see",
        f"{_CONTRACT} That holds in code the tool cannot see as well: a loss there is computed on the same global values.",
        "Nothing.",
    ),
    "MGP206": (
        "submodule-loss-gathered",
        "only a sub-module is wrapped: its output is gathered where the rest of the model uses it",
        f"{_CONTRACT} A wrapped sub-module's output is one of those values wherever the rest of the model uses it.",
        "Nothing.",
    ),
    "MGP207": (
        "loss-on-transformed-output",
        "the loss gets a value computed from the outputs (`out.view(...)`), so the outputs are gathered first",
        f"{_CONTRACT} `out.view(-1, C)`, `log_softmax(out, 1)` and the like are computed on each piece: nothing is gathered.",
        "Nothing.",
    ),
    "MGP213": (
        "criterion-from-elsewhere",
        "a wrapped criterion can also come from code the tool cannot follow; that criterion is not wrapped",
        f"It named a second source of a criterion that was wrapped; no criterion is wrapped any more (MGP102). {_CONTRACT}",
        "Nothing.",
    ),
    "MGP180": (
        "global-metric",
        "running counts of a split training loop's rows summed over the processes",
        f"{_CONTRACT} `y.size(0)`, `len(x)` and `pred.eq(y).sum()` are the global batch's already, and "
        "`mgpu_runtime.reduce_sum` adds up each process's value: applied to a global count it gives W times the count.",
        "Remove the `mgpu_runtime.reduce_sum(...)` an earlier version put around a running count of the batch (it now "
        "counts each row once per process); a script written for the runtime itself keeps its own reductions of "
        "values that are truly per process.",
    ),
    "MGP334": (
        "conditional-count",
        "a running count of the process's rows under an `if` of the loop: the process's share, not summed",
        f"{_CONTRACT} A count under an `if` of the loop is the global batch's, and the test, computed from global "
        "values, holds on every process alike.",
        "Nothing.",
    ),
    "MGP248": (
        "batchnorm-per-process",
        "BatchNorm statistics are computed per process (as per GPU under DataParallel); see --sync-bn",
        "A migration is measured against the original as it runs under DataParallel on W devices, where BatchNorm "
        "normalised over each device's chunk with device 0's running statistics kept: per-process BatchNorm is exactly "
        "that, so there is nothing to review. (It compared with one device, which normalised over the whole batch.)",
        "Nothing. `--sync-bn` still gives statistics over the whole batch, as a single device had them.",
    ),
}


def _kebab(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name).lower()


def _review_page(code: Review, owner: str) -> str:
    # The title is what it found (its summary); the page goes on with why and what to do.
    return (
        f"# {code.code} ({code.name}): {code.summary}\n\nReported by {owner}.\n\n"
        f"## Why it was left\n{code.why}\n\n## What to do\n{code.todo}\n"
    )


def registry(rules: Iterable[type[Rule]]) -> dict[str, CodeInfo]:
    """Every code: the file codes, and each rule's (a code declared by two objects raises ``ValueError``)."""
    codes: dict[str, CodeInfo] = {}
    declared: dict[str, Code] = {}

    def register(code: Code, info: CodeInfo) -> None:
        if code.code in _RETIRED_PAGES:
            raise ValueError(f"{code.code} is retired ({info.rule} declares it): a number is never reused")
        if declared.setdefault(code.code, code) is not code:
            raise ValueError(f"{code.code} is declared twice ({codes[code.code].rule} and {info.rule})")
        codes[code.code] = info

    for number, (name, summary, what, todo) in _ERROR_PAGES.items():
        page = f"# {number} ({name}): {summary}\n\n## What happened\n{what}\n\n## What to do\n{todo}\n"
        codes[number] = CodeInfo(number, name, ERROR, summary, page, None)
    for number, (name, summary, why, todo) in _RETIRED_PAGES.items():
        page = f"# {number} ({name}): retired: {summary}\n\n## Why it is retired\n{why}\n\n## What to do\n{todo}\n"
        codes[number] = CodeInfo(number, name, RETIRED, f"retired: {summary}", page, None)
    for rule in rules:
        doc = inspect.cleandoc(rule.__doc__ or "")
        owner = f"{rule.__name__} ({rule.CODE.code}: {rule.DESCRIPTION})"
        if type(rule.CODE) is Rewrite:
            name = _kebab(rule.__name__)
            listed = "".join(f"- {code.code}: {code.summary}\n" for code in rule.REVIEW_CODES)
            page = f"# {rule.CODE.code} ({name}): {rule.DESCRIPTION}\n\n{doc}\n"
            if listed:
                page += f"\n## Sites this rule leaves for review (see their own pages)\n{listed}"
            register(rule.CODE, CodeInfo(rule.CODE.code, name, REWRITE, rule.DESCRIPTION, page, rule.__name__))
        for code in rule.REVIEW_CODES:
            page = _review_page(code, owner)
            if code is rule.CODE:
                page += f"\n## The rule\n{doc}\n"
            register(code, CodeInfo(code.code, code.name, REVIEW, code.summary, page, rule.__name__))
    return dict(sorted(codes.items()))


def _build() -> dict[str, CodeInfo]:
    from mgpu_migrate.rules import RULES

    return registry(RULES)


CODES: dict[str, CodeInfo] = _build()


def lookup(code: str) -> CodeInfo | None:
    """The registered code, whatever its case (``mgp232`` is MGP232); None when there is none."""
    return CODES.get(code.strip().upper())
