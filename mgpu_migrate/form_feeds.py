"""Form feeds in the indentation of a statement's line, which CPython accepts and LibCST misreads.

A form feed is a page break (Emacs's ``^L``). Where it stands in a line's indentation, CPython resets the
column count, so ``\\fdef f():`` is a top-level ``def`` and ``  \\f    x = 1`` is indented by four. LibCST
counts the form feed as indentation: the first reads as an unexpected indent, the first statement of a block
gives the block an indent of ``'\\f    '`` that it then writes on every line, and others come back without
their form feed. (A form feed alone on a line, or before a comment, parses and prints back as it was.)

So before parsing, such a line loses the whitespace up to and including its last form feed, which changes
nothing CPython compiles, and after the rewrite that prefix goes back at the start of the same line of the
output (where a form feed changes nothing either: it resets the column). Lines are matched by a diff of the
text parsed and the rewrite; a prefix whose line the rewrite removed goes on the line that took its place.
"""

from __future__ import annotations

import difflib
import io
import tokenize
from dataclasses import replace

from mgpu_migrate.diagnostics import PARSE_ERROR, Diagnostic, source_lines
from mgpu_migrate.results import MigrationResult

_NOT_A_STATEMENT = frozenset({tokenize.INDENT, tokenize.DEDENT, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER})


def set_aside(source: str) -> tuple[str, dict[int, str]]:
    """The text to parse, and for each line (1-based) that lost its indentation's form feeds, what it lost."""
    if "\f" not in source:
        return source, {}
    lines = source_lines(source)
    aside = {}
    for row in _statement_rows(source):
        line = lines[row - 1]
        indentation = line[: len(line) - len(line.lstrip(" \t\f"))]
        if "\f" in indentation:
            aside[row] = line[: indentation.rindex("\f") + 1]
            lines[row - 1] = line[len(aside[row]) :]
    return "".join(lines), aside


def _statement_rows(source: str) -> set[int]:
    """The lines on which a statement starts (not those inside a string or a bracket, nor comment lines)."""
    rows, starting = set(), True
    try:
        for token in tokenize.generate_tokens(io.StringIO(source, newline="").readline):
            if token.type == tokenize.NEWLINE:
                starting = True
            elif token.type not in _NOT_A_STATEMENT and starting:
                rows.add(token.start[0])
                starting = False
    except (tokenize.TokenError, SyntaxError):
        return set()  # the parser says what is wrong with the file
    return rows


def put_back(result: MigrationResult, source: str, aside: dict[int, str]) -> MigrationResult:
    """``result`` (of the text ``set_aside`` gave) as the migration of ``source``: the prefixes back in its
    output, its diagnostics' columns counted in the lines as they are."""
    if not aside:
        return result
    diagnostics = [_in_source(diagnostic, aside) for diagnostic in result.diagnostics]
    error = _in_source(result.error, aside) if result.error is not None else None
    if error is not None or not result.changed:
        return replace(result, source=source, output=source, diagnostics=diagnostics, error=error)
    output = _restored(result.source, result.output, aside)
    if output is None:
        message = "cannot rewrite while keeping the form feeds at the start of its lines; file left unchanged"
        error = Diagnostic(result.path, min(aside), 1, PARSE_ERROR, message)
        return replace(result, source=source, output=source, diagnostics=diagnostics, error=error)
    return replace(result, source=source, output=output, diagnostics=diagnostics)


def _in_source(diagnostic: Diagnostic, aside: dict[int, str]) -> Diagnostic:
    shift = len(aside.get(diagnostic.line, ""))
    return replace(diagnostic, col=diagnostic.col + shift) if shift else diagnostic


def _restored(parsed: str, output: str, aside: dict[int, str]) -> str | None:
    """``output`` with each prefix at the start of its line's counterpart; None when that is not a statement's
    line there (the rewrite moved it into a string or a bracket), which setting aside again would not undo."""
    old, new = source_lines(parsed), source_lines(output)
    if not new:
        return None
    prefixes: dict[int, str] = {}
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, old_start, old_end, new_start, new_end in matcher.get_opcodes():
        for row in range(old_start + 1, old_end + 1):
            if row in aside:
                one_to_one = tag == "equal" or old_end - old_start == new_end - new_start
                counterpart = new_start + row - old_start if one_to_one else min(new_start + 1, len(new))
                prefixes[counterpart] = prefixes.get(counterpart, "") + aside[row]
    for row, prefix in prefixes.items():
        new[row - 1] = prefix + new[row - 1]
    restored = "".join(new)
    return restored if set_aside(restored) == (output, prefixes) else None
