"""Import bookkeeping after a rewrite: add the runtime import once, drop the imports the rewrite orphaned.

Only imports whose every use was removed by the rewrite are dropped; an import that was already unused
(or is only mentioned in a comment) stays as the author left it.
"""

from __future__ import annotations

from collections import Counter

import libcst as cst

from mgpu_migrate.analysis.names import Bindings
from mgpu_migrate.analysis.walk import children, walk
from mgpu_migrate.edits import StatementTidier


class _NameUses:
    """Counts the uses of each name outside import statements (strings count too: ``__all__``)."""

    def __init__(self) -> None:
        self.uses: Counter[str] = Counter()

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        walk(node.value, self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        walk(node.value, self)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.uses[node.value] += 1

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        self.uses[node.raw_value] += 1


def name_uses(module: cst.Module) -> Counter[str]:
    visitor = _NameUses()
    walk(module, visitor)
    return visitor.uses


def _is_import_line(statement: cst.CSTNode) -> bool:
    return type(statement) is cst.SimpleStatementLine and all(
        type(small) in (cst.Import, cst.ImportFrom) for small in statement.body
    )


def _is_docstring_or_future(statement: cst.CSTNode) -> bool:
    if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if type(small) is cst.Expr and type(small.value) in (cst.SimpleString, cst.ConcatenatedString):
        return True
    return type(small) is cst.ImportFrom and type(small.module) is cst.Name and small.module.value == "__future__"


def has_import(module: cst.Module, name: str) -> bool:
    for statement in module.body:
        if _is_import_line(statement):
            for small in statement.body:
                if type(small) is cst.Import and any(_spelled(alias) == name for alias in small.names):
                    return True
    return False


def _spelled(alias: cst.ImportAlias) -> str | None:
    """``torch`` for ``import torch``, ``torch.distributed as dist`` for ``import torch.distributed as dist``."""
    full = cst.helpers.get_full_name_for_node(alias.name)
    if alias.asname is None or type(alias.asname.name) is not cst.Name:
        return full
    return f"{full} as {alias.asname.name.value}"


def add_import(module: cst.Module, name: str) -> cst.Module:
    """Insert ``import name`` after the file's first run of top-level imports (or at the top)."""
    if has_import(module, name):
        return module
    body = list(module.body)
    index = 0
    while index < len(body) and _is_docstring_or_future(body[index]):
        index += 1
    while index < len(body) and _is_import_line(body[index]):
        index += 1
    body.insert(index, cst.parse_statement(f"import {name}", config=module.config_for_parsing))
    return module.with_changes(body=body)


def remove_orphaned(module: cst.Module, bindings: Bindings, uses_before: Counter[str]) -> cst.Module:
    """Drop import aliases whose names were used before the rewrite and are not used after it."""
    uses_after = name_uses(module)
    orphaned = {
        name
        for name in bindings.import_aliases
        if uses_before[name] > 0 and uses_after[name] == 0 and name not in bindings.local
    }
    if not orphaned:
        return module
    on_path: set[cst.CSTNode] = set()
    _find_imports(module, orphaned, on_path)
    return module.visit(_DropAliases(orphaned, on_path))


def _find_imports(node: cst.CSTNode, names: set[str], on_path: set[cst.CSTNode]) -> bool:
    """Whether ``node`` holds an import binding one of ``names``; adds the imports that do, and every node
    above them, to ``on_path``. Imports are statements: expressions and other small statements never hold one."""
    if type(node) in (cst.Import, cst.ImportFrom):
        holds = type(node.names) is not cst.ImportStar and any(_bound_name(alias) in names for alias in node.names)
    elif isinstance(node, (cst.BaseExpression, cst.BaseSmallStatement)):
        return False
    else:
        holds = False
        for child in children(node):
            holds = _find_imports(child, names, on_path) or holds
    if holds:
        on_path.add(node)
    return holds


def _bound_name(alias: cst.ImportAlias) -> str | None:
    if alias.asname is not None and type(alias.asname.name) is cst.Name:
        return alias.asname.name.value
    full = cst.helpers.get_full_name_for_node(alias.name)
    return full.split(".")[0] if full else None


class _DropAliases(StatementTidier):
    def __init__(self, names: set[str], on_path: set[cst.CSTNode]) -> None:
        super().__init__()
        self.names = names
        self.on_path = on_path

    def _filter(self, updated):
        kept = [alias for alias in updated.names if _bound_name(alias) not in self.names]
        if len(kept) == len(updated.names):
            return updated
        if not kept:
            return cst.RemovalSentinel.REMOVE
        # The last alias never carries a trailing comma unless the import is parenthesized.
        last = kept[-1]
        if not (type(updated) is cst.ImportFrom and updated.lpar is not None):
            kept[-1] = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(names=kept)

    def on_visit(self, node: cst.CSTNode) -> bool:
        # As in the edit applier, only the imports to change and the nodes above them are rebuilt; the rest
        # keep their identity (and their code, which the output then reuses).
        return node in self.on_path

    def leave_Import(self, original_node, updated_node):
        return self._filter(updated_node)

    def leave_ImportFrom(self, original_node, updated_node):
        if type(updated_node.names) is cst.ImportStar:
            return updated_node
        return self._filter(updated_node)

    def on_leave(self, original_node, updated_node):
        result = super().on_leave(original_node, updated_node)
        return self.tidy(result) if isinstance(result, cst.CSTNode) else result
