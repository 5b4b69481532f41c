"""The shared walk's readers: each node type's children, read as its dataclass declares its fields, are the
children found by looking at every field's value, on every node of every fixture (and of odd code)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from mgpu_migrate import old_keywords
from mgpu_migrate.analysis.tree import Tree
from mgpu_migrate.analysis.walk import any_children, children, kinds

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
ODD = textwrap.dedent(
    """
    from . import a as b, c
    from .x import *
    import p.q.r as s
    async def f(x: int = 1, *args, y, z=2, **kw) -> "T":
        global g
        async with a as (b, c), d:
            async for i, *j in k:
                yield from m[1:2, ::3, ...]
        try:
            pass
        except* (E, F) as e:
            raise X from e
        else:
            del x[0], y.z
        finally:
            return [i async for i in g if i if not i] or {k: v for k, v in d.items()} or {*s} or (lambda q=1: q)
    @dec(1)
    class C(B, metaclass=M):
        x: int
        y: "str" = f"{a!r:>{w}}" "tail"
        def m(self, /, p, *, q): nonlocal_ = (yield); print(*a, **k); assert p, q; return p @ q if p else ~q
    match v:
        case [1, *rest] | {"k": _, **kw} if rest:
            pass
        case Point(x=0, y=(1 | 2)) as pt:
            pass
    while (n := n - 1) > 0: break
    else: continue_ = 1
    """
)


SOURCES = {str(path.relative_to(FIXTURES)): path for path in sorted(FIXTURES.rglob("*.py"))}


@pytest.mark.parametrize("name", ["odd", *SOURCES])
def test_children_by_declaration_are_children_by_value(name):
    # A fixture of PyTorch 0.3's years parses as the pipeline reads it (old_keywords.py).
    module = cst.parse_module(ODD if name == "odd" else old_keywords.set_aside(SOURCES[name].read_text())[0])
    stack, seen = [module], 0
    while stack:
        node = stack.pop()
        declared, looked_at = children(node), any_children(node)
        assert [id(child) for child in declared] == [id(child) for child in looked_at], type(node).__name__
        stack += declared
        seen += 1
    assert name != "odd" or seen > 200


def test_the_parent_map_reaches_every_expression():
    module = cst.parse_module(ODD)
    tree = Tree(module)
    names = tree.nodes(cst.Name)
    assert {"a", "b", "kw", "rest", "pt", "n", "Point", "nonlocal_"} <= {name.value for name in names}
    for name in names:
        assert module in tree.ancestors(name)


def test_kinds_are_the_concrete_classes():
    expressions = kinds(cst.BaseExpression)
    assert {cst.Name, cst.Call, cst.Attribute, cst.SimpleString, cst.Integer} <= expressions
    assert cst.BaseExpression not in expressions and cst.Arg not in expressions
    assert kinds(cst.Name) == {cst.Name}
