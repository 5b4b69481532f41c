"""Rules stand alone: no rule module imports another (their shared building blocks live in ``rules/base.py``,
``syntax.py``, ``torch_style.py``, ``counting.py`` or ``analysis/``), no rule reads what another reported but
through the code objects a check is handed (``self.reported``), a code number is written only where its code is
declared (and in the examples), and each rule declares the analyses it reads (``USES``), read from the source
as the import-cycle test reads imports."""

from __future__ import annotations

import ast
import importlib
import inspect
import re

from mgpu_migrate.rules import RULES
from mgpu_migrate.rules.base import ANALYSES
from tests.test_import_graph import PACKAGE, _imports, _modules

RULE_MODULES = sorted({rule.__module__ for rule in RULES})
# What a rule may do with its edits: record them (and read nothing back).
RECORDING = {"replace", "insert_before", "insert_after", "need_import", "keep_if_left", "leave_as_fallback"}
CODE_NUMBER = re.compile(r"MGP\d{3}")


def _tree(module: str) -> ast.Module:
    return ast.parse(inspect.getsource(importlib.import_module(module)))


def test_no_rule_module_imports_another():
    modules = _modules()
    for name in RULE_MODULES:
        others = _imports(name, modules[name], modules) & set(RULE_MODULES)
        assert others == set(), f"{name} imports {sorted(others)}"


def test_no_rule_reads_the_edits_or_diagnostics():
    for name in RULE_MODULES:
        for node in ast.walk(_tree(name)):
            if type(node) is ast.Attribute and type(node.value) is ast.Attribute and node.value.attr == "edits":
                assert node.attr in RECORDING, f"{name} reads edits.{node.attr} (line {node.lineno})"
            if type(node) is ast.Attribute and node.attr in ("diagnostics", "unplaced", "codes"):
                assert False, f"{name} reads .{node.attr} (line {node.lineno})"


def _numbers(tree: ast.AST, skip: set[int]) -> list[tuple[int, str]]:
    """The code numbers written in string constants, outside the nodes in ``skip`` (by id)."""
    found = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if id(node) in skip:
            continue
        if type(node) is ast.Constant and type(node.value) is str:
            found += [(node.lineno, number) for number in CODE_NUMBER.findall(node.value)]
        todo.extend(ast.iter_child_nodes(node))
    return sorted(found)


def test_a_code_number_is_written_only_where_its_code_is_declared():
    """Not as a literal compared with another rule's diagnostics: the examples name other rules' codes (what the
    run reports), docstrings and messages may cite one, and a declaration (``Review("MGP201", ...)``) is the code."""
    for name in [*RULE_MODULES, "mgpu_migrate.pipeline", "mgpu_migrate.program"]:
        tree = _tree(name)
        allowed = set()
        for node in ast.walk(tree):
            if type(node) is ast.Call and type(node.func) is ast.Name and node.func.id in ("Example", "Review", "Rewrite"):
                allowed.add(id(node))
            if type(node) in (ast.Module, ast.ClassDef, ast.FunctionDef) and ast.get_docstring(node) is not None:
                allowed.add(id(node.body[0]))
            if type(node) is ast.JoinedStr or (type(node) is ast.Call and type(node.func) is ast.Attribute and node.func.attr in ("left", "rewrote")):
                allowed.add(id(node))  # a message
        assert _numbers(tree, allowed) == [], f"{name} names a code by its number"


def _reads(node: ast.AST) -> set[str]:
    """The analyses ``node`` reads: ``analysis.<name>`` or ``self.analysis.<name>``."""
    found = set()
    for inner in ast.walk(node):
        if type(inner) is ast.Attribute and inner.attr in ANALYSES:
            base = inner.value
            if (type(base) is ast.Name and base.id == "analysis") or (type(base) is ast.Attribute and base.attr == "analysis"):
                found.add(inner.attr)
    return found


def _read_by(rule: type) -> set[str]:
    """What a rule class reads: in its body, in the functions of its module it calls (transitively), and in the
    rule it derives from (a ``--style torch`` twin)."""
    tree = _tree(rule.__module__)
    functions = {node.name: node for node in tree.body if type(node) is ast.FunctionDef}
    (cls,) = [node for node in tree.body if type(node) is ast.ClassDef and node.name == rule.__name__]
    found, todo, seen = set(), [cls], set()
    while todo:
        node = todo.pop()
        found |= _reads(node)
        for call in ast.walk(node):
            if type(call) is ast.Call and type(call.func) is ast.Name and call.func.id in functions and call.func.id not in seen:
                seen.add(call.func.id)
                todo.append(functions[call.func.id])
    for base in rule.__bases__:
        if base in RULES:
            found |= _read_by(base)
    return found


def test_each_rule_declares_the_analyses_it_reads():
    for rule in RULES:
        assert set(rule.USES) <= set(ANALYSES), rule.__name__
        assert set(rule.USES) == _read_by(rule), f"{rule.__name__}.USES"


def test_the_checks_find_what_they_look_for():
    assert _reads(ast.parse("self.analysis.loaders.traces\nanalysis.models\nother.values")) == {"loaders", "models"}
    assert _numbers(ast.parse('x = "MGP201"\nExample("a", None, "ddp", ("MGP101",))'), set()) == [(1, "MGP201"), (2, "MGP101")]
    assert str(PACKAGE).endswith("mgpu_migrate")
