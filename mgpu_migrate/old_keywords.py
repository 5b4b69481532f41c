"""PyTorch's ``async=`` keyword, which no Python from 3.7 on can parse.

Before PyTorch 0.4, ``tensor.cuda(async=True)`` (also ``.type(...)``, ``.copy_(...)``, ``.to(...)``) asked for a
copy that does not wait for the host; 0.4 renamed the keyword ``non_blocking``, and Python 3.7 made ``async`` a
reserved word. A script of those years (three projects of the corpus) is then not Python at all today, and every
migration of it stopped at MGP002, although that one keyword is all that keeps it from parsing.

So before parsing, a file that does not compile has each such keyword argument replaced by a placeholder of the
same length (columns stay where they were), when that alone makes it compile. The rule ``LegacyAsyncKeyword``
(MGP136) rewrites each placeholder to ``non_blocking``, which is what the migrated file needs on the PyTorch the
runtime runs on. ``put_back`` makes sure no placeholder reaches the output: a file left as it is goes back to
its own bytes, and one whose rename a ``# noqa`` silenced is left as it is too (MGP002: it still would not parse).

Only keyword arguments of calls of those four methods are touched: ``async`` anywhere else (a function of
that name, ``def f(async=...)``, another library's keyword) is a syntax error the file keeps.
"""

from __future__ import annotations

import io
import tokenize
import warnings
from collections.abc import Iterator
from dataclasses import replace

from mgpu_migrate.diagnostics import PARSE_ERROR, Diagnostic, noqa_codes, source_lines
from mgpu_migrate.results import MigrationResult

KEYWORD = "async"
PLACEHOLDER = "asyn0"  # a name as long as the keyword: a line's columns are the same in both texts
RENAMED = "non_blocking"
CODE = "MGP136"  # the rule that renames them (rules/legacy_async.py)
# The tensor methods whose ``async`` keyword PyTorch 0.4 renamed ``non_blocking``.
METHODS = frozenset({"cuda", "type", "copy_", "to"})
_SKIPPED = frozenset({tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT})


def set_aside(source: str) -> tuple[str, bool]:
    """The text to parse, and whether its ``async=`` keywords became placeholders (only when ``source`` does
    not compile as it is, and does once they are)."""
    if KEYWORD not in source or PLACEHOLDER in source or _compiles(source):
        return source, False
    sites = _sites(source)
    if not sites:
        return source, False
    lines = source_lines(source)
    for row, col in sites:
        line = lines[row - 1]
        lines[row - 1] = line[:col] + PLACEHOLDER + line[col + len(KEYWORD) :]
    text = "".join(lines)
    return (text, True) if _compiles(text) else (source, False)


def readable(source: str) -> str | None:
    """``source`` as the project reading can parse it: itself, or with its ``async=`` keywords set aside;
    None when neither compiles."""
    text, _ = set_aside(source)
    return text if text is not source or _compiles(text) else None


def put_back(result: MigrationResult, source: str) -> MigrationResult:
    """``result`` (of the text ``set_aside`` gave) as the migration of ``source``: a file left as it is keeps
    its own text, and a rewritten one holds no placeholder."""
    renamed_only = result.output == result.source.replace(PLACEHOLDER, RENAMED)
    if result.error is not None or not result.changed or renamed_only:
        # A file left as it is (or whose only change would be the new name) keeps its own bytes, and nothing
        # is said of a rename that is not made.
        kept = [d for d in result.diagnostics if d.code != CODE] if renamed_only else result.diagnostics
        return replace(result, source=source, output=source, diagnostics=kept)
    if next(_placeholders(result.output), None) is not None:
        # A noqa comment kept the old keyword: the file would still not parse, so it stays as it is.
        row, col = _silenced(result.source)
        message = f"cannot parse: `{KEYWORD}` is a reserved word from Python 3.7 (a noqa comment keeps it); file left unchanged"
        error = Diagnostic(result.path, row, col + 1, PARSE_ERROR, message)
        return replace(result, source=source, output=source, error=error)
    return replace(result, source=source)


def _placeholders(text: str) -> Iterator[tuple[int, int]]:
    """Where each placeholder stands in ``text`` (its line, and its column from 0)."""
    for token in _tokens(text):
        if token.type == tokenize.NAME and token.string == PLACEHOLDER:
            yield token.start


def _silenced(text: str) -> tuple[int, int]:
    """The first placeholder of the text parsed on a line whose ``# noqa`` silences the rename (else the first)."""
    silenced = noqa_codes(text)
    found = list(_placeholders(text))
    for row, col in found:
        codes = silenced.get(row, frozenset())
        if codes is None or CODE in codes:
            return row, col
    return found[0]


def _sites(source: str) -> list[tuple[int, int]]:
    """Where ``async`` is a keyword argument of a call of ``.cuda``, ``.type``, ``.copy_`` or ``.to``."""
    try:
        tokens = [token for token in _tokens(source) if token.type not in _SKIPPED]
    except (tokenize.TokenError, SyntaxError):
        return []
    sites = []
    opened: list[int] = []  # indexes of the open brackets around the current token
    for index, token in enumerate(tokens):
        if token.type == tokenize.OP and token.string in "([{":
            opened.append(index)
        elif token.type == tokenize.OP and token.string in ")]}":
            if opened:
                opened.pop()
        elif (
            token.type == tokenize.NAME
            and token.string == KEYWORD
            and opened
            and tokens[opened[-1]].string == "("
            and index + 1 < len(tokens)
            and tokens[index + 1].string == "="
            and tokens[index - 1].string in ("(", ",")
            and _is_method_call(tokens, opened[-1])
        ):
            sites.append(token.start)
    return sites


def _is_method_call(tokens: list[tokenize.TokenInfo], paren: int) -> bool:
    return (
        paren >= 2
        and tokens[paren - 1].type == tokenize.NAME
        and tokens[paren - 1].string in METHODS
        and tokens[paren - 2].string == "."
    )


def _tokens(text: str):
    return tokenize.generate_tokens(io.StringIO(text, newline="").readline)


def _compiles(text: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            compile(text, "<source>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
    return True
