"""Training handed to the project: a wrapped model that a call of this file gives to the project's own training
code in another module, followed there.

open-reid's scripts wrap the model and build the loaders, then ``trainer = Trainer(model, criterion)`` and
``trainer.train(epoch, train_loader, optimizer)``, whose loop (in ``reid/trainers.py``, a base class's method)
runs the backward pass; SCAN's scripts call ``scan_train(train_dataloader, model, criterion, ...)`` of
``utils/train_utils.py``. Under the runtime's contract the loop's values outside the model's ``forward`` are the
global batch's wherever the loop is, so what such a training module needs is what the file-level rules check
in a file of their own: its data split (the loader this file hands it, traced back here to where it is built),
the set-up at this file's entry point, side effects once, and none of the shapes that keep a file off DDP.

For each call of this file that hands a wrapped model to a project function or class that runs a backward
pass (``Project.trains``), the project's code is read (``ast``, as ``analysis/project.py`` reads it):

* its training loop: the innermost ``for`` loop, not one that only counts, around the backward pass or around a
  call of a method of the same object that runs it (``self._step(...)``), in the function called, or in the
  method this file calls on the object it builds (``trainer.train(...)``, looked up in the class and the
  project classes it derives from);
* the loop's data: a parameter of that function or method (``for i, inputs in enumerate(data_loader)``), or an
  attribute the class's ``__init__`` sets from one (``self.loader = loader``), and so the argument of this file's
  call that binds it; that argument is traced back in this file (``LoaderFlow.traces_from``) to the
  ``DataLoader(...)`` that built it, or to the call of a builder or a loader class out of sight
  (``get_train_dataloader(p, dataset)``), whose result the loop draws batches from;
* a *blocker*: a site in that code (the training function or method, the methods of its object it calls, the
  project's functions and classes it calls by name) that a migration of this file alone cannot make right: a
  file written or a directory made (every process would), a distributed call of its own, torch's DataParallel
  named (that module is migrated on its own), an explicit GPU (``cuda:1``, ``.cuda(0)``: every process would
  use it), an error caught around the step (each process would decide alone), or data the reading cannot
  follow. The blocker names its site as ``module:line``, seen from this file's directory.

Bounded (``_MAX_DEPTH`` methods deep, the tracing's own budget) and read only for a file that runs no backward
pass of its own and hands a model to the project's code.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import libcst as cst

from mgpu_migrate.analysis.loaders import DISTRIBUTED, LOADER
from mgpu_migrate.analysis.project import Found, project_of
from mgpu_migrate.analysis.scopes import Scope
from mgpu_migrate.diagnostics import shorten

if TYPE_CHECKING:
    from mgpu_migrate.analysis.loaders import LoaderFlow
    from mgpu_migrate.analysis.models import ModelFlow
    from mgpu_migrate.analysis.parsed import ParsedFile

_MAX_DEPTH = 4
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_ITERATION_WRAPPERS = frozenset({"enumerate", "iter", "zip"})
_EXPLICIT_GPU = re.compile(r"^cuda:\d+$")
_DATA_PARALLEL = frozenset(
    {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel.DataParallel"}
)


@dataclass(frozen=True)
class Blocker:
    """A site of the training code that keeps the project from migrating: where (``module:line``), what, and
    whether it is a site of that code to change (``in_code``) rather than something the reading cannot follow."""

    where: str
    what: str
    in_code: bool = True


@dataclass(frozen=True)
class Handover:
    """One call of this file that hands a wrapped model to the project's training code."""

    call: cst.Call  # the call given the model (``scan_train(...)``, ``Trainer(model, criterion)``)
    name: str  # what it calls (``scan_train``, ``Trainer``)
    trainer: Found  # the definition that runs the backward pass
    loop: Optional[str]  # where the training loop is (``lib/trainers.py:20``)
    entered: tuple[cst.Call, ...]  # this file's calls that run the training (for the entry point)
    # Where this file's data for the loop is split: the expression to distribute, and the DataLoader(...) it
    # comes from, or the call of the builder of another module whose dict of loaders it is (``LoaderFlow.built``
    # has it), or None (the result of a builder or of a loader class out of sight).
    split: tuple[tuple[cst.BaseExpression, Optional[cst.Call]], ...]
    blocker: Optional[Blocker]
    # Where the training code draws a progress bar (``tqdm(loader)``), ``module:line``: every process would draw it.
    progress_bars: tuple[str, ...] = ()

    @property
    def migrates(self) -> bool:
        return self.blocker is None


class HandedTraining:
    """The handovers of one file (none for a file that trains itself, or that is no file on disk)."""

    def __init__(self, analysis: ParsedFile, models: ModelFlow, loaders: LoaderFlow) -> None:
        self.analysis = analysis
        self.models = models
        self.loaders = loaders
        self.handovers: list[Handover] = []
        calls = analysis.calls
        if not models.sites or any(loaders.is_backward(call) for call in calls):
            return  # no wrap to hand over (the model flow then has no index), or a file that trains itself
        project = project_of(analysis.path)
        if project is None:
            return
        self._project = project
        self._seen_from = os.path.dirname(os.path.abspath(analysis.path))
        for call in calls:
            if not self._passes_model(call):
                continue
            qualified = analysis.resolve(call.func)
            found = project.find(qualified) if qualified else None
            trainer = project.trains(found) if found is not None else None
            if found is not None and trainer is not None:
                self.handovers.append(self._handover(call, found, trainer))

    def of(self, call: cst.Call) -> Optional[Handover]:
        return next((handover for handover in self.handovers if handover.call is call), None)

    @property
    def migrating(self) -> list[Handover]:
        return [handover for handover in self.handovers if handover.migrates]

    @property
    def training_calls(self) -> list[cst.Call]:
        """The calls of this file that run the project's training, of the handovers that migrate."""
        return [call for handover in self.migrating for call in handover.entered]

    # -- this file's side --------------------------------------------------------------------------
    def _passes_model(self, call: cst.Call) -> bool:
        scope = self.analysis.values.scope_of(call)
        return any(self.models.model_sites(arg.value, scope) for arg in call.args)

    def _handover(self, call: cst.Call, found: Found, trainer: Found) -> Handover:
        name = found.name
        runs: list[tuple[cst.Call, Found, Optional[Found]]]
        if isinstance(found.node, _FUNCTIONS):
            runs = [(call, found, None)]
        else:
            runs = [(method_call, method, found) for method_call, method in self._method_calls(call, found)]
        loop_where: Optional[str] = None
        data: list[tuple[cst.BaseExpression, Scope]] = []
        entered: list[cst.Call] = []
        blocker: Optional[Blocker] = None
        for run_call, function, cls in runs:
            loops, looping = self._loops(function, cls, 0), function
            if not loops:
                # Conv-TasNet's ``solver.train()``: its epoch loop only counts, and ``self._run_one_epoch(epoch)``
                # runs the loop over the data: the loop of the first method of the object it calls that has one.
                loops, looping = self._deeper_loops(function, cls)
            if not loops:
                continue
            entered.append(run_call)
            for loop in loops:
                loop_where = loop_where or self._where(looping, loop.lineno)
                for root in _roots(loop.iter, looping):
                    argument, why = self._argument_for(root, run_call, call, looping, cls, function)
                    if argument is None:
                        blocker = blocker or Blocker(self._where(looping, loop.lineno), why, in_code=False)
                    elif isinstance(argument, list):
                        data += argument  # the entries of a dict of loaders the loop picks from
                    else:
                        data.append(argument)
        if not entered:
            where = f"{trainer.where.rpartition(':')[0]}:{self._project.backward_line(trainer)}"
            what = (
                "no `for` loop runs around its backward pass"
                if isinstance(found.node, _FUNCTIONS)
                else "no method this file calls on it runs a `for` loop around the backward pass"
            )
            blocker = Blocker(where, what, in_code=False)
        split = self._split(data) if blocker is None else ()
        if blocker is None and isinstance(split, Blocker):
            blocker, split = split, ()
        training = [(function, cls) for run_call, function, cls in runs if run_call in entered]
        if blocker is None:
            blocker = self._first_blocker(training)
        assert not isinstance(split, Blocker)
        bars = tuple(
            dict.fromkeys(
                self._where(definition, node.lineno)
                for function, cls in training
                for definition in self._reachable(function, cls)
                if not self._made_once(definition)  # a module that migrates draws its bars on the main process
                for node in _calls(definition.node)
                if _is_progress_bar(definition.module.qualified(node.func))
            )
        )
        return Handover(call, name, trainer, loop_where, tuple(entered), tuple(split), blocker, bars)

    def _deeper_loops(self, function: Found, cls: Optional[Found]) -> tuple[list[ast.For], Found]:
        """The training loops of the first method of the object that ``function`` calls in turn and that has one,
        with that method (none, and ``function``, when none has)."""
        for method in self._reachable(function, cls)[1:]:
            loops = self._loops(method, cls, 0)
            if loops:
                return loops, method
        return [], function

    def _method_calls(self, construction: cst.Call, cls: Found) -> list[tuple[cst.Call, Found]]:
        """The calls of this file of a method on the object ``construction`` builds (``trainer.train(...)``,
        ``Trainer(...).fit()``), each with the method's definition (in the class or a project base)."""
        values = self.analysis.values
        found = []
        for call in self.analysis.calls:
            func = call.func
            if type(func) is not cst.Attribute:
                continue
            owner = func.value
            if owner is not construction and not any(
                value is construction for value in values.of(owner, values.scope_of(call))
            ):
                continue
            method = self._method(cls, func.attr.value, 0)
            if method is not None:
                found.append((call, method))
        return found

    def _argument_for(
        self,
        root: ast.expr,
        run_call: cst.Call,
        construction: cst.Call,
        function: Found,
        cls: Optional[Found],
        called: Found,
    ) -> tuple[Optional[tuple[cst.BaseExpression, Scope]] | list[tuple[cst.BaseExpression, Scope]], str]:
        """The expression of this file (and its scope) that the loop's data ``root`` is (for an entry of a dict the
        function is given, every entry it may be), or None and why not.
        ``function`` holds the loop; ``called``, the method this file calls (the same, or one that calls it)."""
        code = _short(root, 30)
        implicit = 1 if cls is not None and not _is_static(function.node) else 0
        scope = self.analysis.values.scope_of(run_call)
        if isinstance(root, ast.Name):
            if function is not called:
                if root.id in _parameters(function.node):
                    return None, f"its data `{code}` is a parameter of `{function.name}`, which `{called.name}` passes it"
                return None, f"its data `{code}` is no parameter of `{function.name}`"
            argument = _bound(run_call, function.node, root.id, implicit)
            if argument is not None:
                return (argument, scope), ""
            if root.id in _parameters(function.node):
                return None, f"its data `{code}` is not passed by this file's call (line {self._line(run_call)})"
            return None, f"its data `{code}` is no parameter of `{function.name}`"
        if isinstance(root, ast.Subscript) and isinstance(root.value, ast.Name) and function is called:
            # The transfer-learning tutorial's `train_model(model, dataloaders, ...)` looping over
            # `dataloaders[phase]`: every entry of the dict this file passes that the key may pick.
            container, why = self._argument_for(root.value, run_call, construction, function, cls, called)
            if container is None or isinstance(container, list):
                return None, why or f"its data `{code}` is an entry of a dict not followed here"
            value, value_scope = container
            entries = self.analysis.values.container_entries(value, value_scope)
            if not entries and self.loaders.built_entries(value, value_scope) is not None:
                return [(value, value_scope)], ""  # the dict of loaders a builder returns: split as a whole
            if not entries:
                return None, f"its data `{code}` is an entry of `{shorten(self.analysis.code_of(value), 30)}`, not followed here"
            return entries, ""
        attribute = _self_attribute(root, function.node) if cls is not None else None
        if cls is not None and attribute is not None:
            init = self._method(cls, "__init__", 0)
            stored = _set_from_parameter(init, attribute.attr) if init is not None else None
            argument = _bound(construction, init.node, stored[0], 1) if init is not None and stored else None
            if argument is not None and stored is not None and stored[1] is not None:
                # ``self.tr_loader = data["tr_loader"]``: that entry of the dict this file builds and passes.
                return self._entry(argument, stored[1], self.analysis.values.scope_of(construction), code)
            if argument is not None:
                return (argument, scope), ""
        return None, f"its data `{code}` is no parameter of `{function.name}`"

    def _entry(
        self, argument: cst.BaseExpression, key: str, scope: Scope, code: str
    ) -> tuple[Optional[tuple[cst.BaseExpression, Scope]], str]:
        """The value at ``key`` of the dict display ``argument`` is, or is stored in once (``data = {...}``),
        when nothing in this file stores into that dict by key."""
        values = self.analysis.values
        stored = [(argument, scope)] if type(argument) is cst.Dict else values.assigned_only(argument, scope) or []
        written = type(argument) is cst.Name and any(
            type(assignment.target) is cst.Subscript
            and type(assignment.target.value) is cst.Name
            and assignment.target.value.value == argument.value
            for assignment in values.index.assignments
        )
        dictionary, dictionary_scope = stored[0] if len(stored) == 1 else (None, scope)
        if type(dictionary) is cst.Dict and not written:
            for element in dictionary.elements:
                if (
                    type(element) is cst.DictElement
                    and type(element.key) is cst.SimpleString
                    and element.key.evaluated_value == key
                ):
                    return (element.value, dictionary_scope), ""
        return None, f"its data `{code}` is an entry of `{shorten(self.analysis.code_of(argument), 30)}` not followed here"

    def _split(
        self, data: list[tuple[cst.BaseExpression, Scope]]
    ) -> tuple[tuple[cst.BaseExpression, Optional[cst.Call]], ...] | Blocker:
        """Where each piece of data is distributed: the step closest to where it is built that no loop of this
        file reads (an evaluation loop over the same loader keeps it whole); a Blocker when one cannot be."""
        flow = self.loaders
        local = {id(step) for trace in flow.traces for step in trace.path}
        points: list[tuple[cst.BaseExpression, Optional[cst.Call]]] = []
        for expr, scope in data:
            builder = flow.built_entries(expr, scope)
            if builder is not None:
                if all(expr is not other for other, _ in points):
                    points.append((expr, builder))
                continue
            for path, origin, kind in flow.traces_from(expr, scope):
                if kind == DISTRIBUTED:
                    continue
                if kind == LOADER or (path and type(path[-1]) is cst.Call):
                    point = next((step for step in reversed(path) if id(step) not in local), path[0])
                    if all(point is not other for other, _ in points):
                        points.append((point, origin if kind == LOADER else None))
                    continue
                what = f"its data, `{shorten(self.analysis.code_of(expr), 30)}` here, is not followed to a loader"
                return Blocker(f"{os.path.basename(self.analysis.path)}:{self._line(expr)}", what, in_code=False)
        return tuple(points)

    def _line(self, node: cst.CSTNode) -> int:
        return self.analysis.position(node)[0]

    # -- the project's side ------------------------------------------------------------------------
    def _where(self, found: Found, line: int) -> str:
        return f"{os.path.relpath(found.module.path, self._seen_from)}:{line}"

    def _method(self, cls: Found, name: str, depth: int) -> Optional[Found]:
        """The method ``name`` of a project class, or of the first project class it derives from that has it."""
        assert isinstance(cls.node, ast.ClassDef)
        for statement in cls.node.body:
            if isinstance(statement, _FUNCTIONS) and statement.name == name:
                return Found(cls.module, statement, cls.seen_from)
        if depth >= _MAX_DEPTH:
            return None
        for base in cls.node.bases:
            _, definition = self._project.resolve_in(cls, base, depth)
            if definition is not None and isinstance(definition.node, ast.ClassDef) and definition.node is not cls.node:
                method = self._method(definition, name, depth + 1)
                if method is not None:
                    return method
        return None

    def _self_calls(self, function: Found, cls: Optional[Found]) -> list[tuple[ast.Call, Found]]:
        """The calls ``self.m(...)`` in a method, with the method each runs (looked up from the object's class)."""
        if cls is None or not isinstance(function.node, _FUNCTIONS):
            return []
        found = []
        for call in _calls(function.node):
            attribute = _self_attribute(call.func, function.node)
            if attribute is not None:
                method = self._method(cls, attribute.attr, 0)
                if method is not None and method.node is not function.node:
                    found.append((call, method))
        return found

    def _reaches_backward(self, function: Found, cls: Optional[Found], depth: int) -> bool:
        if any(_is_backward(call) for call in _calls(function.node)):
            return True
        return depth < _MAX_DEPTH and any(
            self._reaches_backward(method, cls, depth + 1) for _, method in self._self_calls(function, cls)
        )

    def _loops(self, function: Found, cls: Optional[Found], depth: int) -> list[ast.For]:
        """The training loops of a function or method: the innermost ``for`` loop that does not only count around
        each backward pass, or around each call of a method of the object that runs one."""
        steps = [call for call in _calls(function.node) if _is_backward(call)]
        steps += [call for call, method in self._self_calls(function, cls) if self._reaches_backward(method, cls, depth + 1)]
        parents = _parents(function.node)
        loops: list[ast.For] = []
        for step in steps:
            node: Optional[ast.AST] = step
            while node is not None and node is not function.node:
                node = parents.get(id(node))
                if isinstance(node, ast.For) and not _counts(node.iter) and node not in loops:
                    loops.append(node)
                    break
        return loops

    def _reachable(self, function: Found, cls: Optional[Found]) -> list[Found]:
        """The training function or method and the methods of its object it calls, ``_MAX_DEPTH`` deep."""
        found = [function]
        for definition in found:
            if len(found) > 16:
                break
            for _, method in self._self_calls(definition, cls):
                if all(method.node is not other.node for other in found):
                    found.append(method)
        return found

    def _first_blocker(self, runs: Sequence[tuple[Found, Optional[Found]]]) -> Optional[Blocker]:
        for function, cls in runs:
            for definition in self._reachable(function, cls):
                blocker = self._blocker_in(definition)
                if blocker is not None:
                    return blocker
        return None

    def _blocker_in(self, definition: Found) -> Optional[Blocker]:
        """The first site of one definition that the migration of this file cannot make right."""
        project, module = self._project, definition.module
        sites: list[tuple[int, str]] = []
        once = self._made_once(definition)
        written = project.writes(definition) if not once else None
        if written is not None:
            verb = "makes or deletes directories" if written.directory else "writes files"
            sites.append((written.line, f"`{written.call}` {verb} on every process"))
        for node in ast.walk(definition.node):
            if isinstance(node, ast.Call):
                qualified = module.qualified(node.func) or ""
                if qualified.startswith("torch.distributed.") or qualified == "torch.nn.parallel.DistributedDataParallel":
                    sites.append((node.lineno, f"`{qualified}(...)` is a distributed call of its own"))
                elif _explicit_gpu_call(node):
                    sites.append((node.lineno, f"`{_short(node)}` names a GPU every process would use"))
                elif isinstance(node.func, (ast.Name, ast.Attribute)) and qualified and not qualified.startswith(
                    ("torch.", "builtins.")
                ):
                    callee = self._called(definition, node.func)
                    helper = project.writes(callee) if callee is not None and not once else None
                    if helper is not None:
                        verb = "makes or deletes directories" if helper.directory else "writes files"
                        sites.append((node.lineno, f"`{_short(node.func)}(...)` {verb} on every process"))
            elif isinstance(node, (ast.Name, ast.Attribute)) and module.qualified(node) in _DATA_PARALLEL:
                sites.append((node.lineno, f"`{ast.unparse(node)}` names torch's DataParallel, which stays there"))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _EXPLICIT_GPU.match(node.value):
                sites.append((node.lineno, f"`{node.value!r}` names a GPU every process would use"))
            elif isinstance(node, ast.Try) and node.handlers and any(
                _is_backward(call) or _is_step(call) for part in node.body for call in _calls(part)
            ):
                sites.append((node.lineno, "an error caught around the step lets each process skip it alone"))
        if not sites:
            return None
        line, what = min(sites)
        return Blocker(self._where(definition, line), what)

    def _made_once(self, definition: Found) -> bool:
        return migrates_with(definition.module.path, self.analysis.path)

    def _called(self, definition: Found, func: ast.expr) -> Optional[Found]:
        """The project's function or class a call in ``definition`` names."""
        return self._project.resolve_in(definition, func)[1]


def migrates_with(module: str, here: str) -> bool:
    """Whether the project module at ``module``, whose code the file at ``here`` runs, is migrated itself
    (``Program.handed``: Conv-TasNet's ``solver.py``, whose ``Solver`` its ``train.py`` is handed the model), so
    that its files and directories are written once there, by its own migration."""
    from mgpu_migrate.engine import being_decided, migration_of  # each module's verdict is its own migration's

    path = os.path.abspath(module)
    if path == os.path.abspath(here):
        return False
    if being_decided(path):
        return True
    result = migration_of(path)
    return result is not None and result.changed and result.error is None


# -- reading a definition ------------------------------------------------------------------------------
def _calls(node: ast.AST) -> list[ast.Call]:
    return [child for child in ast.walk(node) if isinstance(child, ast.Call)]


def _parents(node: ast.AST) -> dict[int, ast.AST]:
    return {id(child): parent for parent in ast.walk(node) for child in ast.iter_child_nodes(parent)}


def _is_backward(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr == "backward"


def _is_step(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr == "step" and not call.args


def _counts(iterable: ast.expr) -> bool:
    """A loop that only counts: ``range(...)``, ``enumerate(range(...))``, ``trange(...)``."""
    while isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and iterable.func.id in ("enumerate", "reversed"):
        if not iterable.args:
            return False
        iterable = iterable.args[0]
    if isinstance(iterable, ast.Constant):
        return True
    if not isinstance(iterable, ast.Call):
        return False
    func = iterable.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name in ("range", "trange", "count")


def _roots(iterable: ast.expr, function: Found, depth: int = 0) -> list[ast.expr]:
    """What a loop iterates, iteration wrappers removed: ``data_loader`` of ``enumerate(data_loader)``, of
    ``tqdm(data_loader, ...)``, both loaders of ``zip(a, b)``; a local name the function binds once, what it
    binds (``data_loader = self.tr_loader if not cross_valid else self.cv_loader``: both)."""
    if isinstance(iterable, ast.IfExp):
        return _roots(iterable.body, function, depth) + _roots(iterable.orelse, function, depth)
    if isinstance(iterable, ast.Name) and depth < _MAX_DEPTH and iterable.id not in _parameters(function.node):
        bound = _bound_once(function.node, iterable.id)
        if bound is not None:
            return _roots(bound, function, depth + 1)
    if isinstance(iterable, ast.Call) and iterable.args:
        func = iterable.func
        qualified = function.module.qualified(func) or ""
        if isinstance(func, ast.Name) and func.id in _ITERATION_WRAPPERS and func.id not in function.module.imports:
            arguments = iterable.args if func.id == "zip" else iterable.args[:1]
            return [root for argument in arguments for root in _roots(argument, function, depth)]
        if qualified.split(".")[0] == "tqdm" and qualified.endswith(".tqdm"):
            return _roots(iterable.args[0], function, depth)
    return [iterable]


def _bound_once(function: ast.AST, name: str) -> Optional[ast.expr]:
    """What ``name = value``, the one binding of the local ``name`` in ``function`` (its nested definitions
    aside), stores; None when anything else binds it (a loop, ``with``, an augmented or unpacking assignment)."""
    values: list[ast.expr] = []
    others = 0
    pending = list(ast.iter_child_nodes(function))
    while pending:
        node = pending.pop()
        if isinstance(node, (*_FUNCTIONS, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, (ast.Store, ast.Del)):
            others += 1
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == name
        ):
            values.append(node.value)
        pending.extend(ast.iter_child_nodes(node))
    return values[0] if len(values) == 1 and others == 1 else None


def _parameters(function: ast.AST) -> list[str]:
    if not isinstance(function, _FUNCTIONS):
        return []
    arguments = function.args
    return [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]


def _is_static(function: ast.AST) -> bool:
    return isinstance(function, _FUNCTIONS) and any(
        isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list
    )


def _bound(call: cst.Call, function: ast.AST, name: str, implicit: int) -> Optional[cst.BaseExpression]:
    """The argument ``call`` binds to the parameter ``name`` of ``function`` (None: not passed, or passed
    through ``*`` or ``**``, which the tool cannot read)."""
    if not isinstance(function, _FUNCTIONS):
        return None
    arguments = function.args
    positional = [a.arg for a in (*arguments.posonlyargs, *arguments.args)][implicit:]
    index = 0
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is not None:
            if arg.keyword.value == name:
                return arg.value
            continue
        if index < len(positional) and positional[index] == name:
            return arg.value
        index += 1
    return None


def _self_attribute(node: ast.expr, function: ast.AST) -> Optional[ast.Attribute]:
    """``node`` when it is ``self.name`` (the method's first parameter's attribute)."""
    if not isinstance(function, _FUNCTIONS) or not function.args.args or _is_static(function):
        return None
    first = function.args.args[0].arg
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == first:
        return node
    return None


def _set_from_parameter(init: Found, attribute: str) -> Optional[tuple[str, Optional[str]]]:
    """The parameter ``__init__`` stores in ``self.<attribute>``, if it stores only that: ``self.loader = loader``
    gives ``("loader", None)``, ``self.tr_loader = data["tr_loader"]`` (an entry of a dict it is given, by a
    constant key) gives ``("data", "tr_loader")``."""
    stored = []
    for node in ast.walk(init.node):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                found = _self_attribute(target, init.node)
                if found is not None and found.attr == attribute:
                    stored.append(node.value)
    if len(stored) != 1:
        return None
    value, parameters = stored[0], _parameters(init.node)
    if isinstance(value, ast.Name) and value.id in parameters:
        return value.id, None
    if (
        isinstance(value, ast.Subscript)
        and isinstance(value.value, ast.Name)
        and value.value.id in parameters
        and isinstance(value.slice, ast.Constant)
        and isinstance(value.slice.value, str)
    ):
        return value.value.id, value.slice.value
    return None


def _explicit_gpu_call(call: ast.Call) -> bool:
    """``.cuda(0)``, ``.to(1)``, ``torch.device('cuda', 0)``: a GPU chosen by its number."""
    func = call.func
    number = next(
        (arg for arg in [*call.args, *(k.value for k in call.keywords if k.arg in ("device", "index"))] if _is_int(arg)),
        None,
    )
    if number is None:
        return False
    if isinstance(func, ast.Attribute) and func.attr in ("cuda", "to"):
        return True
    return ast.unparse(func) in ("torch.device", "device") and any(
        isinstance(arg, ast.Constant) and arg.value == "cuda" for arg in call.args
    )


def _is_progress_bar(qualified: Optional[str]) -> bool:
    parts = (qualified or "").split(".")
    return len(parts) > 1 and parts[0] == "tqdm" and parts[-1] in ("tqdm", "trange")


def _is_int(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _short(node: ast.AST, limit: int = 40) -> str:
    code = " ".join(ast.unparse(node).split())
    return code if len(code) <= limit else code[: limit - 3] + "..."


__all__ = ["Blocker", "Handover", "HandedTraining", "migrates_with"]
