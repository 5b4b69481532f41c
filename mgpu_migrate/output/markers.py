"""Review markers: ``# mgpu-migrate: review MGPxxx -- message`` comments that keep a site for a person in view.

``--add-markers`` writes one above each statement left for a person; every later run reports the marked
statement again (as the marker's code and message) until someone removes the comment. A site the tool
still reports itself is reported once, not once more for its marker, and is never marked twice.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import replace
from typing import TYPE_CHECKING

from mgpu_migrate.diagnostics import LINE_BREAK, Diagnostic
from mgpu_migrate.output.lines import moved_to_new_lines

if TYPE_CHECKING:
    from mgpu_migrate.results import FileOutcome, MigrationResult

PREFIX = "# mgpu-migrate: review"
_MARKER = re.compile(r"^[ \t]*# mgpu-migrate: review (?P<code>MGP\d{3})(?: -- (?P<message>.*?))?[ \t]*$")


def marked(path: str, text: str) -> list[Diagnostic]:
    """One diagnostic per marker, at the first line below it that is not itself a marker."""
    if PREFIX not in text:
        return []
    found, pending = [], []
    for number, line in enumerate(LINE_BREAK.split(text), start=1):
        match = _MARKER.match(line)
        if match:
            pending.append(match)
            continue
        column = len(line) - len(line.lstrip(" \t")) + 1
        for marker in pending:
            message = (marker["message"] or "marked for review") + "; remove the marker comment once done"
            found.append(Diagnostic(path, number, column, marker["code"], message))
        pending = []
    return found


def _site_key(diagnostic: Diagnostic) -> tuple[int, str]:
    return diagnostic.line, diagnostic.code


def with_markers(path: str, text: str, diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """``diagnostics`` and those of the markers in ``text``, a site the tool reported and marked once."""
    found = marked(path, text)
    if not found:
        return diagnostics
    starts = _statement_starts(text)
    reported = {(starts.get(d.line, d.line), d.code) for d in diagnostics}
    return diagnostics + [d for d in found if _site_key(d) not in reported]


def review_notes(outcome: FileOutcome, result: MigrationResult, written: bool) -> FileOutcome:
    """The outcome's diagnostics at their lines in the file as it now is, with its markers."""
    if result.error is not None:
        return outcome
    text = result.output if written else result.source
    diagnostics = moved_to_new_lines(outcome.diagnostics, result.source, text) if written else outcome.diagnostics
    return replace(outcome, diagnostics=sorted(with_markers(outcome.path, text, diagnostics)))


def _statement_starts(text: str) -> dict[int, int]:
    """Map each line to the first line of the statement it is part of (a bracket or string spans lines)."""
    starts: dict[int, int] = {}
    first = None
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if first is None and token.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING):
            continue
        if first is None:
            first = token.start[0]
        if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            for line in range(first, token.end[0] + 1):
                starts.setdefault(line, first)
            first = None
    return starts


def add_markers(path: str, text: str, diagnostics: list[Diagnostic]) -> tuple[str, list[Diagnostic], int]:
    """``text`` with a marker above each statement that holds a site for a person and has none for its code
    yet; the diagnostics moved to the new lines, and how many markers were added."""
    already = {_site_key(d) for d in marked(path, text)}
    try:
        starts = _statement_starts(text)
    except (tokenize.TokenError, SyntaxError):
        return text, diagnostics, 0
    wanted: dict[int, list[Diagnostic]] = {}
    for diagnostic in diagnostics:
        # A position on a comment line (a shebang, a coding cookie) marks the first statement below it, so
        # those lines stay where Python looks for them.
        start = starts.get(diagnostic.line) or next((line for line in sorted(starts) if line > diagnostic.line), None)
        if (
            start is not None
            and diagnostic.needs_review
            and (start, diagnostic.code) not in already
            and all(d.code != diagnostic.code for d in wanted.get(start, []))
        ):
            wanted.setdefault(start, []).append(diagnostic)
    if not wanted:
        return text, diagnostics, 0
    first_break = LINE_BREAK.search(text)
    newline = first_break.group() if first_break else "\n"
    pieces = LINE_BREAK.split(text)
    breaks = [match.group() for match in LINE_BREAK.finditer(text)] + [""]
    out = []
    for number, (line, end) in enumerate(zip(pieces, breaks), start=1):
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        for diagnostic in wanted.get(number, []):
            out.append(f"{indent}{PREFIX} {diagnostic.code} -- {diagnostic.message}{newline}")
        out.append(line + end)
    new_text = "".join(out)
    added = sum(len(site) for site in wanted.values())
    return new_text, moved_to_new_lines(diagnostics, text, new_text), added


def marked_in_bytes(path: str, data: bytes) -> list[Diagnostic]:
    """``marked`` for a file the engine need not read: a substring test first, so it costs nothing without markers."""
    if PREFIX.encode() not in data:
        return []
    from mgpu_migrate.files import source_file

    try:
        return marked(path, source_file(path, data).text)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return []
