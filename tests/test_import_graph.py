"""The modules of ``mgpu_migrate`` import each other without a cycle, type-only imports included.

Read from the source: the imports at module level, inside ``if TYPE_CHECKING:`` too (a cycle a type checker
follows is a cycle for the reader), and those under ``try:``. An import inside a function is left out: it is
made on purpose at call time (what a run over files with nothing to migrate never needs). ``from a.b import
c`` depends on the module ``a.b.c`` when there is one, else on ``a.b``; the package ``a`` it passes through
is not counted (every submodule would otherwise depend on what its package's ``__init__`` re-exports).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import mgpu_migrate

PACKAGE = Path(mgpu_migrate.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def read(body: list[ast.stmt]) -> None:
        for statement in body:
            if isinstance(statement, ast.Import):
                found.update(alias.name for alias in statement.names if alias.name in modules)
            elif isinstance(statement, ast.ImportFrom):
                base = statement.module or ""
                if statement.level:
                    parts = package.split(".")[: len(package.split(".")) - statement.level + 1]
                    base = ".".join([*parts, *([statement.module] if statement.module else [])])
                for alias in statement.names:
                    inner = f"{base}.{alias.name}"
                    found.add(inner if inner in modules else base)
            elif isinstance(statement, ast.If):
                read(statement.body)
                read(statement.orelse)
            elif isinstance(statement, ast.Try):
                read(statement.body)
                for handler in statement.handlers:
                    read(handler.body)
                read(statement.orelse)
                read(statement.finalbody)

    read(ast.parse(path.read_text(), str(path)).body)
    return {module for module in found if module in modules and module != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def test_the_modules_import_each_other_without_a_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_through_type_only_imports():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_every_module_imports():
    for name in _modules():
        importlib.import_module(name)
