"""FileAnalysis: one parsed file and the facts about it that rules share."""

from __future__ import annotations

from functools import cached_property

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from mgpu_migrate.analysis import names
from mgpu_migrate.diagnostics import noqa_codes


class _CallCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)


class FileAnalysis:
    """Parsed module plus lazily computed facts. Rules read it; they never change it."""

    def __init__(self, path: str, source: str, module: cst.Module) -> None:
        self.path = path
        self.source = source
        self.module = module

    @cached_property
    def bindings(self) -> names.Bindings:
        collector = names.BindingCollector()
        self.module.visit(collector)
        return collector.bindings

    def resolve(self, node: cst.BaseExpression) -> str | None:
        """Canonical qualified name of a dotted expression, through imports and aliases; None if unknown."""
        return names.resolve(self.bindings, node)

    @cached_property
    def calls(self) -> list[cst.Call]:
        """Every call in the file, in source order."""
        collector = _CallCollector()
        self.module.visit(collector)
        return collector.calls

    def calls_to(self, qualified: str) -> list[cst.Call]:
        """Calls whose callee resolves to ``qualified`` (a canonical name from ``analysis.names``)."""
        return [call for call in self.calls if self.resolve(call.func) == qualified]

    def ambiguous_calls(self, qualified: str) -> list[cst.Call]:
        """Calls whose callee would be ``qualified`` through one binding but the name has others too."""
        found = []
        for call in self.calls:
            head = names.head_name(call.func)
            if head is None or not self.bindings.is_ambiguous(head):
                continue
            dotted = cst.helpers.get_full_name_for_node(call.func) or ""
            rest = dotted[len(head):]
            if any(names.canonical(origin + rest) == qualified for origin in self.bindings.imported[head]):
                found.append(call)
        return found

    @cached_property
    def noqa(self) -> dict[int, frozenset[str] | None]:
        return noqa_codes(self.source)

    @cached_property
    def _positions(self):
        # Positions are only needed for the few nodes that get a diagnostic, but the provider computes them
        # for the whole tree; the wrapper shares our nodes (no copy) so lookups by node identity work.
        return MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(PositionProvider)

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        """1-based line and column of a node's start."""
        start = self._positions[node].start
        return start.line, start.column + 1

    def silenced(self, node: cst.CSTNode, code: str) -> bool:
        """True when a ``# noqa`` comment on the node's first or last line covers ``code``."""
        if not self.noqa:
            return False
        span = self._positions[node]
        for line in {span.start.line, span.end.line}:
            codes = self.noqa.get(line, frozenset())
            if codes is None or code in codes:
                return True
        return False
