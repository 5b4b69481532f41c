"""Where a node sits in the source, computed from the statement that holds it, not from the file before it.

LibCST's ``PositionProvider`` regenerates the whole module while splitting every token into lines and
building two position objects per node: about 2x the parse, on every file that gets a diagnostic.
Here a regeneration that only counts characters gives each node's offset within its statement, and
the statement's offset is where its code stands in the source: the innermost statement that holds the
node (sitting in a block) is generated alone, with the indentation of the blocks around it, and looked
up in the source text. Found once, that is its place (LibCST reproduces the code of a statement as it
was written); found twice or not at all, the statement around it is tried, and in the end the module
is generated from its start, one top-level statement at a time, as far as the node. A diagnosed file
thus generates a few statements instead of everything before its last diagnosis. (Where LibCST drops a
line continuation before a statement, the place found in the source is the statement's real one, which
a count from the module's start would miss by the characters dropped.) An offset becomes a
line and column through a table of the source's line starts. The ranges are PositionProvider's own
(syntactic: a statement's leading comments and blank lines are not part of it); tests/robustness
compares the two over real and generated files.

The top-level statements generated whole (looked up, or on the way from the module's start, or for the
pipeline's round-trip check) keep their text, so the output generates only the statements a rewrite
rebuilt (``code``).
"""

from __future__ import annotations

import bisect
import contextlib
from typing import Iterator

import libcst as cst

# The codegen state is not public API, but it is the one hook PositionProvider itself is built on.
from libcst._nodes.internal import CodegenState

from mgpu_migrate.analysis.tree import Tree
from mgpu_migrate.diagnostics import LINE_BREAK


class _PlainState(CodegenState):
    """LibCST's codegen state without its one cost that nothing here reads: the context manager it opens
    around every node for positions (a generator each time; a third of ``module.code``'s time)."""

    def record_syntactic_position(self, node, *, start_node=None, end_node=None):
        return _NO_SPAN


_NO_SPAN = contextlib.nullcontext()


def code_of(module: cst.Module, node: cst.CSTNode) -> str:
    """``module.code_for_node(node)``, generated with the plain state."""
    state = _PlainState(default_indent=module.default_indent, default_newline=module.default_newline)
    node._codegen(state)
    return "".join(state.tokens)


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

    def __init__(self, module: cst.Module, source: str, tree: Tree | None = None) -> None:
        self._module = module
        # The text the offsets count in: without a trailing newline, LibCST generates the last newline, then
        # drops it from the module's code; nodes may end on the line after it.
        self._text = source if module.has_trailing_newline else source + module.default_newline
        self._tree = tree if tree is not None else Tree(module)
        # Every node placed so far, by offset; also the state of the generation from the module's start.
        self._state = _OffsetState(module)
        self._line_starts: list[int] | None = None
        # The tokens of each top-level statement (and blank or comment line) generated whole so far.
        self._tokens: dict[cst.CSTNode, list[str]] = {}
        # Not a method's generator: its frame would hold ``self``, and ``self`` it, a reference cycle that keeps
        # the whole tree alive after the file is done, until the garbage collector's next full collection.
        self._pending = _generate(module, self._state, self._tokens)
        # Statements whose code is not in the source exactly once: not looked up again for their other nodes.
        self._not_found: set[cst.BaseStatement] = set()

    def _look_up(self, statement: cst.BaseStatement) -> bool:
        """Generate ``statement`` alone and place its nodes where its code stands in the source, if it stands
        there once (twice: which one is not known here; not at all: LibCST did not reproduce it)."""
        if statement in self._not_found:
            return False
        state = _OffsetState(self._module)
        blocks = [node for node in self._tree.ancestors(statement) if type(node) is cst.IndentedBlock]
        state.indent_tokens = [
            state.default_indent if block.indent is None else block.indent for block in reversed(blocks)
        ]
        statement._codegen(state)
        code = "".join(state.tokens)
        start = self._text.find(code)
        if start < 0 or self._text.find(code, start + 1) >= 0:
            self._not_found.add(statement)
            return False
        spans = self._state.spans
        for node, (begin, end) in state.spans.items():
            spans[node] = (begin + start, end + start)
        if not blocks:
            self._tokens[statement] = state.tokens
        return True

    def _offsets(self, node: cst.CSTNode) -> tuple[int, int]:
        spans = self._state.spans
        if node not in spans:
            statement = self._tree.statement(node)
            while statement is not None and not self._look_up(statement):
                statement = self._tree.statement(self._tree.parent(statement))
            while node not in spans and next(self._pending, False):
                pass
            if node not in spans:
                raise KeyError(f"{type(node).__name__} node is not part of this module")
        return spans[node]

    def _line_column(self, offset: int) -> tuple[int, int]:
        if self._line_starts is None:
            self._line_starts = [0, *(match.end() for match in LINE_BREAK.finditer(self._text))]
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
        tokens: list[str] = []
        for statement in (*module.header, *module.body, *module.footer):
            known = self._tokens.get(statement)
            if known is None:
                state = _PlainState(default_indent=module.default_indent, default_newline=module.default_newline)
                statement._codegen(state)
                known = state.tokens
                if module is original:
                    self._tokens[statement] = known
            tokens += known
        # The end of Module._codegen_impl.
        if module.has_trailing_newline:
            if not tokens:
                tokens.append(module.default_newline)
        elif tokens:
            tokens.pop()
        return "".join(tokens)


def _generate(module: cst.Module, state: _OffsetState, tokens: dict[cst.CSTNode, list[str]]) -> Iterator[bool]:
    """``Module._codegen``, cut at each top-level statement so the caller can stop early; the tokens of each
    statement go to ``tokens``."""
    state.before_codegen(module)
    for statement in (*module.header, *module.body, *module.footer):
        first = len(state.tokens)
        statement._codegen(state)
        tokens.setdefault(statement, state.tokens[first:])
        yield True
    if module.has_trailing_newline and state.offset == 0:
        state.add_token(state.default_newline)
    state.after_codegen(module)
