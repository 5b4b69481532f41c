"""ParsedFile: one parsed file, its shared index (the one walk: parent map, bindings, flow index) and the
queries every analysis builds on. ``file.FileAnalysis`` adds the analyses built on it; the analyses it
composes (the entry point, the loaders) read a ``ParsedFile``, so no module imports the one that imports it."""

from __future__ import annotations

from functools import cached_property

import libcst as cst

from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.positions import Positions, code_of
from mgpu_migrate.analysis.project import callback_data_parallel_modules, encoding_pair_modules, star_resolver
from mgpu_migrate.analysis.scopes import FlowCollector, FlowIndex
from mgpu_migrate.analysis.tree import Tree
from mgpu_migrate.analysis.values import Values
from mgpu_migrate.diagnostics import noqa_codes


class ParsedFile:
    """Parsed module plus the lazily computed facts of its shared index. Analyses and rules read it; they never
    change it."""

    def __init__(self, path: str, source: str, module: cst.Module) -> None:
        self.path = path
        self.source = source
        self.module = module
        self._resolved: dict[cst.BaseExpression, str | None] = {}
        # What the rules asked of the noqa comments: every code asked about, and (line, code) of each
        # comment that silenced one (the noqa check reports the comments that silenced nothing).
        self.noqa_asked: set[str] = set()
        self.noqa_used: set[tuple[int, str]] = set()

    @cached_property
    def _index(self) -> tuple[Tree, names.Bindings, FlowIndex]:
        # One walk of the module collects the parent map, the bindings and the flow index together: almost
        # every file that reaches the parser asks for all three (its wraps' models follow values).
        flow = FlowCollector(self.module)
        tree = Tree(self.module, flow)
        # PyTorch-Encoding's pair is recognised in the project's own copies of it too (analysis/project.py).
        flow.bindings.encoding_modules = encoding_pair_modules(self.path, flow.bindings.imported)
        # So is the Synchronized-BatchNorm package's DataParallelWithCallback.
        flow.bindings.callback_modules = callback_data_parallel_modules(self.path, flow.bindings.imported)
        if flow.bindings.star_modules:  # what `from models import *` binds, where the project's copy tells
            flow.bindings.star_resolver = star_resolver(self.path, flow.bindings.star_modules)
        return tree, flow.bindings, FlowIndex(flow)

    @cached_property
    def bindings(self) -> names.Bindings:
        """What each name of the file is bound to: its imports and aliases, and local definitions."""
        return self._index[1]

    def resolve(self, node: cst.BaseExpression) -> str | None:
        """Canonical qualified name of a dotted expression, through imports and aliases; None if unknown."""
        # Rules ask about the same callees again and again (every call, once per rule): each node is resolved
        # once. Nodes compare by identity, and the bindings never change after they are collected.
        try:
            return self._resolved[node]
        except KeyError:
            qualified = self._resolved[node] = names.resolve(self.bindings, node)
            return qualified

    def origins(self, node: cst.BaseExpression) -> list[str]:
        """What a name may stand for: its qualified name, or, for a name two imports bind (pytorch-pose's
        torchvision ``datasets``, then the project's), each of them."""
        qualified = self.resolve(node)
        if qualified:
            return [qualified]
        return list(self.bindings.imported.get(node.value, ())) if type(node) is cst.Name else []

    @cached_property
    def flow(self) -> FlowIndex:
        """Scopes, places and the slots of every reference."""
        return self._index[2]

    @cached_property
    def tree(self) -> Tree:
        """The parent of every node: what statement, block, ``if`` or function holds a node."""
        return self._index[0]

    @cached_property
    def values(self) -> Values:
        """What names and attributes may hold: the values stored in them, followed back."""
        return Values(self.flow)

    @cached_property
    def calls(self) -> list[cst.Call]:
        """Every call in the file, statements in source order (from the parent map's walk, so within one
        statement the order is the tree's fields', e.g. a decorator's calls after its function's)."""
        return self.tree.nodes(cst.Call)

    @cached_property
    def _calls_by_callee(self) -> dict[str | None, list[cst.Call]]:
        # Rules ask for the calls of one name or another a dozen times a file: each call is resolved once.
        found: dict[str | None, list[cst.Call]] = {}
        for call in self.calls:
            found.setdefault(self.resolve(call.func), []).append(call)
        return found

    def calls_to(self, qualified: str) -> list[cst.Call]:
        """Calls whose callee resolves to ``qualified`` (a canonical name from ``analysis.names``), in the order
        of ``calls``."""
        return list(self._calls_by_callee.get(qualified, ()))

    def ambiguous_calls(self, qualified: str) -> list[cst.Call]:
        """Calls whose callee would be ``qualified`` through one binding but the name has others too."""
        found = []
        for call in self.calls:
            head = names.head_name(call.func)
            if head is None or not self.bindings.is_ambiguous(head):
                continue
            dotted = cst.helpers.get_full_name_for_node(call.func) or ""
            rest = dotted[len(head):]
            if any(self.bindings.canonical(origin + rest) == qualified for origin in self.bindings.imported[head]):
                found.append(call)
        return found

    def unknown_star_calls(self, last_names: frozenset[str]) -> list[tuple[cst.Call, list[str]]]:
        """Calls spelled ``....NAME(...)`` with NAME in ``last_names`` (``nn.DataParallel(model)``) that resolve
        to nothing because their leftmost name is bound nowhere in the file, with the star imports it may
        come from: what they call cannot be told without importing those modules."""
        if not self.bindings.star_modules:
            return []
        found = []
        for call in self.calls:
            func = call.func
            last = func.attr.value if type(func) is cst.Attribute else getattr(func, "value", None)
            head = names.head_name(func)
            if last not in last_names or head is None or self.resolve(func) is not None:
                continue
            sources = self.bindings.star_sources(head)
            if sources:
                found.append((call, sources))
        return found

    @cached_property
    def noqa(self) -> dict[int, frozenset[str] | None]:
        return noqa_codes(self.source)

    @cached_property
    def _positions(self) -> Positions:
        # Only a file with a diagnostic or a noqa comment asks, and only for the statements that hold the nodes asked
        # about (then the pipeline's round trip and output for a file that changes).
        return Positions(self.module, self.source, self.tree)

    def code(self, module: cst.Module | None = None) -> str:
        """``module.code`` of the parsed module (by default) or of one rebuilt from it; the top-level statements
        whose positions were asked for are not generated again, nor those the rebuilt module shares with it."""
        return self._positions.code(self.module if module is None else module)

    def code_of(self, node: cst.CSTNode) -> str:
        """The code of a node of the module (``module.code_for_node``, a third faster)."""
        return code_of(self.module, node)

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        """1-based line and column of a node's start."""
        line, column = self._positions.start(node)
        return line, column + 1

    def noqa_lines(self, node: cst.CSTNode) -> set[int]:
        """The lines whose ``# noqa`` covers the node: its first and its last."""
        return {self._positions.start(node)[0], self._positions.end(node)[0]}

    def silenced(self, node: cst.CSTNode, code: str) -> bool:
        """True when a ``# noqa`` comment on the node's first or last line covers ``code``."""
        if not self.noqa:
            return False
        self.noqa_asked.add(code)
        for line in self.noqa_lines(node):
            codes = self.noqa.get(line, frozenset())
            if codes is None or code in codes:
                self.noqa_used.add((line, code))
                return True
        return False
