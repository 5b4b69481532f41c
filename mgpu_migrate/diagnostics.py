"""Diagnostics: what the tool says about a site, printed as ``path:line:col: CODE message``."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Codes are stable: users silence them with a noqa comment that names them, and scripts grep for them.
#   MGP0xx  the file itself (cannot be read or parsed)
#   MGP1xx  a rewrite the tool made
#   MGP2xx  a site left as it was, for a person to look at (MGP3xx too, once MGP2xx ran out)
REVIEW_PREFIXES = ("MGP2", "MGP3")
READ_ERROR = "MGP001"
PARSE_ERROR = "MGP002"
INTERNAL_ERROR = "MGP003"
FILE_CHANGED = "MGP004"
"""The file changed on disk while the tool ran (an edit, another run): not written, so no edit is lost."""
OUTSIDE_TREE = "MGP005"
"""A symlink in a walked directory leads out of it: skipped, the file it points at is nobody's to rewrite."""
TOO_LARGE = "MGP006"
"""A file with DataParallel in it is over the size limit (``max-file-size``): not parsed, left as it is."""


@dataclass(frozen=True, eq=False)
class Code:
    """A diagnostic code a rule emits, declared once, in the rule module that emits it (``rules/``).

    Besides its number, a code carries what the pipeline and the checks need to know about what it says, so
    that none of them lists codes by number. Compared by identity: each code is one object.
    """

    code: str
    # The file is left as it is once this is reported (``--to ddp`` migrates a file entirely or not at all).
    veto: bool = False
    # What a wrap rule says about a wrap that stays: said also when a veto leaves the whole file.
    kept_when_left: bool = False
    # A note on the program the file becomes (``--style torch``): void when the file stays as it is.
    void_if_left: bool = False
    # Says what becomes of the file's training data: split, or left whole for a reason of its own.
    accounts_for_data: bool = False
    # Says the training data is left whole, which the runtime keeps the original's training (every process loads
    # each whole batch, and the wrapped model runs its chunk of it): accounts for the data under the runtime.
    whole_under_the_runtime: bool = False
    # Says the file only evaluates its model (no backward pass, no optimizer).
    only_evaluates: bool = False
    # A rewrite inside a helper function that makes nothing of its file a distributed program (the body of a
    # hand-written data_parallel, which calls the runtime's; a check that a model is wrapped, which WS-DAN's
    # utils.py makes for its callers): a module changed by these alone starts no program.
    helper_body: bool = False


@dataclass(frozen=True, eq=False)
class Rewrite(Code):
    """A rewrite code (``MGP1xx``). Its page (``--explain``) is the doc of the rule whose ``CODE`` it is."""


@dataclass(frozen=True, eq=False)
class Review(Code):
    """A review code (``MGP2xx``, ``MGP3xx``): a site left for a person, with its page's text. The message of
    each diagnostic names the site's own facts; the page says what was found, why, and what to do."""

    name: str = ""  # kebab-case, e.g. dim-not-zero
    summary: str = ""  # one line: what was found (``--list-codes``)
    why: str = ""  # why the site was left
    todo: str = ""  # what to do


def error_summary(error: BaseException) -> str:
    """``Type: first line of the message``, at most 120 characters: a diagnostic stays one line even when the
    exception's text holds a node's repr (LibCST's ``list.index`` errors print the whole node)."""
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass(frozen=True, order=True)
class Diagnostic:
    path: str
    line: int
    col: int
    code: str
    message: str

    @property
    def is_rewrite(self) -> bool:
        return self.code.startswith("MGP1")

    @property
    def needs_review(self) -> bool:
        return self.code.startswith(REVIEW_PREFIXES)

    def format(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"


def shorten(code: str, limit: int = 40) -> str:
    """Code quoted in a message: on one line, cut to ``limit`` characters (messages stay one short line)."""
    code = " ".join(code.split())
    return code if len(code) <= limit else code[: limit - 3] + "..."


# What starts a new line for Python, LibCST and line numbers in diagnostics. Not str.splitlines(), which
# also breaks at form feeds and other separators and would shift every line number after one.
LINE_BREAK = re.compile(r"\r\n?|\n")
_LINE = re.compile(r"[^\r\n]*(?:\r\n?|\n)|[^\r\n]+\Z")


def source_lines(text: str) -> list[str]:
    """The lines of ``text`` as Python counts them, each with its line break (``splitlines(keepends=True)``
    at ``LINE_BREAK`` only)."""
    return _LINE.findall(text)
_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)


def noqa_codes(source: str) -> dict[int, frozenset[str] | None]:
    """Map 1-based line numbers to the codes a ``# noqa`` comment there silences (None: all)."""
    found: dict[int, frozenset[str] | None] = {}
    if "noqa" not in source.lower():
        return found
    for number, line in enumerate(LINE_BREAK.split(source), start=1):
        match = _NOQA.search(line)
        if match:
            codes = match.group("codes")
            found[number] = frozenset(re.split(r"[\s,]+", codes.upper())) if codes else None
    return found
