"""A read-only walk over a LibCST tree, for the analyses that only look.

LibCST's own ``node.visit(visitor)`` rebuilds every node on the way back up, which costs about as much as
the parse; reading the dataclass fields directly costs a fraction of that. What is cached per node type
(the fields to read) and per value type (is it a node, a list of nodes, or neither) keeps the walk itself
cheap: ``isinstance(value, cst.CSTNode)`` is an abstract-base-class check, several times slower than a
dictionary lookup, and the walks make millions of them.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

# Fields that never hold an expression or a statement: whitespace, punctuation, operators.
_SKIPPED_FIELDS = frozenset(
    {"lpar", "rpar", "comma", "semicolon", "leading_lines", "lines_after_decorators", "header", "footer", "newline",
     "equal", "colon", "dot", "operator", "asynchronous", "star", "indent", "default_indent", "default_newline",
     "encoding", "has_trailing_newline", "trailing_whitespace", "leading_whitespace", "relative"}
)
_FIELDS: dict[type, tuple[str, ...]] = {}

# What a field's value is, by its type: a node, a list or tuple (of nodes, or of nothing), or neither.
_NODE, _SEQUENCE, _OTHER = 1, 2, 0
_SHAPES: dict[type, int] = {}


def _fields(kind: type) -> tuple[str, ...]:
    names = _FIELDS[kind] = tuple(
        f.name for f in dataclasses.fields(kind) if f.name not in _SKIPPED_FIELDS and "whitespace" not in f.name
    )
    return names


def _shape(kind: type) -> int:
    shape = _SHAPES[kind] = (
        _NODE if issubclass(kind, cst.CSTNode) else _SEQUENCE if issubclass(kind, (list, tuple)) else _OTHER
    )
    return shape


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The node's children that can hold an expression or a statement, in field order (which is source order
    for statements and blocks); punctuation and whitespace are left out."""
    kind = type(node)
    names = _FIELDS.get(kind)
    if names is None:
        names = _fields(kind)
    found = []
    for name in names:
        value = getattr(node, name)
        shape = _SHAPES.get(type(value))
        if shape is None:
            shape = _shape(type(value))
        if shape == _NODE:
            found.append(value)
        elif shape == _SEQUENCE:
            for item in value:
                item_shape = _SHAPES.get(type(item))
                if item_shape is None:
                    item_shape = _shape(type(item))
                if item_shape == _NODE:
                    found.append(item)
    return found


# The visit_X and leave_X functions of each visitor class for each node type (None where it has none).
_HANDLERS: dict[tuple[type, type], tuple] = {}


def _handlers(visitor_class: type, kind: type) -> tuple:
    handlers = _HANDLERS[visitor_class, kind] = (
        getattr(visitor_class, f"visit_{kind.__name__}", None),
        getattr(visitor_class, f"leave_{kind.__name__}", None),
    )
    return handlers


def handlers(visitor_class: type, kind: type) -> tuple:
    """The ``visit_X`` and ``leave_X`` functions of a visitor class for a node type (None where it has none)."""
    return _HANDLERS.get((visitor_class, kind)) or _handlers(visitor_class, kind)


def walk(node: cst.CSTNode, visitor: object) -> None:
    """``node.visit(visitor)`` for a visitor that only reads: the same ``visit_X``/``leave_X`` calls (children in
    field order, punctuation and whitespace skipped), without libcst's rebuilding of every node on the way back,
    which costs about as much as the parse. The handlers are looked up on the visitor's class."""
    key = (type(visitor), type(node))
    enter, leave = _HANDLERS.get(key) or _handlers(*key)
    if enter is not None and enter(visitor, node) is False:
        return
    for child in children(node):
        walk(child, visitor)
    if leave is not None:
        leave(visitor, node)
