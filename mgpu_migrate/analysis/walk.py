"""A read-only walk over a LibCST tree, for the analyses that only look.

LibCST's own ``node.visit(visitor)`` rebuilds every node on the way back up, which costs about as much as
the parse; reading the dataclass fields directly costs a fraction of that. Each node type gets a reader of
its children, generated from the types its dataclass declares for its fields: a field declared as a node or a
sequence of nodes is taken as it is, one that never holds a node is not read, and only the others (``Optional``
fields, a node or a sequence) are looked at, by the type of their value (cached per value type:
``isinstance(value, cst.CSTNode)`` is an abstract-base-class check, several times slower than a dictionary
lookup, and the walks make millions of them). ``kinds`` gives the concrete classes for ``type(node) in ...``
tests, for the same reason.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import typing
from collections.abc import Callable

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
    read = _READERS.get(type(node))
    if read is None:
        read = _reader(type(node))
    return read(node)


def reader(kind: type) -> Callable[[cst.CSTNode], list[cst.CSTNode]]:
    """``children`` for the nodes of one type (for a walk that keeps it per type)."""
    return _READERS.get(kind) or _reader(kind)


def any_children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``children``, reading each field by what its value is (``children`` reads by what LibCST declares it
    holds, which is what its parser makes; a test holds the two to the same answers)."""
    found = []
    for name in _FIELDS.get(type(node)) or _fields(type(node)):
        _add(getattr(node, name), found)
    return found


def _add(value: object, found: list) -> None:
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


# For each node type, a function that reads its children field by field, as its dataclass declares them: a
# field that only ever holds nodes is appended or extended without looking at its value; a field that holds
# no node (a string, a flag) is not read; any other (``Optional``, a node or a sequence) is looked at.
_READERS: dict[type, Callable[[cst.CSTNode], list[cst.CSTNode]]] = {}


def _reader(kind: type) -> Callable[[cst.CSTNode], list[cst.CSTNode]]:
    declared = {f.name: f.type for f in dataclasses.fields(kind)}
    lines = ["def read(node):", "    found = []"]
    for name in _FIELDS.get(kind) or _fields(kind):
        form = _form(declared[name])
        if form == _NODE:
            lines.append(f"    found.append(node.{name})")
        elif form == _SEQUENCE:
            lines.append(f"    found.extend(node.{name})")
        elif form is None:
            lines.append(f"    add(node.{name}, found)")
    lines.append("    return found")
    namespace: dict = {"add": _add}
    exec("\n".join(lines), namespace)  # noqa: S102 - code made above from the dataclass's own field names
    read = _READERS[kind] = namespace["read"]
    return read


def _form(declared: object) -> int | None:
    """_NODE: always a node; _SEQUENCE: always a sequence of nodes; _OTHER: never a node; None: look."""
    if isinstance(declared, type):
        return _NODE if issubclass(declared, cst.CSTNode) else _OTHER if not issubclass(declared, (list, tuple)) else None
    origin, arguments = typing.get_origin(declared), typing.get_args(declared)
    if origin in (collections.abc.Sequence, list, tuple) and arguments and all(_only_nodes(a) for a in arguments):
        return _SEQUENCE
    if origin is typing.Literal:
        return _OTHER
    if origin is typing.Union and not any(_may_hold_a_node(a) for a in arguments):
        return _OTHER
    return None


def _only_nodes(declared: object) -> bool:
    if isinstance(declared, type):
        return issubclass(declared, cst.CSTNode)
    if isinstance(declared, typing.ForwardRef):
        return False
    return typing.get_origin(declared) is typing.Union and all(_only_nodes(a) for a in typing.get_args(declared))


def _may_hold_a_node(declared: object) -> bool:
    if isinstance(declared, type):
        return issubclass(declared, (cst.CSTNode, list, tuple))
    return not (typing.get_origin(declared) is typing.Literal)


def kinds(*classes: type) -> frozenset[type]:
    """The concrete node classes among ``classes`` and deriving from them (``kinds(cst.BaseExpression)``: every
    expression class), for ``type(node) in KINDS``: LibCST's node classes derive from an abstract base class,
    so ``isinstance`` runs ``ABCMeta.__instancecheck__`` for every node it is not, five times a set lookup."""
    found: set[type] = set()
    pending = list(classes)
    while pending:
        kind = pending.pop()
        if not inspect.isabstract(kind) and not kind.__name__.startswith("Base"):
            found.add(kind)
        pending += kind.__subclasses__()
    return frozenset(found)


# The kinds the analyses test most: every expression, and the definitions a walk of a body does not enter.
EXPRESSIONS = kinds(cst.BaseExpression)
DEFINITIONS = kinds(cst.FunctionDef, cst.ClassDef, cst.Lambda)


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
