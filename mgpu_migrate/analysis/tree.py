"""Where a node sits: its parent, and the statements, blocks and functions around it.

LibCST nodes do not know their parents; one pass records them (and the nodes of each type, in source
order), and the questions rules ask ("is this call under an ``if``?", "which statement holds it?") become
walks up that map.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any, Optional, TypeVar

import libcst as cst

_Node = TypeVar("_Node", bound=cst.CSTNode)

from mgpu_migrate.analysis.walk import DEFINITIONS, children, handlers, kinds, reader

Block = (cst.Module, cst.IndentedBlock)
_BLOCKS = kinds(*Block)
_STATEMENTS = kinds(cst.BaseStatement)


class _Leave:
    """On the walk's stack: the end of a node's subtree, where its leave_X handlers run."""

    __slots__ = ("node",)

    def __init__(self, node: cst.CSTNode) -> None:
        self.node = node


def _dispatch(visitors: tuple, kind: type) -> tuple[list, list, Callable]:
    """The visitors' visit_X and leave_X handlers for one node type, with each visitor's position, and the
    reader of its children (``walk.children``)."""
    found = [handlers(type(visitor), kind) for visitor in visitors]
    enters = [(index, pair[0]) for index, pair in enumerate(found) if pair[0] is not None]
    leaves = [(index, pair[1]) for index, pair in enumerate(found) if pair[1] is not None]
    return enters, leaves, reader(kind)


class Tree:
    """The parent of every node of one module that can hold an expression or a statement (the nodes
    ``analysis.walk`` visits: punctuation, operators and whitespace are not recorded).

    The one walk of the module that every analysis shares: ``visitors`` (read-only visitors, as for
    ``analysis.walk``) see the same ``visit_X``/``leave_X`` calls in the same order as in a walk of their
    own, so the bindings and the flow index are collected while the parent map is built, and the tree is
    walked once instead of three times.
    """

    def __init__(self, module: cst.Module, *visitors: object) -> None:
        # By the child's id(): a LibCST node's __hash__ is a Python function (its id), and the map takes 100,000
        # nodes over 100 scripts. Every node of the module is alive as long as the tree, so no id is reused.
        self._parents: dict[int, cst.CSTNode] = {}
        self._by_type: dict[type, list[cst.CSTNode]] = defaultdict(list)
        parents, by_type = self._parents, self._by_type
        # A visitor whose visit_X returned False skips that node's subtree (and its leave_X), as in a walk.
        skipping: list[cst.CSTNode | None] = [None] * len(visitors)
        dispatch: dict[type, tuple[list, list, Callable]] = {}
        stack: list = [module]
        while stack:
            node = stack.pop()
            if type(node) is _Leave:
                node = node.node
                for index, leave in dispatch[type(node)][1]:
                    if skipping[index] is None:
                        leave(visitors[index], node)
                for index, skipped in enumerate(skipping):
                    if skipped is node:
                        skipping[index] = None
                continue
            kind = type(node)
            by_type[kind].append(node)
            calls = dispatch.get(kind)
            if calls is None:
                calls = dispatch[kind] = _dispatch(visitors, kind)
            enters, leaves, read = calls
            skipped_here = False
            for index, enter in enters:
                if skipping[index] is None and enter(visitors[index], node) is False:
                    skipping[index] = node
                    skipped_here = True
            if leaves or skipped_here:
                stack.append(_Leave(node))
            found = read(node)
            for child in found:
                parents[id(child)] = node
            found.reverse()
            stack += found

    def nodes(self, kind: type[_Node]) -> list[_Node]:
        """Every node of exactly this type, in source order."""
        return self._by_type.get(kind, [])

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self._parents.get(id(node))

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """The node's parent, its parent's parent ... up to the module."""
        parents = self._parents
        parent = parents.get(id(node))
        while parent is not None:
            yield parent
            parent = parents.get(id(parent))

    def statement(self, node: cst.CSTNode) -> Optional[cst.BaseStatement]:
        """The innermost statement that holds ``node`` and sits directly in a block (the node itself if it is one)."""
        current: Optional[cst.CSTNode] = node
        while current is not None:
            parent = self._parents.get(id(current))
            if type(parent) in _BLOCKS and type(current) in _STATEMENTS:
                return current
            current = parent
        return None

    def function(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        """The innermost function whose body holds ``node`` (None at module level)."""
        for ancestor in self.ancestors(node):
            if type(ancestor) is cst.FunctionDef:
                return ancestor
        return None

    def enclosing_ifs(self, node: cst.CSTNode) -> Iterator[tuple[cst.If | cst.IfExp, bool]]:
        """Each ``if`` statement or ``... if ... else ...`` around ``node`` inside its function, innermost
        first, with whether ``node`` is in its ``else``/``elif`` part. A node in the condition itself is not
        under that ``if``."""
        child = node
        for ancestor in self.ancestors(node):
            if type(ancestor) in (cst.FunctionDef, cst.ClassDef, cst.Lambda):
                return
            if type(ancestor) in (cst.If, cst.IfExp) and child is not ancestor.test:
                yield ancestor, child is ancestor.orelse
            child = ancestor


def contains(root: cst.CSTNode, predicate, *, into_functions: bool = False) -> list[Any]:
    """The nodes under ``root`` (itself included) for which ``predicate`` holds, in source order;
    functions, classes and lambdas defined inside are skipped unless ``into_functions``. (Typed ``Any``: they are
    of the kinds the predicate tests, which a type checker cannot read from it.)"""
    # The nodes ``analysis.walk`` reads (punctuation and whitespace are never what is looked for), in
    # pre-order, without LibCST's visit, which rebuilds every node on the way back up.
    found: list[cst.CSTNode] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node is not root and not into_functions and type(node) in DEFINITIONS:
            continue
        if predicate(node):
            found.append(node)
        inner = children(node)
        inner.reverse()
        stack += inner
    return found



def is_zero(node: Optional[cst.BaseExpression]) -> bool:
    """The literal ``0``."""
    return type(node) is cst.Integer and node.evaluated_value == 0


def item_target(target: cst.BaseExpression, iterable: cst.BaseExpression) -> cst.BaseExpression:
    """What a ``for`` loop binds to the items of its iterable: ``batch`` in ``for i, batch in enumerate(x)``."""
    if (
        type(iterable) is cst.Call
        and type(iterable.func) is cst.Name
        and iterable.func.value == "enumerate"
        and type(target) is cst.Tuple
        and len(target.elements) == 2
    ):
        return target.elements[1].value
    return target


def reads_names_only(test: cst.BaseExpression) -> bool:
    """A condition that reads names only (``use_sync_bn``, ``args.sync_bn``, ``not a``, ``a and b``): no call, no
    side effect, the same value when read again at once."""
    if type(test) is cst.Name:
        return True
    if type(test) is cst.Attribute:
        return reads_names_only(test.value)
    if type(test) is cst.UnaryOperation and type(test.operator) is cst.Not:
        return reads_names_only(test.expression)
    if type(test) is cst.BooleanOperation:
        return reads_names_only(test.left) and reads_names_only(test.right)
    return False
