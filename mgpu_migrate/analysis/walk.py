"""A read-only walk over a LibCST tree, for the analyses that only look.

LibCST's own ``node.visit(visitor)`` rebuilds every node on the way back up, which costs about as much as
the parse; reading the dataclass fields directly costs less than half of that.
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


def walk(node: cst.CSTNode, visitor: object) -> None:
    """``node.visit(visitor)`` for a visitor that only reads: the same ``visit_X``/``leave_X`` calls (children in
    field order, punctuation and whitespace skipped), without libcst's rebuilding of every node on the way back,
    which costs about as much as the parse."""
    kind = type(node)
    names = _FIELDS.get(kind)
    if names is None:
        names = tuple(
            f.name for f in dataclasses.fields(kind) if f.name not in _SKIPPED_FIELDS and "whitespace" not in f.name
        )
        _FIELDS[kind] = names
    enter = getattr(visitor, f"visit_{kind.__name__}", None)
    if enter is not None and enter(node) is False:
        return
    for name in names:
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            walk(value, visitor)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, cst.CSTNode):
                    walk(item, visitor)
    leave = getattr(visitor, f"leave_{kind.__name__}", None)
    if leave is not None:
        leave(node)
