"""Edits: what rules ask for, applied to the tree in one pass.

Rules never transform the tree themselves. They look at the original tree (and the shared analysis)
and record edits keyed by original nodes; the applier then rebuilds the tree once. A replacement is
a function of the *updated* node, so edits on a node and on its children compose.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Callable, Union

import libcst as cst

from mgpu_migrate.analysis.tree import reads_names_only
from mgpu_migrate.diagnostics import Code, Diagnostic

Replacement = Callable[[cst.CSTNode], Union[cst.CSTNode, cst.RemovalSentinel, cst.FlattenSentinel]]


@dataclass
class Edits:
    path: str
    replacements: dict[cst.CSTNode, list[Replacement]] = field(default_factory=lambda: defaultdict(list))
    before: dict[cst.CSTNode, list[cst.BaseStatement]] = field(default_factory=lambda: defaultdict(list))
    after: dict[cst.CSTNode, list[cst.BaseStatement]] = field(default_factory=lambda: defaultdict(list))
    imports: list[str] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    # The diagnostics reported at a node, not yet placed (``place``), with their nodes.
    unplaced: list[tuple[Diagnostic, cst.CSTNode]] = field(default_factory=list)
    # The code object of each code reported, by its number (what the pipeline reads of a diagnostic).
    codes: dict[str, Code] = field(default_factory=dict)
    # Nodes whose replacements stay when a veto leaves the file (``keep_if_left``), with the imports they need.
    survivors: dict[cst.CSTNode, tuple[str, ...]] = field(default_factory=dict)
    # The file's wraps are the DataParallel fallback of scripts that launch their own distributed path
    # (``leave_as_fallback``): it stays as it is.
    left_as_fallback: bool = False

    def replace(self, node: cst.CSTNode, replacement: Replacement) -> None:
        self.replacements[node].append(replacement)

    def insert_before(self, statement: cst.CSTNode, new: cst.BaseStatement) -> None:
        self.before[statement].append(new)

    def insert_after(self, statement: cst.CSTNode, new: cst.BaseStatement) -> None:
        self.after[statement].append(new)

    def keep_if_left(self, node: cst.CSTNode, *imports: str) -> None:
        """Keep the replacements of ``node`` (and ``imports``) when a veto leaves the file (``program.settle``):
        an edit that serves the file's own way of running, which the veto leaves in place (MGP131). ``node`` may
        also be a statement the rule inserted: the insertion stays (the launch of the file's own path, MGP139)."""
        self.survivors[node] = imports

    def leave_as_fallback(self) -> None:
        """Leave the file as it is (``program.settle``), with only what the wrap rules said of its wraps: they are
        the DataParallel fallback of scripts whose migration launches their own distributed path (MGP139), which
        never takes it."""
        self.left_as_fallback = True

    def need_import(self, module: str) -> None:
        """Ask for ``import <module>`` at the top of the file (added once, if not there)."""
        if module not in self.imports:
            self.imports.append(module)

    def report(self, line: int, col: int, code: Code, message: str) -> None:
        self.codes[code.code] = code
        # One line, whatever code a message quotes (a call spread over several lines).
        self.diagnostics.append(Diagnostic(self.path, line, col, code.code, " ".join(message.split())))

    def report_at(self, node: cst.CSTNode, code: Code, message: str) -> None:
        """``report`` at a node's start, placed later (``place``): a ``--to ddp`` file that stays as it is drops
        most of what its rules said, and finding a node's line costs a generation of its statement."""
        self.report(0, 0, code, message)
        self.unplaced.append((self.diagnostics[-1], node))

    def place(self, position: Callable[[cst.CSTNode], tuple[int, int]]) -> None:
        """Give the diagnostics reported at a node that are still here their line and column."""
        # By identity: equal diagnostics may stand at different nodes (the list keeps every one alive till here).
        at = {id(diagnostic): node for diagnostic, node in self.unplaced}
        placed = []
        for diagnostic in self.diagnostics:
            node = at.get(id(diagnostic))
            if node is not None:
                line, col = position(node)
                diagnostic = replace(diagnostic, line=line, col=col)
            placed.append(diagnostic)
        self.diagnostics, self.unplaced = placed, []

    @property
    def empty(self) -> bool:
        return not (self.replacements or self.before or self.after)

    def reported(self) -> frozenset[Code]:
        """The codes of the diagnostics reported so far."""
        return frozenset(self.codes[diagnostic.code] for diagnostic in self.diagnostics)

    def discard_rewrites(self, keep: Callable[[Code], bool] | None = None, survivors: bool = False) -> None:
        """Forget every edit and the diagnostics that announce them: the file stays as it is, with the
        diagnostics of what was left for review (only those whose code ``keep`` holds, when given). With
        ``survivors``, the edits kept by ``keep_if_left`` stay, with the rewrites whose code is ``kept_when_left``."""
        kept = {node: self.replacements[node] for node in self.survivors if survivors and node in self.replacements}
        inserted = {
            id(new) for statements in (*self.before.values(), *self.after.values()) for new in statements
        }
        kept_inserts = [node for node in self.survivors if survivors and id(node) in inserted]
        imports = [module for node in [*kept, *kept_inserts] for module in self.survivors[node]]
        self.replacements.clear()
        self.replacements.update(kept)
        for insertions in (self.before, self.after):
            for anchor in list(insertions):
                insertions[anchor] = [new for new in insertions[anchor] if new in kept_inserts]
                if not insertions[anchor]:
                    del insertions[anchor]
        self.imports[:] = [module for module in self.imports if module in imports]

        def stays(diagnostic: Diagnostic) -> bool:
            code = self.codes[diagnostic.code]
            if diagnostic.is_rewrite:
                return bool(kept or kept_inserts) and code.kept_when_left
            return keep is None or keep(code)

        self.diagnostics = [diagnostic for diagnostic in self.diagnostics if stays(diagnostic)]

    def discard_diagnostics(self, drop: Callable[[Code], bool]) -> None:
        """Forget the diagnostics whose code ``drop`` holds."""
        self.diagnostics = [diagnostic for diagnostic in self.diagnostics if not drop(self.codes[diagnostic.code])]


class StatementTidier(cst.CSTTransformer):
    """Base for transformers that may empty a statement line: such lines are dropped at their block,
    which keeps the output valid and the spacing and comments around them.

    (libcst would drop an emptied line on its own, but with the blank lines and comments above it.)
    """

    def __init__(self) -> None:
        super().__init__()
        # By id, the nodes themselves held: an id is unique only while its node lives, and a dropped placeholder's
        # would otherwise be given to a node made later, which would then be taken for it.
        self._emptied: dict[int, cst.CSTNode] = {}
        self._emptied_blocks: dict[int, cst.CSTNode] = {}

    def tidy(self, node):
        if type(node) is cst.SimpleStatementLine and not node.body:
            placeholder = node.with_changes(body=[cst.Pass()])
            self._emptied[id(placeholder)] = placeholder
            return placeholder
        if type(node) in (cst.Module, cst.IndentedBlock):
            node = node.with_changes(body=self._without_emptied(node.body))
        if type(node) is cst.IndentedBlock and not node.body:
            # A block whose only statement was removed (an import inside `try:`, say) keeps a `pass`.
            emptied = node.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
            self._emptied_blocks[id(emptied)] = emptied
            return emptied
        if type(node) is cst.If and id(node.body) in self._emptied_blocks and node.orelse is None and reads_names_only(node.test):
            # `if use_sync_bn: patch_replication_callback(model)` with the call dropped: the `if` goes too.
            placeholder = cst.SimpleStatementLine([cst.Pass()], leading_lines=node.leading_lines)
            self._emptied[id(placeholder)] = placeholder
            return placeholder
        if type(node) is cst.SimpleStatementSuite and not node.body:
            return node.with_changes(body=[cst.Pass()])
        return node

    def _without_emptied(self, body):
        """The lines above a removed statement (a blank line after a docstring, a comment) move to the next
        statement; only its comments when it has leading lines of its own."""
        kept = []
        carried: list[cst.EmptyLine] = []
        for statement in body:
            if id(statement) in self._emptied:
                carried.extend(statement.leading_lines)
                continue
            if carried:
                own = list(statement.leading_lines)
                moved = carried if not own else [line for line in carried if line.comment is not None]
                statement = statement.with_changes(leading_lines=[*moved, *own])
                carried = []
            kept.append(statement)
        return kept


class _Applier(StatementTidier):
    def __init__(self, edits: Edits, on_path: set[cst.CSTNode]) -> None:
        super().__init__()
        self.edits = edits
        self.on_path = on_path

    def on_visit(self, node: cst.CSTNode) -> bool:
        # Only the edited nodes and their ancestors change: libcst rebuilds every node it descends into, so
        # the untouched subtrees (most of a file) are not entered at all.
        return node in self.on_path

    def on_leave(self, original_node, updated_node):
        result = updated_node
        for replacement in self.edits.replacements.get(original_node, ()):
            if not isinstance(result, cst.CSTNode):
                break
            result = replacement(result)
        before = self.edits.before.get(original_node)
        after = self.edits.after.get(original_node)
        if before or after:
            kept = [result] if isinstance(result, cst.CSTNode) else list(getattr(result, "nodes", ()))
            result = cst.FlattenSentinel([*(before or ()), *kept, *(after or ())])
        return self.tidy(result) if isinstance(result, cst.CSTNode) else result


def apply(module: cst.Module, edits: Edits, parent: Callable[[cst.CSTNode], cst.CSTNode | None]) -> cst.Module:
    """Apply the edits; ``parent`` gives each original node's parent (from the shared analysis)."""
    on_path: set[cst.CSTNode] = set()
    for node in (*edits.replacements, *edits.before, *edits.after):
        while node is not None and node not in on_path:
            on_path.add(node)
            node = parent(node)
    return module.visit(_Applier(edits, on_path))
