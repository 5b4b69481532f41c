"""Where a node sits in the source, computed only as far into the file as someone asks.

LibCST's ``PositionProvider`` regenerates the whole module while splitting every token into lines and
building two position objects per node: about 2x the parse, on every file that gets a diagnostic.
Here the same regeneration only counts characters (0.3x the parse for a whole file), one top-level
statement at a time, and stops at the statement that holds the node asked about; an offset becomes a
line and column through a table of the source's line starts, which is exact wherever LibCST reproduces
the source (it may not after the last statement; see the round-trip check in pipeline.py). The ranges
are PositionProvider's own (syntactic: a statement's leading comments and blank lines are not part of
it); tests/robustness compares the two over real and generated files.

The same pass keeps the text it generates, statement by statement, so the pipeline's round-trip check and
its output (``code``) generate only what positions did not: the statements after the last node asked about,
and in the output the statements a rewrite rebuilt.
"""

from __future__ import annotations

import bisect
from typing import Iterator

import libcst as cst

# The codegen state is not public API, but it is the one hook PositionProvider itself is built on.
from libcst._nodes.internal import CodegenState

from mgpu_migrate.diagnostics import LINE_BREAK


class _SyntacticSpan:
    """``with state.record_syntactic_position(node): ...`` as LibCST's nodes call it, recording offsets."""

    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(self, state: _OffsetState, node: cst.CSTNode, start_node, end_node) -> None:
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self.start = self.state.offset

    def __exit__(self, *exc_info) -> bool:
        spans = self.state.spans
        start = spans[self.start_node][0] if self.start_node is not None else self.start
        end = spans[self.end_node][1] if self.end_node is not None else self.state.offset
        spans[self.node] = (start, end)
        return False


class _OffsetState(CodegenState):
    """A codegen state that keeps a character count (and the generated tokens, as any codegen state)."""

    __slots__ = ("offset", "spans", "starts")

    def __init__(self, module: cst.Module) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.offset = 0
        self.spans: dict[cst.CSTNode, tuple[int, int]] = {}
        self.starts: list[int] = []

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.add_token(token)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self.offset += len(value)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self.starts.append(self.offset)

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self.starts.pop()
        # A syntactic range, recorded inside the node's own codegen, wins over the whitespace-inclusive one.
        if node not in self.spans:
            self.spans[node] = (start, self.offset)

    def record_syntactic_position(self, node, *, start_node=None, end_node=None) -> _SyntacticSpan:
        return _SyntacticSpan(self, node, start_node, end_node)


class Positions:
    """Start and end (line, 0-based column) of the nodes of one parsed module, as PositionProvider gives them."""

    def __init__(self, module: cst.Module, source: str) -> None:
        self._module = module
        self._source = source
        self._state = _OffsetState(module)
        self._pending = self._generate()
        self._line_starts: list[int] | None = None
        # Where the tokens of each top-level statement (and blank or comment line) generated so far lie in the
        # state's tokens.
        self._token_ranges: dict[cst.CSTNode, tuple[int, int]] = {}

    def _generate(self) -> Iterator[bool]:
        # Module._codegen, cut at each top-level statement so the caller can stop early.
        module, state = self._module, self._state
        state.before_codegen(module)
        for statement in (*module.header, *module.body, *module.footer):
            first = len(state.tokens)
            statement._codegen(state)
            self._token_ranges[statement] = first, len(state.tokens)
            yield True
        if module.has_trailing_newline and state.offset == 0:
            state.add_token(state.default_newline)
        # Without a trailing newline, LibCST drops the last newline token but not the position it reached.
        state.after_codegen(module)

    def _offsets(self, node: cst.CSTNode) -> tuple[int, int]:
        spans = self._state.spans
        while node not in spans and next(self._pending, False):
            pass
        if node not in spans:
            raise KeyError(f"{type(node).__name__} node is not part of this module")
        return spans[node]

    def _line_column(self, offset: int) -> tuple[int, int]:
        if self._line_starts is None:
            text = self._source
            if not self._module.has_trailing_newline:
                # The last newline is generated, then dropped from the text: nodes may end on the line after it.
                text += self._module.default_newline
            self._line_starts = [0, *(match.end() for match in LINE_BREAK.finditer(text))]
        line = bisect.bisect_right(self._line_starts, offset)
        return line, offset - self._line_starts[line - 1]

    def start(self, node: cst.CSTNode) -> tuple[int, int]:
        return self._line_column(self._offsets(node)[0])

    def end(self, node: cst.CSTNode) -> tuple[int, int]:
        return self._line_column(self._offsets(node)[1])

    def code(self, module: cst.Module) -> str:
        """``module.code``, for this module or one rebuilt from it, with the tokens already generated for the
        top-level statements they share (a statement's code does not depend on what is around it, only on the
        module's indentation and newline)."""
        original = self._module
        if (module.default_indent, module.default_newline) != (original.default_indent, original.default_newline):
            return module.code
        if module is original:
            for _ in self._pending:
                pass
        generated = self._state.tokens
        tokens: list[str] = []
        for statement in (*module.header, *module.body, *module.footer):
            known = self._token_ranges.get(statement)
            if known is not None:
                tokens += generated[known[0]:known[1]]
            else:
                state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
                statement._codegen(state)
                tokens += state.tokens
        # The end of Module._codegen_impl.
        if module.has_trailing_newline:
            if not tokens:
                tokens.append(module.default_newline)
        elif tokens:
            tokens.pop()
        return "".join(tokens)
