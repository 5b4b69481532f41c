"""What a subclass of ``nn.DataParallel`` overrides, and whether the runtime's wrapper can stand as its base.

The facts are read from the class itself, with LibCST in the file being migrated (MGP106 rebases the class there)
or with ``ast`` in another module of the project (a call of the class is then a wrap site of the calling file,
whose class is rebased in its own module). One decision serves both (``Subclass.kept``).

The runtime's wrappers call, as DataParallel did, ``replicate(self, module, device_ids)`` (balanced only: under
ddp each process holds one model and makes no replicas), ``scatter(self, inputs, kwargs, device_ids)`` (unless it
calls ``super()``: DataParallel's own scatter, which the wrappers do not use) and ``gather(self, outputs,
output_device)``. They do not call ``forward`` or ``parallel_apply``, nor set DataParallel's private state
(``src_device_obj``, ``device_type``); under ddp a class that reads ``device_ids`` or ``output_device`` is left too,
since DistributedDataParallel holds its one process's GPU there. A ``gather`` that only returns its outputs is PyTorch-Encoding's
``DataParallelModel``, whose callers get the runtime's own wrapper (MGP104): rebasing it would add only a hunk.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass

import libcst as cst

from mgpu_migrate import files
from mgpu_migrate.analysis.entrypoint import _is_docstring as is_docstring
from mgpu_migrate.analysis.hand_written import _is_docstring as is_ast_docstring
from mgpu_migrate.analysis.project import importers_through_packages
from mgpu_migrate.options import Options

# nn.DataParallel's machinery: overriding what the runtime's wrapper does not call changes behaviour.
MACHINERY = frozenset({"forward", "scatter", "gather", "replicate", "parallel_apply"})
# What the runtime's wrapper calls as DataParallel did, with the number of parameters of each (``self`` included).
_CALLED = {"replicate": 3, "scatter": 4, "gather": 3}
# nn.DataParallel's own attributes that the runtime's wrappers do not set.
_PRIVATE_STATE = frozenset({"src_device_obj", "device_type"})
# ... and those DistributedDataParallel holds for its one process (its GPU), where DataParallel's named every GPU.
_PER_PROCESS_STATE = frozenset({"device_ids", "output_device"})
KEEPS_OUTPUTS = "keeps-outputs"
"""``Subclass.kept``'s answer for PyTorch-Encoding's ``DataParallelModel`` (a gather that returns its outputs)."""


@dataclass(frozen=True)
class Method:
    """A method of the class that is part of DataParallel's machinery."""

    name: str
    called: bool  # the plain signature the runtime's wrapper calls (a scatter calling super() is not)
    returns_outputs: bool  # ``def gather(self, outputs, output_device): return outputs``


@dataclass(frozen=True)
class Subclass:
    """A DataParallel subclass's overrides of the machinery and its reads of DataParallel's private state."""

    name: str
    methods: tuple[Method, ...]
    private: tuple[str, ...]
    scatter_line: int | None  # where its own scatter is defined
    module: str = ""  # its module's path as the migrated file sees it ("" for a class of that file)
    line: int = 0  # where the class is defined in that module

    @property
    def scatter_place(self) -> str:
        """Where its own scatter is, for a message: ``line 20``, or ``utils/utils.py:194`` in another module."""
        return f"{self.module}:{self.scatter_line}" if self.module else f"line {self.scatter_line}"

    def kept(self, ddp: bool) -> str | None:
        """Why the class cannot be rebased on the runtime's wrapper of the target (``overrides `forward```, ``reads
        `device_type```, ``KEEPS_OUTPUTS``), or None when it can."""
        overridden = sorted(
            method.name
            for method in self.methods
            if not method.called or (ddp and method.name == "replicate")  # no replicas under ddp
        )
        if overridden:
            return f"overrides `{overridden[0]}`"
        private = [name for name in self.private if ddp or name not in _PER_PROCESS_STATE]
        if private:
            return f"reads `{private[0]}`"
        if any(method.returns_outputs for method in self.methods):
            return KEEPS_OUTPUTS
        return None


def from_cst(cls: cst.ClassDef, line_of) -> Subclass:
    """The facts of a class of the migrated file (``line_of``: a node's line)."""
    methods, scatter_line = [], None
    for statement in cls.body.body:
        if type(statement) is not cst.FunctionDef or statement.name.value not in MACHINERY:
            continue
        params = statement.params
        starred = type(params.star_arg) in (cst.Param, cst.ParamStar) or params.star_kwarg is not None
        plain = not (starred or params.kwonly_params or params.posonly_params or statement.decorators)
        name = statement.name.value
        called = plain and len(params.params) == _CALLED.get(name) and not (name == "scatter" and _cst_calls_super(statement))
        methods.append(Method(name, called, called and name == "gather" and _cst_returns_outputs(statement)))
        if name == "scatter":
            scatter_line = line_of(statement)
    attributes = _CstAttributes()
    cls.body.visit(attributes)
    return Subclass(cls.name.value, tuple(methods), tuple(sorted(attributes.names & (_PRIVATE_STATE | _PER_PROCESS_STATE))), scatter_line)


def from_ast(cls: ast.ClassDef, module: str) -> Subclass:
    """The facts of a class of another module of the project (``module``: its path, as the migrated file sees it)."""
    methods, scatter_line = [], None
    for statement in cls.body:
        if not isinstance(statement, ast.FunctionDef) or statement.name not in MACHINERY:
            continue
        arguments = statement.args
        plain = not (arguments.vararg or arguments.kwarg or arguments.kwonlyargs or arguments.posonlyargs)
        plain = plain and not statement.decorator_list
        name = statement.name
        calls_super = any(
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
            for node in ast.walk(statement)
        )
        called = plain and len(arguments.args) == _CALLED.get(name) and not (name == "scatter" and calls_super)
        methods.append(Method(name, called, called and name == "gather" and _ast_returns_outputs(statement)))
        if name == "scatter":
            scatter_line = statement.lineno
    private = {node.attr for node in ast.walk(cls) if isinstance(node, ast.Attribute)} & (_PRIVATE_STATE | _PER_PROCESS_STATE)
    return Subclass(cls.name, tuple(methods), tuple(sorted(private)), scatter_line, module, cls.lineno)


def _ast_returns_outputs(method: ast.FunctionDef) -> bool:
    body = method.body[1:] if method.body and is_ast_docstring(method.body[0]) else method.body
    outputs = method.args.args[1].arg
    return (
        len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, ast.Name)
        and body[0].value.id == outputs
    )


def _cst_returns_outputs(method: cst.FunctionDef) -> bool:
    if type(method.body) is not cst.IndentedBlock:
        return False
    body = [statement for statement in method.body.body if not is_docstring(statement)]
    if len(body) != 1 or type(body[0]) is not cst.SimpleStatementLine or len(body[0].body) != 1:
        return False
    returned = body[0].body[0]
    outputs = method.params.params[1].name.value
    return type(returned) is cst.Return and type(returned.value) is cst.Name and returned.value.value == outputs


def _cst_calls_super(method: cst.FunctionDef) -> bool:
    found = _CstSuperCalls()
    method.body.visit(found)
    return found.seen


class _CstSuperCalls(cst.CSTVisitor):
    def __init__(self) -> None:
        self.seen = False

    def visit_Call(self, node: cst.Call) -> None:
        if type(node.func) is cst.Name and node.func.value == "super":
            self.seen = True


class _CstAttributes(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.names.add(node.attr.value)


def rebased_in_its_module(path: str, facts: Subclass, options: Options) -> bool:
    """Whether the class of another module that the file at ``path`` calls is rebased there (MGP106): that module's
    migration says so, or it is being migrated further up (and asked about this file), in which case it is when
    this file migrates."""
    from mgpu_migrate.engine import being_decided, migration_of

    module = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), facts.module))
    if being_decided(module):
        return True
    result = migration_of(module, options)
    return result is not None and result.error is None and any(
        diagnostic.code == "MGP106" and diagnostic.line == facts.line for diagnostic in result.diagnostics
    )


def callers_left(path: str, name: str, options: Options) -> str | None:
    """The first module of the project that uses class ``name`` of this file and that ``--to ddp`` leaves as it is
    (``train.py:12``, its import), else None: the class rebased on DistributedDataParallel would run there as one
    process on one GPU, where its DataParallel ran on all of them."""
    from mgpu_migrate.engine import being_decided, migration_of

    if not os.path.isfile(path):
        return None
    here = os.path.dirname(os.path.abspath(path))
    called = re.compile(rb"\b" + re.escape(name.encode()) + rb"\s*\(")
    for importer in importers_through_packages(path, name):
        try:
            data = files.read(importer.path)[0]
        except OSError:
            continue
        if called.search(data) is None or being_decided(importer.path):
            continue
        if b"mgpu_runtime" in data:
            continue  # migrated already
        result = migration_of(importer.path, options)
        if result is None or result.error is not None or not result.changed:
            return importer.where(here)
    return None
