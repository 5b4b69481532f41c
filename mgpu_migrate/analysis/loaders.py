"""Which loaders feed training: from each ``for`` loop back to the ``DataLoader(...)`` that built its data.

A *training loop* is the innermost ``for`` loop over a loader around a ``.backward()`` call, counting the
loops around the calls of this file's functions that make it (``for x, y in loader: step(x, y)``, where
``step`` calls ``loss.backward()``); when no loop is over a loader, the innermost one that does not just
count (``range(...)``). Any other ``for`` loop over a loader is an evaluation loop.

A loop may train only for some callers: ``def run_epoch(loader, train)`` with ``if train:
loss.backward()`` inside. Such a test of a parameter is settled at each call from the literal it passes
(``run_epoch(val_loader, train=False)`` evaluates); data that reaches the loop through a call the tool
cannot settle is marked *unsure*: neither training nor evaluation data.

From a loop's iterable the analysis walks back through what the file shows: ``enumerate``/``iter``/
``zip``/``tqdm`` around it, assignments (also unpacked from a tuple a function returns), attributes of
``self`` set in another method, parameters bound at the call sites of this file's functions, and the
return values of this file's functions, to the ``DataLoader(...)`` call that built the loader (its
*origin*). Each step is recorded, so a rule can wrap the loader at the point closest to its origin that
feeds training only.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import libcst as cst

from mgpu_migrate.analysis.scopes import FlowIndex, Place, Scope
from mgpu_migrate.analysis.tree import contains

if TYPE_CHECKING:
    from mgpu_migrate.analysis.parsed import ParsedFile

DATA_LOADERS = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
DISTRIBUTE_LOADER = "mgpu_runtime.distribute_loader"
DISTRIBUTE_LOADERS = "mgpu_runtime.distribute_loaders"  # each loader of a dict of them
# BUILT: the origin is a call of a function of another module of the project that returns a ``DataLoader(...)``
# (WaveRNN's ``train_set, test_set = get_vocoder_datasets(...)``), read there (``built_loader``).
LOADER, DISTRIBUTED, BUILT = "loader", "distributed", "built"
# How an iterable of batches is usually named, to tell the data loop from `for model in models` when the
# data cannot be followed to a loader.
_DATA_WORDS = re.compile(r"load|data|batch|iter|\bdl\b", re.IGNORECASE)


@dataclass(frozen=True)
class LoaderTrace:
    """One way a loop's data comes from an origin.

    ``path`` runs from the loop's iterable (iteration wrappers removed) back to the origin; ``origin`` is the
    ``DataLoader(...)`` (``kind`` LOADER) or ``mgpu_runtime.distribute_loader(...)`` (DISTRIBUTED) call, the call
    of a project function of another module that returns a ``DataLoader`` (BUILT, ``built_loader``; the path
    then ends at the call, or, for a tuple the call returns, at the name its part is stored in), or None when the walk found no loader (``range(...)``, a parameter nothing in the file binds).
    ``unsure`` is the test of an ``if train:`` that decides whether the loop trains on this data when the
    tool cannot tell (``training`` is then False, but the loop is no evaluation loop either).
    """

    loop: cst.For | cst.CompFor
    training: bool
    path: tuple[cst.BaseExpression, ...]
    origin: Optional[cst.Call]
    kind: Optional[str]
    unsure: Optional[cst.BaseExpression] = None


@dataclass(frozen=True)
class BuiltLoader:
    """A ``DataLoader(...)`` a project function of another module builds and returns: where it is built
    (``path:line``), and the first random draw of its module (``path:line``, the call), which a split by rows
    would draw for each process's rows only (a ``collate_fn`` cutting a random window of each sample), or None."""

    where: str
    draw: Optional[tuple[str, str]]
    sampler: Optional[str] = None  # the keyword of a sampler of its own (``sampler``, ``batch_sampler``)
    # A dict of loaders (pytorch_classifiers' ``generate_data``: ``{x: DataLoader(...) for x in ['train', 'val']}``),
    # not one loader: each of its entries is split.
    entries: bool = False


# Top-level names of what is no module of the project: a builder there is not read.
_NOT_THE_PROJECT = frozenset({"torch", "torchvision", "mgpu_runtime", "numpy", "builtins", "os", "sys", "math"})
_SPELLED_DRAW = re.compile(r"^(np|numpy)\.random\.(\w+)$")


def passed_on(cls: ast.ClassDef) -> Optional[tuple[int, str]]:
    """For a project class whose instances iterate what their constructor was given, item for item (flownet2's
    ``IteratorTimer(data_loader)``: ``__iter__`` returns ``self`` and ``__next__`` returns ``next(self.iterator)``
    of ``self.iterator = self.iterable.__iter__()``, timing the draw): the position (after ``self``) and the
    name of that parameter; None for any other class (one that changes, drops or adds items)."""
    if cls.bases or cls.keywords or cls.decorator_list:
        return None
    methods = {node.name: node for node in cls.body if isinstance(node, ast.FunctionDef)}
    init, iterate = methods.get("__init__"), methods.get("__iter__")
    if init is None or iterate is None or init.args.vararg or init.args.kwarg:
        return None
    parameters = [argument.arg for argument in init.args.args]
    # self.NAME -> the parameter it holds (the iterable), or the parameter an iterator over it iterates
    held: dict[str, str] = {}
    iterators: dict[str, str] = {}

    def iterable_of(node: ast.expr) -> Optional[str]:
        if isinstance(node, ast.Name) and node.id in parameters[1:]:
            return node.id
        if _on_self(node, parameters[0]) and node.attr in held:  # type: ignore[attr-defined]
            return held[node.attr]  # type: ignore[attr-defined]
        return None

    def iterator_of(node: ast.expr) -> Optional[str]:
        if not isinstance(node, ast.Call) or node.keywords:
            return None
        if isinstance(node.func, ast.Name) and node.func.id == "iter" and len(node.args) == 1:
            return iterable_of(node.args[0])
        if isinstance(node.func, ast.Attribute) and node.func.attr == "__iter__" and not node.args:
            return iterable_of(node.func.value)
        return None

    for statement in init.body:
        if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
            continue
        target = statement.targets[0]
        if not _on_self(target, parameters[0]):
            continue
        name = target.attr  # type: ignore[attr-defined]
        if iterable_of(statement.value) is not None:
            held[name] = iterable_of(statement.value)  # type: ignore[assignment]
        elif iterator_of(statement.value) is not None:
            iterators[name] = iterator_of(statement.value)  # type: ignore[assignment]
    # Nothing else may rebind them.
    for method in methods.values():
        for node in ast.walk(method):
            stored = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in stored:
                if method is not init and isinstance(target, ast.Attribute) and target.attr in {*held, *iterators}:
                    return None
    own = iterate.args.args[0].arg if iterate.args.args else None
    returns = [node for node in ast.walk(iterate) if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom))]
    if len(returns) == 1 and isinstance(returns[0], ast.Return) and returns[0].value is not None:
        value = returns[0].value
        if isinstance(value, ast.Name) and value.id == own:
            parameter = _next_of(methods.get("__next__") or methods.get("next"), iterators)
        else:
            parameter = iterator_of(value) if own == parameters[0] else None
            if parameter is None and _on_self(value, own) and value.attr in iterators:  # type: ignore[attr-defined]
                parameter = iterators[value.attr]  # type: ignore[attr-defined]
    elif len(returns) == 1 and isinstance(returns[0], ast.YieldFrom) and own == parameters[0]:
        parameter = iterable_of(returns[0].value) or (iterators.get(returns[0].value.attr) if _on_self(returns[0].value, own) else None)  # type: ignore[attr-defined]
    else:
        return None
    if parameter is None:
        return None
    return parameters.index(parameter) - 1, parameter


def _on_self(node: ast.expr, own: Optional[str]) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == own


def _next_of(method: Optional[ast.FunctionDef], iterators: dict[str, str]) -> Optional[str]:
    """The parameter whose iterator ``__next__`` draws from and returns as it is (``return next(self.iterator)``,
    or ``n = next(self.iterator); ...; return n``), else None."""
    if method is None or not method.args.args:
        return None
    own = method.args.args[0].arg

    def drawn(node: ast.expr) -> Optional[str]:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "next"
            and len(node.args) == 1
            and not node.keywords
            and _on_self(node.args[0], own)
        ):
            return iterators.get(node.args[0].attr)  # type: ignore[attr-defined]
        return None

    names: dict[str, Optional[str]] = {}
    for node in ast.walk(method):
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return None
        for target in node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For)) else []:
            if isinstance(target, ast.Name):
                # bound once, to a draw; bound again (or otherwise), no longer the item
                names[target.id] = drawn(node.value) if isinstance(node, ast.Assign) and target.id not in names else None
    found = set()
    for node in ast.walk(method):
        if isinstance(node, ast.Return):
            if node.value is None:
                return None
            value = drawn(node.value) if not isinstance(node.value, ast.Name) else names.get(node.value.id)
            if value is None:
                return None
            found.add(value)
    return found.pop() if len(found) == 1 else None


def returned_loader(
    module, function: ast.FunctionDef, position: Optional[int], path: str, project=None
) -> Optional[BuiltLoader]:
    """The ``DataLoader(...)`` ``function`` (of the project ``module``) returns, at ``position`` of the tuple it
    returns when one is given: built in the ``return`` itself, or in the function's one assignment of the name it
    returns; or the dict of loaders it returns there (``{x: DataLoader(...) for x in phases}``, or a display whose
    every value is one), read through its loaders (``entries``). ``project``: where the classes of other modules
    its datasets are built from are read (``pascal.VOCSegmentation(args, split='train')``)."""
    from mgpu_migrate.analysis.draws import TORCH_DRAWS, drawing_transform, numpy_draw
    from mgpu_migrate.analysis.project import Found as project_found

    # Every `return` of it (pytorch-deeplab-xception's make_data_loader returns the same four names in each
    # dataset's branch), and every value the name it returns is given (each branch builds its own loader).
    returned: list[ast.expr] = []
    for found in ast.walk(function):
        if not isinstance(found, ast.Return) or found.value is None:
            continue
        value = found.value
        if position is not None:
            if not isinstance(value, (ast.Tuple, ast.List)) or position >= len(value.elts):
                return None
            value = value.elts[position]
        stored = _stored(function, value.id) if isinstance(value, ast.Name) else [value]
        if not stored:
            return None
        returned.extend(node for node in stored if all(node is not other for other in returned))
    kinds = {isinstance(value, (ast.DictComp, ast.Dict)) for value in returned}
    if len(kinds) != 1:
        return None
    entries = kinds == {True}
    loaders = []
    for value in returned:
        if isinstance(value, ast.DictComp):
            value = value.value
        loaders += value.values if isinstance(value, ast.Dict) else [value]
    calls = [loader for loader in loaders if isinstance(loader, ast.Call) and module.qualified(loader.func) in DATA_LOADERS]
    if not calls or len(calls) != len(loaders):
        return None
    draw = None
    read = [found for loader in calls for found in _per_batch(module, function, loader, project, path)]
    for owner, definition, where in read:
        for node in _per_sample_nodes(definition):
            if isinstance(node, ast.Call) and not any(keyword.arg == "generator" for keyword in node.keywords):
                # A name the module's imports do not bind (numpy through `from utils.dsp import *`): by its spelling.
                qualified = owner.qualified(node.func) or _SPELLED_DRAW.sub(r"numpy.random.\2", ast.unparse(node.func))
                # and a transform built there that draws per sample (pytorch_classifiers' RandomResizedCrop)
                drawn = numpy_draw(qualified) or qualified.startswith(TORCH_DRAWS) or drawing_transform(qualified)
                if drawn and (draw is None or node.lineno < int(draw[0].rpartition(":")[2])):
                    draw = (f"{where}:{node.lineno}", ast.unparse(node))
    for owner, definition, _ in read if project is not None else ():
        # a draw the dataset's class reaches for each sample: its bases' methods, the project functions they call,
        # the objects they keep (RAFT's FlowDataset.__getitem__ calling its FlowAugmentor, which draws from numpy)
        if draw is None and isinstance(definition, ast.ClassDef):
            seen_from = os.path.dirname(os.path.abspath(project.path))
            made = project.sample_draw(project_found(owner, definition, seen_from))
            if made is not None:
                draw = (f"{os.path.relpath(made.path, seen_from)}:{made.line}", made.call)
    samplers = (keyword.arg for loader in calls for keyword in loader.keywords if keyword.arg in ("sampler", "batch_sampler"))
    return BuiltLoader(f"{path}:{calls[0].lineno}", draw, next(samplers, None), entries)


def _per_sample_nodes(definition: ast.AST):
    """The nodes of a definition that run for each sample: a class's, but those of its ``__init__`` (run once, when
    the dataset is built); a function's all."""
    if not isinstance(definition, ast.ClassDef):
        yield from ast.walk(definition)
        return
    for statement in definition.body:
        if not (isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == "__init__"):
            yield from ast.walk(statement)


def _per_batch(module, function: ast.FunctionDef, loader: ast.Call, project=None, path: str = "") -> list[tuple]:
    """What runs for each batch of the loader ``function`` builds, each as (its module, its definition, its path):
    its ``collate_fn`` (a function of the module) and its dataset's class (built in the call, or in the function's
    one assignment of the name given), else the whole module (a dataset or collate function out of sight may draw
    anything), with the project class of another module the dataset is built from when ``project`` shows it."""
    given = {keyword.arg: keyword.value for keyword in loader.keywords}
    dataset = given.get("dataset", loader.args[0] if loader.args else None)
    collate = given.get("collate_fn")
    found: list[tuple] = []
    whole = [(module, definition, path) for definition in module.definitions.values()]
    values: list[ast.expr] = []
    for value in (dataset, collate):
        if isinstance(value, ast.Name) and value.id not in module.definitions:
            values += _stored(function, value.id) or [value]  # each dataset a branch may give it
        elif value is not None:
            values.append(value)
    for value in values:
        if isinstance(value, ast.Lambda):  # `collate_fn=lambda batch: collate_tts(batch, r)`
            called = [
                module.definitions.get(node.func.id)
                for node in ast.walk(value.body)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            ]
            if not called or None in called:
                return whole
            found.extend((module, definition, path) for definition in called)
            continue
        if isinstance(value, ast.Call):
            found.extend(_given_per_sample(module, function, value, project, path))
            value = value.func
        definition = module.definitions.get(value.id) if isinstance(value, ast.Name) else None
        if definition is None:
            found += [entry for entry in whole if entry not in found] + _elsewhere(module, value, project)
            continue
        found.append((module, definition, path))
    return found


def _given_per_sample(module, function: ast.FunctionDef, dataset: ast.Call, project=None, path: str = "") -> list[tuple]:
    """What a dataset built in the loader's call is given that may run for each sample: the project's classes and
    functions its arguments build or call (``Points(x, y, Jitter())``, or a name ``function`` assigns them to once),
    and the transforms there that draw (``transforms.RandomCrop(4)``); numbers drawn in its arguments are drawn once."""
    from mgpu_migrate.analysis.draws import drawing_transform

    given: list[tuple] = []
    for value in [*dataset.args, *(keyword.value for keyword in dataset.keywords)]:
        if isinstance(value, ast.Name):
            value = stored_once(function, value.id) or value
        for node in ast.walk(value):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Name) and node.func.id in module.definitions:
                given.append((module, module.definitions[node.func.id], path))
            elif drawing_transform(module.qualified(node.func) or ""):
                given.append((module, node, path))
            else:
                given.extend(_elsewhere(module, node.func, project))
    return given


def _elsewhere(module, func: ast.expr, project) -> list[tuple]:
    """What runs for each sample of the class or function of another module of the project that ``func`` names in
    ``module``, each as (its module, the node, its path): a function whole; a class's methods but ``__init__``, and
    the transforms that draw which ``__init__`` builds (``self.transform = tr.RandomHorizontalFlip()``), since what
    ``__init__`` draws itself is drawn once. None for a name of no project module."""
    from mgpu_migrate.analysis.draws import drawing_transform

    qualified = module.qualified(func) if project is not None else None
    if not qualified or qualified.split(".")[0].lstrip(".") in _NOT_THE_PROJECT:
        return []
    found = project.find(qualified)
    if found is None or not isinstance(found.node, (ast.ClassDef, ast.FunctionDef)):
        return []
    where = found.where.rpartition(":")[0]
    if isinstance(found.node, ast.FunctionDef):
        return [(found.module, found.node, where)]
    read = []
    for statement in found.node.body:
        if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if statement.name != "__init__":
            read.append((found.module, statement, where))
            continue
        read += [
            (found.module, node, where)
            for node in ast.walk(statement)
            if isinstance(node, ast.Call) and drawing_transform(found.module.qualified(node.func) or "")
        ]
    return read


def _stored(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> list[ast.expr]:
    """The values of ``function``'s assignments of ``name`` (``name = ...``)."""
    return [
        node.value
        for node in ast.walk(function)
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id == name
    ]


def stored_once(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> Optional[ast.expr]:
    """The value of ``function``'s one assignment of ``name`` (``name = ...``), None when there is not exactly one."""
    stored = _stored(function, name)
    return stored[0] if len(stored) == 1 else None


@dataclass(frozen=True)
class _ForLoop:
    node: cst.For | cst.CompFor
    iterable: cst.BaseExpression
    scope: Scope


@dataclass(frozen=True)
class _Guard:
    """An ``if`` between a loop and a backward pass whose test reads a parameter of its function
    (``if train:``), so whether the pass runs depends on the caller; ``negated`` when the pass is in the
    ``else`` part."""

    test: cst.BaseExpression
    negated: bool
    function: cst.FunctionDef


@dataclass(frozen=True)
class _Way:
    """How a backward pass is reached from inside a loop: ``guards`` are those in the loop's own function,
    which the loop's caller settles; ``unsure`` is the test of a guard further in that no caller settled."""

    backward: cst.Call
    guards: tuple[_Guard, ...]
    unsure: Optional[cst.BaseExpression]


# How many calls of this file's functions a backward pass is followed out through to the loops around it.
_CALL_DEPTH = 4
# Bounds on the ways in that are enumerated (see _traces_of and _loops_around): pathological files stay fast.
_TRACE_BUDGET = 64
_CHAIN_BUDGET = 64
_UNKNOWN = object()


class LoaderFlow:
    def __init__(self, analysis: ParsedFile, index: FlowIndex) -> None:
        self.analysis = analysis
        self.index = index
        self._values = analysis.values
        self._built: dict[tuple[cst.Call, Optional[int]], Optional[BuiltLoader]] = {}
        # The origins of the BUILT traces: what each builder's call returns to the loop.
        self.built: dict[cst.Call, BuiltLoader] = {}
        self._loops = {loop.node: loop for loop in self._for_loops()}
        # What each `with ITEM as name` binds, by the name's place (also read by the rules: a writer entered so).
        self.with_items = self._with_targets()
        self._traced = traced = {node: self._traces_of(loop) for node, loop in self._loops.items()}
        self._ways: dict[cst.For, list[_Way]] = {}
        for chain in self._loop_chains():
            # The data loop is the innermost loop over a loader (not `for student in students`, not the epochs).
            chosen = next((entry for entry in chain if self._over_loader(entry[0])), None)
            if chosen is None:
                data = [entry for entry in chain if not self.counts(entry[0])] or chain
                chosen = next(
                    (entry for entry in data if _DATA_WORDS.search(analysis.code_of(entry[0].iter))),
                    data[0],
                )
            self._ways.setdefault(chosen[0], []).append(chosen[1])
        self.training_loops: list[cst.For] = list(self._ways)
        # `batches.next()` (Python 2's spelling) calls that draw a training loop's batches from a loader.
        self.old_draws: list[tuple[cst.Call, tuple[cst.BaseExpression, ...]]] = []
        for node in self.training_loops:
            if not self._over_loader(node):
                traced[node] = traced[node] + self._drawn_traces(node)
        self.traces: list[LoaderTrace] = []
        for node, found in traced.items():
            if node not in self._ways and self._passes_through(node):
                continue  # `for batch in loader: yield batch`: its data is that of the loops over the generator
            for path, origin, kind in found:
                trains, unsure = self._trains(node, path) if node in self._ways else (False, None)
                if trains or unsure is not None or origin is not None:
                    self.traces.append(LoaderTrace(node, trains, path, origin, kind, unsure))

    # -- loops -------------------------------------------------------------------------------------
    def _for_loops(self) -> list[_ForLoop]:
        """Every ``for`` loop and comprehension (which can only evaluate: it holds no statement)."""
        found = []
        for loop in self.index.loops:
            slot = self.index.slots.get(loop.iterable)
            if slot is not None and type(slot.parent) in (cst.For, cst.CompFor):
                found.append(_ForLoop(slot.parent, loop.iterable, loop.scope))
        return found

    def _over_loader(self, loop: cst.For) -> bool:
        return any(origin is not None for _, origin, _ in self._traced[loop])

    def counts(self, loop: cst.For | cst.CompFor) -> bool:
        """Whether the loop only counts (``range(...)``, ``enumerate(range(...))``, ``trange(...)``): it
        iterates no data."""
        inner = self._iterated(loop.iter, self._loops[loop].scope)
        return all(self._is_count(expr) for expr in inner)

    def _is_count(self, expr: cst.BaseExpression) -> bool:
        if type(expr) is cst.Integer:
            return True
        if type(expr) is not cst.Call:
            return False
        if type(expr.func) is cst.Name and expr.func.value in ("range", "reversed"):
            return expr.func.value == "range" or bool(expr.args) and self._is_count(expr.args[0].value)
        return (self.analysis.resolve(expr.func) or "") in ("tqdm.trange", "tqdm.auto.trange", "itertools.count")

    def _loop_chains(self) -> list[list[tuple[cst.For, _Way]]]:
        """For each ``.backward()`` call, the ``for`` loops around it, innermost first, followed out through
        the calls of this file's functions (one list per way in), each with how the call is reached from it."""
        chains = []
        for call, _ in self.index.calls:
            if self.is_backward(call):
                chains.extend(chain for chain in self._loops_around(call, call, None, frozenset()) if chain)
        return chains

    def is_backward(self, call: cst.Call) -> bool:
        func = call.func
        if type(func) is cst.Attribute and func.attr.value == "backward":
            return True
        return self.analysis.resolve(func) == "torch.autograd.backward"

    def _loops_around(self, backward, node, unsure, seen) -> list[list[tuple[cst.For, _Way]]]:
        """The ``for`` loops around ``node`` in its function, innermost first, then those around each call of
        its function that may run the backward pass."""
        tree = self.analysis.tree
        function = tree.function(node)
        loops: list[tuple[cst.For, _Way]] = []
        guards: tuple[_Guard, ...] = ()
        child = node
        for ancestor in tree.ancestors(node):
            if type(ancestor) in (cst.FunctionDef, cst.ClassDef, cst.Lambda):
                break
            if type(ancestor) in (cst.If, cst.IfExp) and child is not ancestor.test:
                guard = self._guard(ancestor, child, function)
                if guard is not None:
                    guards += (guard,)
            if type(ancestor) is cst.For and child is ancestor.body:
                loops.append((ancestor, _Way(backward, guards, unsure)))
            child = ancestor
        if function is None or function in seen or len(seen) >= _CALL_DEPTH:
            return [loops]
        if any(self._over_loader(loop) for loop, _ in loops):
            return [loops]  # the loops further out cannot be the data loop
        chains = []
        for call, _, implicit in self.index.call_sites(function):
            if len(chains) >= _CHAIN_BUDGET:
                break  # fewer ways in only make fewer loops training loops: their data is left whole
            settled = [self._holds(guard, call, implicit) for guard in guards]
            if False in settled:
                continue  # this caller does not train here
            doubt = unsure or next((g.test for g, held in zip(guards, settled) if held is None), None)
            chains.extend(loops + outer for outer in self._loops_around(backward, call, doubt, seen | {function}))
        return chains or [loops]

    # -- guards: `if train: loss.backward()` -------------------------------------------------------
    def _guard(self, branch: cst.If | cst.IfExp, child: cst.CSTNode, function) -> Optional[_Guard]:
        """The guard ``branch`` puts on a backward pass in its part ``child``: one whose test reads a
        parameter of ``function`` and whose other part makes no backward pass."""
        other = branch.orelse if child is branch.body else branch.body
        if function is None or (other is not None and contains(other, self._is_backward_node)):
            return None
        parameters = set(self.index.parameters(function)) - {"self", "cls"}
        attributes = {id(a.attr) for a in contains(branch.test, lambda n: type(n) is cst.Attribute)}
        read = {n.value for n in contains(branch.test, lambda n: type(n) is cst.Name) if id(n) not in attributes}
        if not read & parameters:
            return None
        return _Guard(branch.test, child is not branch.body, function)

    def _is_backward_node(self, node: cst.CSTNode) -> bool:
        return type(node) is cst.Call and self.is_backward(node)

    def _holds(self, guard: _Guard, call: cst.Call, implicit: int) -> Optional[bool]:
        """Whether the guard's test holds for what ``call`` passes (literals only); None when not known."""
        test, negated = guard.test, guard.negated
        while type(test) is cst.UnaryOperation and type(test.operator) is cst.Not:
            test, negated = test.expression, not negated
        if type(test) is cst.Name:
            value = self._bound(guard.function, test.value, call, implicit)
            held = _UNKNOWN if value is _UNKNOWN else bool(value)
        elif (
            type(test) is cst.Comparison
            and type(test.left) is cst.Name
            and len(test.comparisons) == 1
            and type(test.comparisons[0].operator) in (cst.Equal, cst.NotEqual, cst.Is, cst.IsNot)
        ):
            target = test.comparisons[0]
            value = self._bound(guard.function, test.left.value, call, implicit)
            other = self._literal(target.comparator)
            if value is _UNKNOWN or other is _UNKNOWN:
                held = _UNKNOWN
            else:
                held = (value == other) == (type(target.operator) in (cst.Equal, cst.Is))
        else:
            held = _UNKNOWN
        return None if held is _UNKNOWN else held != negated

    def _bound(self, function: cst.FunctionDef, name: str, call: cst.Call, implicit: int):
        """The literal value ``call`` binds to parameter ``name`` (its default when not passed), or
        _UNKNOWN."""
        place = (self.index.scopes[function], name)
        if name not in self.index.parameters(function) or self._values.stored.get(place):
            return _UNKNOWN
        for position, arg in enumerate(call.args):
            if arg.star:
                return _UNKNOWN
            if self.index.parameter_place(function, call, position, implicit) == place:
                return self._literal(arg.value)
        params = function.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            if param.name.value == name and param.default is not None:
                return self._literal(param.default)
        return _UNKNOWN

    def _literal(self, expr: cst.BaseExpression):
        try:
            return ast.literal_eval(self.analysis.code_of(expr))
        except (ValueError, SyntaxError, TypeError):
            return _UNKNOWN

    def _trains(self, loop: cst.For, path: tuple) -> tuple[bool, Optional[cst.BaseExpression]]:
        """Whether the data that reaches a training loop along ``path`` is trained on: (True, None) yes,
        (False, None) no (every way to the backward pass is switched off by the caller the data comes
        through), (False, test) when a guard with that test decides and the tool cannot tell."""
        function = self.analysis.tree.function(loop)
        caller = self._caller_on(function, path) if function is not None else None
        doubt = None
        for way in self._ways[loop]:
            settled = [self._settled(guard, caller) for guard in way.guards]
            if False in settled:
                continue
            unsure = way.unsure or next((g.test for g, held in zip(way.guards, settled) if held is None), None)
            if unsure is None:
                return True, None
            doubt = doubt or unsure
        return False, doubt

    def _settled(self, guard: _Guard, caller: Optional[tuple[cst.Call, int]]) -> Optional[bool]:
        """Whether the guard holds for the data coming in through ``caller``; for data that does not come in
        through a parameter, whether it holds for every call of its function alike."""
        if caller is not None:
            return self._holds(guard, *caller)
        held = {self._holds(guard, call, implicit) for call, _, implicit in self.index.call_sites(guard.function)}
        return held.pop() if len(held) == 1 else None

    def _caller_on(self, function: cst.FunctionDef, path: tuple) -> Optional[tuple[cst.Call, int]]:
        """The call of ``function`` whose argument the data on ``path`` comes in through."""
        sites = {id(call): (call, implicit) for call, _, implicit in self.index.call_sites(function)}
        for step in path[1:]:
            slot = self.index.slots.get(step)
            if slot is not None and slot.kind == "arg" and id(slot.parent) in sites:
                return sites[id(slot.parent)]
        return None

    def backward_calls(self, loop: cst.For) -> list[cst.Call]:
        """The backward passes that make ``loop`` a training loop."""
        return [way.backward for way in self._ways.get(loop, [])]

    # -- following data back -----------------------------------------------------------------------
    def _iterated(self, expr: cst.BaseExpression, scope: Scope) -> list[cst.BaseExpression]:
        """What an iteration wrapper iterates: the loader inside ``enumerate(loader)``, ``tqdm(loader)``."""
        if type(expr) is cst.IfExp:  # `tqdm(loader) if is_train else loader`: both are the loop's data
            return [*self._iterated(expr.body, scope), *self._iterated(expr.orelse, scope)]
        if type(expr) is not cst.Call or not expr.args:
            return [expr]
        func = expr.func
        if (
            type(func) is cst.Name
            and func.value in ("enumerate", "iter", "zip")
            and func.value not in scope.lookup(func.value).bound
        ):
            arguments = expr.args if func.value == "zip" else expr.args[:1]
            return [inner for arg in arguments if not arg.star for inner in self._iterated(arg.value, scope)]
        qualified = self.analysis.resolve(func) or ""
        if qualified.split(".")[0] == "tqdm" and qualified.endswith(".tqdm") and not expr.args[0].keyword:
            return self._iterated(expr.args[0].value, scope)
        carried = self._passed_on(expr, qualified)
        if carried is not None:  # `tools.IteratorTimer(data_loader)`: a project class that passes the items on
            return self._iterated(carried, scope)
        return [expr]

    def _passed_on(self, call: cst.Call, qualified: str) -> Optional[cst.BaseExpression]:
        """The argument of ``call`` whose items an instance of the project class it builds yields as they are
        (``passed_on``), or None."""
        if not qualified or qualified.split(".")[0].lstrip(".") in _NOT_THE_PROJECT:
            return None
        from mgpu_migrate.analysis.project import project_of

        project = project_of(self.analysis.path)
        found = project.find(qualified) if project is not None else None
        carried = passed_on(found.node) if found is not None and isinstance(found.node, ast.ClassDef) else None
        if carried is None:
            return None
        position, name = carried
        for index, arg in enumerate(call.args):
            if arg.star:
                return None
            if (arg.keyword.value == name) if arg.keyword is not None else index == position:
                return arg.value
        return None

    def _traces_of(self, loop: _ForLoop) -> list[tuple[tuple, Optional[cst.Call], Optional[str]]]:
        """The ways ``loop`` gets its data; past ``_TRACE_BUDGET`` of them (helpers calling helpers twice
        each make their number grow exponentially) the data counts as not followed, so it is left whole."""
        return self.traces_from(loop.iterable, loop.scope)

    def traces_from(self, expr: cst.BaseExpression, scope: Scope) -> list[tuple[tuple, Optional[cst.Call], Optional[str]]]:
        """The ways ``expr`` gets its data, as a loop's iterable would (``(path, origin, kind)``, within the same
        budget): also for data this file hands to a loop of the project's code (``analysis.handed``)."""
        found = []
        for trace in self._trace(expr, scope, (), frozenset()):
            if len(found) == _TRACE_BUDGET:
                return [(found[0][0][:1], None, None)]
            found.append(trace)
        return found

    def _trace(self, expr, scope, path, seen):
        """Yield ``(path, origin, kind)`` for each way ``expr`` gets its data."""
        for inner in self._iterated(expr, scope):
            yield from self._trace_value(inner, scope, path + (inner,), seen)

    def _trace_value(self, expr, scope, path, seen):
        if type(expr) is cst.Call:
            qualified = self.analysis.resolve(expr.func) or self._imported_before(expr.func)
            if qualified in DATA_LOADERS:
                yield path, expr, LOADER
                return
            if qualified in (DISTRIBUTE_LOADER, DISTRIBUTE_LOADERS):
                yield path, expr, DISTRIBUTED
                return
            callee = self.index.callee(expr, scope)
            if callee is not None and callee[0].name.value != "__init__" and callee[0] not in seen:
                fed = self._generator_feeds(callee[0], callee[1], expr)
                if fed is not None:  # `def sample_data(loader): for batch in loader: yield batch`
                    for argument in fed:
                        yield from self._trace(argument, scope, path, seen | {callee[0]})
                    if fed:
                        return
                returns = self._values.returns.get(callee[0], [])
                for value, value_scope in returns:
                    yield from self._trace(value, value_scope, path, seen | {callee[0]})
                if returns:
                    return
            built = self.built_loader(expr, None) if callee is None else None
            if built is not None and not built.entries:
                self.built[expr] = built  # `loader = get_loader(...)`, a builder of another module
                yield path, expr, BUILT
                return
            yield path, None, None
            return
        if type(expr) is cst.Subscript:
            given = self._given_by_keyword(expr, scope)
            if given is not None:  # WS-DAN's `def train(**kwargs)`: `data_loader = kwargs['data_loader']`
                for argument, call_scope in given:
                    yield from self._trace(argument, call_scope, path, seen)
                if not given or None in given:
                    yield path, None, None
                return
            yield from self._trace_entries(expr, scope, path, seen)
            return
        place = self.index.place_of(expr, scope) if type(expr) in (cst.Name, cst.Attribute) else None
        if place is None or place in seen:
            yield path, None, None
            return
        seen = seen | {place}
        found = False
        for value, value_scope, position in self._values.stored.get(place, ()):
            for part, part_scope in self._values.element(value, value_scope, position):
                found = True
                yield from self._trace(part, part_scope, path, seen)
            built = self.built_loader(value, position) if not found and type(value) is cst.Call else None
            if built is not None and not built.entries:  # a dict of loaders is no loader (``built_entries``)
                found = True  # `train_set, test_set = get_datasets(...)`, a builder of another module
                self.built[value] = built
                yield path, value, BUILT
        for argument, call_scope in self._arguments_for(place):
            found = True
            yield from self._trace(argument, call_scope, path, seen)
        for item, item_scope in self.with_items.get(place, ()):
            found = True  # `with tqdm(enumerate(loader)) as t: for x, y in t:`
            yield from self._trace(item, item_scope, path, seen)
        if not found:
            yield path, None, None

    def _trace_entries(self, expr: cst.Subscript, scope: Scope, path: tuple, seen: frozenset):
        """An entry of a dict or list of loaders: each entry it may be (``Values.entries``)."""
        base = self.index.place_of(expr.value, scope) if type(expr.value) in (cst.Name, cst.Attribute) else None
        entries = self._values.entries(expr, scope) if base is not None and base not in seen else None
        if not entries:
            yield path, None, None
            return
        for entry, entry_scope in entries:
            yield from self._trace(entry, entry_scope, path, seen | {base})

    def built_loader(self, call: cst.Call, position: Optional[int]) -> Optional[BuiltLoader]:
        """The ``DataLoader(...)`` that a function of another module of the project returns (at ``position`` of the
        tuple it returns, for an unpacking assignment), read there; None when ``call`` is no such call."""
        key = (call, position)
        if key not in self._built:
            self._built[key] = self._read_builder(call, position)
        return self._built[key]

    def built_entries(self, expr: cst.BaseExpression, scope: Scope) -> Optional[cst.Call]:
        """The call of a project builder of another module whose dict of loaders ``expr`` holds, stored once
        (``dataloaders, sizes, names = generate_data(...)``; ``built`` then has what it builds); None otherwise."""
        place = self.index.place_of(expr, scope) if type(expr) in (cst.Name, cst.Attribute) else None
        stored = self._values.stored.get(place, ()) if place is not None else ()
        if len(stored) != 1:
            return None
        value, _, position = stored[0]
        built = self.built_loader(value, position) if type(value) is cst.Call else None
        if built is None or not built.entries:
            return None
        self.built[value] = built
        return value

    def _read_builder(self, call: cst.Call, position: Optional[int]) -> Optional[BuiltLoader]:
        qualified = self.analysis.resolve(call.func)
        if qualified is None or qualified.split(".")[0].lstrip(".") in _NOT_THE_PROJECT:
            return None
        from mgpu_migrate.analysis.project import project_of

        project = project_of(self.analysis.path)
        found = project.find(qualified) if project is not None else None
        if found is None or not isinstance(found.node, ast.FunctionDef):
            return None
        return returned_loader(found.module, found.node, position, found.where.rpartition(":")[0], project)

    def _generator_feeds(self, function: cst.FunctionDef, implicit: int, call: cst.Call):
        """For a generator of this file (``recycle(loader)``, ``sample_data(loader)``), the arguments of
        ``call`` whose items it yields (``for batch in loader: yield batch``, ``yield from loader``); None for
        a function that is no generator."""
        yields = [
            node
            for node in contains(function.body, lambda n: type(n) is cst.Yield)
            if self.analysis.tree.function(node) is function
        ]
        if not yields:
            return None
        function_scope = self.index.scopes[function]
        iterated = []
        for node in yields:
            if type(node.value) is cst.From:
                iterated.append(node.value.item)
            for ancestor in self.analysis.tree.ancestors(node):
                if ancestor is function:
                    break
                if type(ancestor) is cst.For:
                    iterated.append(ancestor.iter)
        places = {
            self.index.place_of(inner, function_scope)
            for expr in iterated
            for inner in self._iterated(expr, function_scope)
            if type(inner) is cst.Name
        }
        return [
            arg.value
            for position, arg in enumerate(call.args)
            if self.index.parameter_place(function, call, position, implicit) in places
        ]

    def _imported_before(self, func: cst.BaseExpression) -> Optional[str]:
        """``data.DataLoader(...)`` where ``data`` is ``torch.utils.data`` and also a name the file stores
        later (``for ii, data in enumerate(trainloader)``): the module, when the call runs once, at module
        level, before every store of the name."""
        if type(func) is not cst.Attribute or type(func.value) is not cst.Name:
            return None
        head = func.value.value
        origins = self.analysis.bindings.imported.get(head, ())
        tree = self.analysis.tree
        if len(origins) != 1 or tree.function(func) is not None:
            return None
        if any(type(node) in (cst.For, cst.While) for node in tree.ancestors(func)):
            return None
        line = self.analysis.position(func)[0]
        place = (self.index.module_scope, head)
        for node, scope in self.index.stores.items():
            if (
                type(node) is cst.Name
                and node.value == head
                and self.index.place_of(node, scope) == place
                and (tree.function(node) is not None or self.analysis.position(node)[0] <= line)
            ):
                return None
        return self.analysis.bindings.canonical(f"{next(iter(origins))}.{func.attr.value}")

    def _drawn_traces(self, loop: cst.For) -> list[tuple[tuple, Optional[cst.Call], Optional[str]]]:
        """The ways a training loop that iterates no loader draws its batches: ``next(batches)``,
        ``batches.next()`` in its body or in the function of this file that runs its backward pass
        (``trainBatch()`` drawing from a module-level ``train_iter = iter(train_loader)``), from an iterator
        that outlives the draw."""
        tree = self.analysis.tree
        regions = [loop.body]
        for backward in self.backward_calls(loop):
            function = tree.function(backward)
            if function is not None and function is not tree.function(loop) and function not in regions:
                regions.append(function)
        found = []
        for region in regions:
            for draw in contains(region, self._is_draw):
                source = draw.args[0].value if type(draw.func) is cst.Name else draw.func.value
                if type(source) not in (cst.Name, cst.Attribute):
                    # `next(iter(loader))`: the iterator ends before the step's backward pass, and with it the
                    # distributed loader's share of the batch, so such data is not split.
                    continue
                if self._evaluates(draw, region):
                    continue
                function = tree.function(draw)
                scope = self.index.scopes[function] if function is not None else self.index.module_scope
                for path, origin, kind in self._trace(source, scope, (), frozenset()):
                    if origin is not None:
                        found.append((path, origin, kind))
                        if type(draw.func) is cst.Attribute and draw.func.attr.value == "next":
                            self.old_draws.append((draw, path))
        return found

    def _evaluates(self, draw: cst.Call, region: cst.CSTNode) -> bool:
        """A draw for evaluation inside a training step: under ``torch.no_grad()``, or under an ``if`` (``if
        step % 100 == 0:``) that runs no backward pass."""
        for ancestor in self.analysis.tree.ancestors(draw):
            if ancestor is region:
                return False
            if type(ancestor) in (cst.If, cst.Else) and not contains(ancestor, self._is_backward_node):
                return True
            if type(ancestor) is cst.With and any(
                type(item.item) is cst.Call and self.analysis.resolve(item.item.func) == "torch.no_grad"
                for item in ancestor.items
            ):
                return True
        return False

    def _passes_through(self, loop: cst.For | cst.CompFor) -> bool:
        """A loop of a generator that yields in its body (``for batch in loader: yield batch``)."""
        if type(loop) is not cst.For:
            return False
        function = self.analysis.tree.function(loop)
        yields = contains(loop.body, lambda n: type(n) is cst.Yield)
        return any(self.analysis.tree.function(node) is function for node in yields)

    def _is_draw(self, node: cst.CSTNode) -> bool:
        if type(node) is not cst.Call:
            return False
        func = node.func
        if type(func) is cst.Name:
            return func.value == "next" and len(node.args) == 1 and "next" not in self.analysis.bindings.local
        return type(func) is cst.Attribute and func.attr.value in ("next", "__next__") and not node.args

    def _with_targets(self) -> dict[Place, list[tuple[cst.BaseExpression, Scope]]]:
        """What each ``with ... as name`` binds: the item's expression (a progress bar around a loader)."""
        found: dict[Place, list[tuple[cst.BaseExpression, Scope]]] = {}
        parent = self.analysis.tree.parent
        for node, scope in self.index.stores.items():
            if type(node) is not cst.Name:
                continue
            alias = parent(node)
            item = parent(alias) if type(alias) is cst.AsName else None
            if type(item) is cst.WithItem:
                place = self.index.place_of(node, scope)
                if place is not None:
                    found.setdefault(place, []).append((item.item, scope))
        return found

    def _given_by_keyword(self, expr: cst.Subscript, scope: Scope) -> Optional[list]:
        """For ``kwargs['name']`` of a function's ``**kwargs``, the ``name=`` argument of each call of it in this
        file (``(value, scope)``; None in the list for a call that may pass it otherwise: ``**options``, or not at
        all); None when ``expr`` is no such read."""
        if type(expr.value) is not cst.Name or len(expr.slice) != 1 or type(expr.slice[0].slice) is not cst.Index:
            return None
        key = expr.slice[0].slice.value
        if type(key) is not cst.SimpleString or key.prefix:
            return None
        owner = scope.lookup(expr.value.value)
        function = owner.node
        if type(function) is not cst.FunctionDef or type(function.params.star_kwarg) is not cst.Param:
            return None
        if function.params.star_kwarg.name.value != expr.value.value:
            return None
        name = key.evaluated_value
        found: list = []
        for call, call_scope, _ in self.index.call_sites(function):
            given = [arg for arg in call.args if arg.keyword is not None and arg.keyword.value == name]
            if given and not any(arg.star == "**" for arg in call.args):
                found.append((given[0].value, call_scope))
            else:
                found.append(None)
        return found

    def _arguments_for(self, place: Place) -> list[tuple[cst.BaseExpression, Scope]]:
        """The arguments this file's calls bind to ``place`` when it is a parameter of a function."""
        owner, name = place
        function = owner.node
        if type(function) is not cst.FunctionDef or name not in self.index.parameters(function):
            return []
        found = []
        for call, call_scope, implicit in self.index.call_sites(function):
            for position, arg in enumerate(call.args):
                if self.index.parameter_place(function, call, position, implicit) == place:
                    found.append((arg.value, call_scope))
        return found

    # -- results -----------------------------------------------------------------------------------
    def feeds(self, node: cst.BaseExpression) -> set[Optional[bool]]:
        """Whether the expression feeds training loops (True), evaluation loops (False), loops that train
        only for some callers (None), or several of these."""
        return {
            None if trace.unsure is not None else trace.training
            for trace in self.traces
            if any(step is node for step in trace.path)
        }
