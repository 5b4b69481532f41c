"""The runtime's structure: no import cycle, and no run state outside the process group's ``Job``.

The same reading of the source as ``test_import_graph.py`` does for the tool, over ``mgpu_runtime``. Module-level
state of a run (counters, flags, registries, caches reassigned with ``global``) lives in one object, the
process group's ``Job`` (``distributed/process_group.py``), so that a test or a second run starts from a clean
job. The one other holder of process-wide state is the emulated machine (``mgpu_runtime.emulation``, which
patches torch's CUDA functions and DataParallel for the whole process, as a machine's devices are the whole
process's).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import mgpu_runtime
from tests.test_import_graph import _cycles, _imports

PACKAGE = Path(mgpu_runtime.__file__).parent
# Module name -> the module-level names it may reassign with `global`.
STATE_HOLDERS = {"mgpu_runtime.distributed.process_group": {"_job"}}
EMULATED_MACHINE = "mgpu_runtime.emulation"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def test_the_runtime_modules_import_each_other_without_a_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_no_module_but_the_process_group_keeps_run_state():
    reassigned = {}
    for name, path in _modules().items():
        names = {
            target
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Global)
            for target in node.names
        }
        if names and not name.startswith(EMULATED_MACHINE):
            reassigned[name] = names
    assert reassigned == STATE_HOLDERS


def test_module_level_containers_are_constants():
    """A dict, list or set bound at module level is a table the code reads, never one it fills in."""
    filled = []
    for name, path in _modules().items():
        if name.startswith(EMULATED_MACHINE):
            continue
        tree = ast.parse(path.read_text(), str(path))
        tables = {
            target.id
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)
            and isinstance(node.value, (ast.Dict, ast.List, ast.Set, ast.Call))
            and not (isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") in ("frozenset", "tuple"))
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
                if node.func.value.id in tables and node.func.attr in ("append", "add", "update", "clear", "pop", "setdefault", "extend"):
                    filled.append(f"{name}: {node.func.value.id}.{node.func.attr}")
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name):
                if node.value.id in tables:
                    filled.append(f"{name}: {node.value.id}[...] = ")
    allowed = {"mgpu_runtime.sharded.rules: _RULES[...] = "}  # the cache of each function's rule, decided once
    assert set(filled) <= allowed, sorted(set(filled) - allowed)


def test_every_runtime_module_imports():
    for name in _modules():
        if not name.endswith("__main__"):
            importlib.import_module(name)
