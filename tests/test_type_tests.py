"""The tool's code tests a node's concrete LibCST class with ``type(node) is cst.X``, not ``isinstance``.

LibCST's node classes derive from an abstract base class: an ``isinstance`` that fails runs
``ABCMeta.__instancecheck__``, five times the cost of a type test, and the analyses make some 400,000 of
them over the 100 benchmark scripts (benchmarks/RESULTS.md). ``type(node) is cst.X`` means the same because
no concrete LibCST node class has a subclass, which this test also checks.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import libcst as cst

PACKAGE = Path(__file__).resolve().parents[1] / "mgpu_migrate"
CONCRETE = {
    name
    for name, value in vars(cst).items()
    if inspect.isclass(value) and issubclass(value, cst.CSTNode) and not inspect.isabstract(value)
}


def _only_concrete_classes(node: ast.expr) -> bool:
    """Whether an isinstance's classes are all concrete node classes, ``cst.X`` (a tuple that also holds an
    abstract class, ``cst.BaseExpression``, needs isinstance)."""
    candidates = node.elts if isinstance(node, ast.Tuple) else [node]
    return all(
        isinstance(c, ast.Attribute) and isinstance(c.value, ast.Name) and c.value.id == "cst" and c.attr in CONCRETE
        for c in candidates
    )


def test_no_concrete_libcst_class_has_a_subclass():
    subclassed = {name: [s.__name__ for s in getattr(cst, name).__subclasses__()] for name in CONCRETE}
    assert not {name: subs for name, subs in subclassed.items() if subs}
    assert {"Name", "Call", "Attribute", "FunctionDef", "Module"} <= CONCRETE
    assert "BaseExpression" not in CONCRETE


def test_node_kinds_are_type_tests():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
                if len(node.args) == 2 and _only_concrete_classes(node.args[1]):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "use type(node) is cst.X for a concrete node class:\n" + "\n".join(found)
