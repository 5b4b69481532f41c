"""Which loaders feed training: from each ``for`` loop back to the ``DataLoader(...)`` that built its data.

A *training loop* is the innermost ``for`` loop over a loader around a ``.backward()`` call (the innermost
loop at all when none is over a loader), or, when the backward pass sits in a function of this file
(``train_step(batch)``), such a loop around a call of that function. Any other ``for`` loop over a loader
is an evaluation loop.

From a loop's iterable the analysis walks back through what the file shows: ``enumerate``/``iter``/
``zip``/``tqdm`` around it, assignments (also unpacked from a tuple a function returns), attributes of
``self`` set in another method, parameters bound at the call sites of this file's functions, and the
return values of this file's functions, to the ``DataLoader(...)`` call that built the loader (its
*origin*). Each step is recorded, so a rule can wrap the loader at the point closest to its origin that
feeds training only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import libcst as cst

from mgpu_migrate.analysis.scopes import FlowIndex, Place, Scope

if TYPE_CHECKING:
    from mgpu_migrate.analysis.file import FileAnalysis

DATA_LOADERS = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
DISTRIBUTE_LOADER = "mgpu_runtime.distribute_loader"
LOADER, DISTRIBUTED = "loader", "distributed"
# How an iterable of batches is usually named, to tell the data loop from `for model in models` when the
# data cannot be followed to a loader.
_DATA_WORDS = re.compile(r"load|data|batch|iter|\bdl\b", re.IGNORECASE)


@dataclass(frozen=True)
class LoaderTrace:
    """One way a loop's data comes from an origin.

    ``path`` runs from the loop's iterable (iteration wrappers removed) back to the origin; ``origin`` is the
    ``DataLoader(...)`` (``kind`` LOADER) or ``mgpu_runtime.distribute_loader(...)`` (DISTRIBUTED) call,
    or None when the walk found no loader (``range(...)``, a parameter nothing in the file binds).
    """

    loop: cst.For | cst.CompFor
    training: bool
    path: tuple[cst.BaseExpression, ...]
    origin: Optional[cst.Call]
    kind: Optional[str]


@dataclass(frozen=True)
class _ForLoop:
    node: cst.For | cst.CompFor
    iterable: cst.BaseExpression
    scope: Scope


class LoaderFlow:
    def __init__(self, analysis: FileAnalysis, index: FlowIndex) -> None:
        self.analysis = analysis
        self.index = index
        self._values = analysis.values
        loops = {loop.node: loop for loop in self._for_loops()}
        traced = {
            node: [trace for trace in self._trace(loop.iterable, loop.scope, (), frozenset())]
            for node, loop in loops.items()
        }
        self.training_loops: list[cst.For] = []
        for chain in self._loop_chains():
            # The data loop is the innermost loop over a loader (not `for student in students`, not the epochs).
            chosen = next((loop for loop in chain if any(origin is not None for _, origin, _ in traced[loop])), None)
            if chosen is None:
                chosen = next(
                    (loop for loop in chain if _DATA_WORDS.search(analysis.module.code_for_node(loop.iter))), chain[0]
                )
            if chosen not in self.training_loops:
                self.training_loops.append(chosen)
        training = set(self.training_loops)
        self.traces: list[LoaderTrace] = [
            LoaderTrace(node, node in training, path, origin, kind)
            for node, found in traced.items()
            for path, origin, kind in found
            if node in training or origin is not None
        ]

    # -- loops -------------------------------------------------------------------------------------
    def _for_loops(self) -> list[_ForLoop]:
        """Every ``for`` loop and comprehension (which can only evaluate: it holds no statement)."""
        found = []
        for loop in self.index.loops:
            slot = self.index.slots.get(loop.iterable)
            if slot is not None and isinstance(slot.parent, (cst.For, cst.CompFor)):
                found.append(_ForLoop(slot.parent, loop.iterable, loop.scope))
        return found

    def _loop_chains(self) -> list[list[cst.For]]:
        """For each ``.backward()`` call, the ``for`` loops around it, innermost first (one list per way in)."""
        chains: list[list[cst.For]] = []
        for call, _ in self.index.calls:
            if self.is_backward(call):
                chains.extend(chain for chain in self._loops_around(call, set()) if chain)
        return chains

    def is_backward(self, call: cst.Call) -> bool:
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "backward":
            return True
        return self.analysis.resolve(func) == "torch.autograd.backward"

    def _loops_around(self, node: cst.CSTNode, seen: set) -> list[list[cst.For]]:
        """The ``for`` loops around ``node`` in its function, innermost first; when there are none, the loops
        around each call of its function."""
        tree = self.analysis.tree
        loops: list[cst.For] = []
        child = node
        for ancestor in tree.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                break
            if isinstance(ancestor, cst.For) and child is ancestor.body:
                loops.append(ancestor)
            child = ancestor
        if loops:
            return [loops]
        function = tree.function(node)
        if function is None or function in seen:
            return []
        seen.add(function)
        return [chain for call, _, _ in self.index.call_sites(function) for chain in self._loops_around(call, seen)]

    # -- following data back -----------------------------------------------------------------------
    def _iterated(self, expr: cst.BaseExpression, scope: Scope) -> list[cst.BaseExpression]:
        """What an iteration wrapper iterates: the loader inside ``enumerate(loader)``, ``tqdm(loader)``."""
        if not isinstance(expr, cst.Call) or not expr.args:
            return [expr]
        func = expr.func
        if (
            isinstance(func, cst.Name)
            and func.value in ("enumerate", "iter", "zip")
            and func.value not in scope.lookup(func.value).bound
        ):
            arguments = expr.args if func.value == "zip" else expr.args[:1]
            return [inner for arg in arguments if not arg.star for inner in self._iterated(arg.value, scope)]
        qualified = self.analysis.resolve(func) or ""
        if qualified.split(".")[0] == "tqdm" and qualified.endswith(".tqdm") and not expr.args[0].keyword:
            return self._iterated(expr.args[0].value, scope)
        return [expr]

    def _trace(self, expr, scope, path, seen):
        """Yield ``(path, origin, kind)`` for each way ``expr`` gets its data."""
        for inner in self._iterated(expr, scope):
            yield from self._trace_value(inner, scope, path + (inner,), seen)

    def _trace_value(self, expr, scope, path, seen):
        if isinstance(expr, cst.Call):
            qualified = self.analysis.resolve(expr.func)
            if qualified in DATA_LOADERS:
                yield path, expr, LOADER
                return
            if qualified == DISTRIBUTE_LOADER:
                yield path, expr, DISTRIBUTED
                return
            callee = self.index.callee(expr, scope)
            if callee is not None and callee[0].name.value != "__init__" and callee[0] not in seen:
                returns = self._values.returns.get(callee[0], [])
                for value, value_scope in returns:
                    yield from self._trace(value, value_scope, path, seen | {callee[0]})
                if returns:
                    return
            yield path, None, None
            return
        place = self.index.place_of(expr, scope) if isinstance(expr, (cst.Name, cst.Attribute)) else None
        if place is None or place in seen:
            yield path, None, None
            return
        seen = seen | {place}
        found = False
        for value, value_scope, position in self._values.stored.get(place, ()):
            for part, part_scope in self._values.element(value, value_scope, position):
                found = True
                yield from self._trace(part, part_scope, path, seen)
        for argument, call_scope in self._arguments_for(place):
            found = True
            yield from self._trace(argument, call_scope, path, seen)
        if not found:
            yield path, None, None

    def _arguments_for(self, place: Place) -> list[tuple[cst.BaseExpression, Scope]]:
        """The arguments this file's calls bind to ``place`` when it is a parameter of a function."""
        owner, name = place
        function = owner.node
        if not isinstance(function, cst.FunctionDef) or name not in self.index.parameters(function):
            return []
        found = []
        for call, call_scope, implicit in self.index.call_sites(function):
            for position, arg in enumerate(call.args):
                if self.index.parameter_place(function, call, position, implicit) == place:
                    found.append((arg.value, call_scope))
        return found

    # -- results -----------------------------------------------------------------------------------
    def feeds(self, node: cst.BaseExpression) -> set[bool]:
        """Whether the expression feeds training loops (True), evaluation loops (False), or both."""
        return {trace.training for trace in self.traces if any(step is node for step in trace.path)}
