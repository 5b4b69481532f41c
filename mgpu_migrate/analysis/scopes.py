"""Scopes and places: where a file stores values, so models, their outputs and losses can be followed.

A *place* is somewhere a value is stored and read back: a name in the scope that binds it (``model``), an
attribute path on it (``model.features``; attributes of ``self``, and of an instance of a class defined in
the file, belong to that class: ``self.net`` in every method), or the items of a container
(``self.models[]`` for ``self.models[i]``). One pass over the tree records every assignment, loop, call,
return and reference with its scope and the slot it fills in its parent, so the flow analyses
(``models``, ``losses``) look facts up instead of walking the tree again.

Deliberately simple: flow-insensitive (a place holds everything ever stored in it), comprehension and
lambda variables live in the enclosing scope, and calls are followed only into functions and classes
defined in this file. Every rule built on it is safe when a place holds more than it really does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Union

import libcst as cst

from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.walk import EXPRESSIONS

ScopeNode = Union[cst.Module, cst.ClassDef, cst.FunctionDef]
Function = cst.FunctionDef


@dataclass(eq=False)
class Scope:
    node: ScopeNode
    parent: Optional[Scope]
    bound: set[str] = field(default_factory=set)
    declared_global: set[str] = field(default_factory=set)
    params: set[str] = field(default_factory=set)
    functions: dict[str, Function] = field(default_factory=dict)
    classes: dict[str, cst.ClassDef] = field(default_factory=dict)
    # A method's first parameter (``self``) and the scope of its class.
    self_name: Optional[str] = None
    owner: Optional[Scope] = None

    @property
    def is_class(self) -> bool:
        return type(self.node) is cst.ClassDef

    def lookup(self, name: str) -> Scope:
        """The scope whose binding of ``name`` a read here sees (the module's when none binds it)."""
        scope: Optional[Scope] = self
        while scope is not None:
            if name in scope.declared_global:
                break
            if name in scope.bound and (scope is self or not scope.is_class):
                return scope
            scope = scope.parent
        root = self
        while root.parent is not None:
            root = root.parent
        return root

    def __repr__(self) -> str:
        name = getattr(getattr(self.node, "name", None), "value", "<module>")
        return f"Scope({name})"


# A place: the scope that owns it and a path such as ``model``, ``self.net``, ``self.models[]``.
Place = tuple[Scope, str]


def item_place(place: Place) -> Place:
    """The place of the items of the container held at ``place``."""
    return place[0], place[1] + "[]"


# The facts the one pass records, tens of thousands a file: named tuples, made in half a frozen dataclass's time.
class Slot(NamedTuple):
    """Where a node sits in its parent: ``kind`` is one of func, arg, attr, sub, assign, augassign, return,
    iter, with, statement; ``parent`` is that parent (the Call for func and arg)."""

    kind: str
    parent: cst.CSTNode


class Assignment(NamedTuple):
    target: cst.BaseExpression
    value: cst.BaseExpression
    scope: Scope


class Loop(NamedTuple):
    target: cst.BaseExpression
    iterable: cst.BaseExpression
    scope: Scope


def reference_key(node: cst.CSTNode) -> Optional[str]:
    """The last component of a reference's path: ``models[]`` for ``self.models[i]``."""
    if type(node) is cst.Name:
        return node.value
    if type(node) is cst.Attribute:
        return node.attr.value
    if type(node) is cst.Subscript:
        base = reference_key(node.value)
        return base + "[]" if base else None
    return None


class FlowIndex:
    """Scopes, assignments, loops, calls, returns and references of one module, from one pass (the shared
    walk of ``analysis.tree.Tree``, which runs the ``FlowCollector``)."""

    def __init__(self, collector: FlowCollector) -> None:
        self.module_scope = collector.module_scope
        self.scopes: dict[ScopeNode, Scope] = collector.scopes
        self.assignments: list[Assignment] = collector.assignments
        self.loops: list[Loop] = collector.loops
        self.calls: list[tuple[cst.Call, Scope]] = collector.calls
        self.returns: list[tuple[Function, cst.BaseExpression, Scope]] = collector.returns
        self.slots: dict[cst.CSTNode, Slot] = collector.slots
        # Every target a binding statement writes (assignment, loop, ``with``, ``del`` ...), with its scope.
        self.stores: dict[cst.CSTNode, Scope] = collector.stores
        self._references: dict[str, list[tuple[cst.CSTNode, Scope]]] = collector.references
        self._instances: dict[tuple[Scope, str], Scope] = {}
        self._instances = self._instances_of_local_classes()
        self._call_sites: Optional[dict[Function, list[tuple[cst.Call, Scope, int]]]] = None
        self._store_counts: Optional[dict[Place, int]] = None

    # -- places --------------------------------------------------------------------------------
    def place_of(self, node: cst.BaseExpression, scope: Scope) -> Optional[Place]:
        """The place a reference expression reads or writes; None for anything else."""
        # By type, not isinstance: see ModelFlow's queries, which ask this for every expression they meet.
        if type(node) is cst.Name:
            owner = scope.lookup(node.value)
            if owner.self_name == node.value and owner.owner is not None:
                return owner.owner, "self"
            instance_of = self._instances.get((owner, node.value))
            if instance_of is not None:
                return instance_of, "self"
            return owner, node.value
        if type(node) is cst.Attribute:
            base = self.place_of(node.value, scope)
            return (base[0], f"{base[1]}.{node.attr.value}") if base else None
        if type(node) is cst.Subscript:
            base = self.place_of(node.value, scope)
            return item_place(base) if base else None
        return None

    def references(self, place: Place) -> Iterator[tuple[cst.CSTNode, Scope, Optional[Slot]]]:
        """Every read of ``place`` with its scope and slot (stores are not reads)."""
        key = place[1].rsplit(".", 1)[-1]
        for node, scope in self._references.get(key, ()):
            if node not in self.stores and self.place_of(node, scope) == place:
                yield node, scope, self.slots.get(node)

    def store_count(self, place: Place) -> int:
        """How many statements of this file write ``place`` (of any kind: assignment, loop, ``with``, ``del``)."""
        if self._store_counts is None:
            counts: dict[Place, int] = defaultdict(int)
            for node, scope in self.stores.items():
                written = self.place_of(node, scope) if type(node) in EXPRESSIONS else None
                if written is not None:
                    counts[written] += 1
            self._store_counts = counts
        return self._store_counts.get(place, 0)

    def assigned_places(self, target: cst.BaseExpression, scope: Scope) -> list[Place]:
        """The places a (possibly unpacked) assignment target writes, flattened."""
        if type(target) in (cst.Tuple, cst.List):
            return [place for element in target.elements for place in self.assigned_places(element.value, scope)]
        if type(target) is cst.StarredElement:
            return self.assigned_places(target.value, scope)
        place = self.place_of(target, scope)
        return [place] if place else []

    # -- functions defined in this file --------------------------------------------------------
    def callee(self, call: cst.Call, scope: Scope) -> Optional[tuple[Function, int]]:
        """The function of this file a call runs, and how many leading parameters it binds implicitly."""
        func = call.func
        if type(func) is cst.Name:
            owner = scope.lookup(func.value)
            if func.value in owner.functions:
                return owner.functions[func.value], 0
            if func.value in owner.classes:
                init = self.scopes[owner.classes[func.value]].functions.get("__init__")
                return (init, 1) if init is not None else None
            return None
        if type(func) is cst.Attribute:
            base = self.place_of(func.value, scope)
            if base is not None and base[1] == "self":
                method = base[0].functions.get(func.attr.value)
                if method is not None and not _is_staticmethod(method):
                    return method, 1
        return None

    def parameter_place(self, function: Function, call: cst.Call, index: int, implicit: int) -> Optional[Place]:
        """The parameter of ``function`` that argument ``index`` of ``call`` binds."""
        arg = call.args[index]
        if arg.star:
            return None
        params = function.params
        if arg.keyword is not None:
            names = [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]
            name = arg.keyword.value if arg.keyword.value in names else None
        else:
            positional = [*params.posonly_params, *params.params][implicit:]
            name = positional[index].name.value if index < len(positional) else None
        return (self.scopes[function], name) if name else None

    def parameters_receiving(self, call: cst.Call, value: cst.CSTNode, scope: Scope) -> Optional[list[Optional[Place]]]:
        """For a call into a function of this file, the parameter each argument that is ``value`` binds (None
        where it is bound through ``*args`` or ``**kwargs``); None when the callee is not in this file."""
        callee = self.callee(call, scope)
        if callee is None:
            return None
        function, implicit = callee
        return [
            self.parameter_place(function, call, position, implicit)
            for position, arg in enumerate(call.args)
            if arg.value is value
        ]

    def call_sites(self, function: Function) -> list[tuple[cst.Call, Scope, int]]:
        """The calls in this file that run ``function``, with the count of implicit parameters."""
        if self._call_sites is None:
            sites: dict[Function, list[tuple[cst.Call, Scope, int]]] = defaultdict(list)
            for call, scope in self.calls:
                found = self.callee(call, scope)
                if found is not None:
                    sites[found[0]].append((call, scope, found[1]))
            self._call_sites = sites
        return self._call_sites.get(function, [])

    def parameters(self, function: Function) -> list[str]:
        params = function.params
        return [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]

    def _instances_of_local_classes(self) -> dict[tuple[Scope, str], Scope]:
        """Names only ever assigned an instance of one class of this file (``trainer = Trainer(...)``)."""
        classes: dict[tuple[Scope, str], set] = defaultdict(set)
        for assignment in self.assignments:
            target, value = assignment.target, assignment.value
            for name in names.names_in_target(target):
                key = (assignment.scope.lookup(name), name)
                cls = None
                if type(target) is cst.Name and type(value) is cst.Call and type(value.func) is cst.Name:
                    cls = assignment.scope.lookup(value.func.value).classes.get(value.func.value)
                classes[key].add(cls)
        for loop in self.loops:
            for name in names.names_in_target(loop.target):
                classes[(loop.scope.lookup(name), name)].add(None)
        return {
            key: self.scopes[next(iter(found))]
            for key, found in classes.items()
            if len(found) == 1 and None not in found and key[1] not in key[0].params
        }


def _is_staticmethod(function: Function) -> bool:
    return any(type(d.decorator) is cst.Name and d.decorator.value == "staticmethod" for d in function.decorators)


class FlowCollector:
    """What a ``FlowIndex`` is made of, collected by a read-only walk of the module, and the file's
    ``names.Bindings`` (every name it binds, per file rather than per scope) in the same handlers."""

    def __init__(self, module: cst.Module) -> None:
        self.bindings = names.Bindings()
        self.module_scope = Scope(module, None)
        self.scopes: dict[ScopeNode, Scope] = {module: self.module_scope}
        self.stack = [self.module_scope]
        self.functions: list[Function] = []
        self.assignments: list[Assignment] = []
        self.loops: list[Loop] = []
        self.calls: list[tuple[cst.Call, Scope]] = []
        self.returns: list[tuple[Function, cst.BaseExpression, Scope]] = []
        self.slots: dict[cst.CSTNode, Slot] = {}
        self.stores: dict[cst.CSTNode, Scope] = {}
        self.references: dict[str, list[tuple[cst.CSTNode, Scope]]] = defaultdict(list)
        # By id(): a node's __hash__ is a Python function, and every Name is looked up here.
        self.not_references: set[int] = set()

    @property
    def scope(self) -> Scope:
        return self.stack[-1]

    def leave_Module(self, node: cst.Module) -> None:
        self.bindings.vendored_encoding = self.bindings.imports_torch_only()

    # -- scopes ----------------------------------------------------------------------------------
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.bindings.local.add(node.name.value)
        outer = self.scope
        outer.bound.add(node.name.value)
        outer.functions[node.name.value] = node
        self.not_references.add(id(node.name))
        scope = Scope(node, outer)
        params = node.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params, params.star_arg, params.star_kwarg):
            if type(param) is cst.Param:
                scope.params.add(param.name.value)
        scope.bound |= scope.params
        positional = [*params.posonly_params, *params.params]
        if outer.is_class and positional and not _is_staticmethod(node):
            scope.self_name, scope.owner = positional[0].name.value, outer
        self.scopes[node] = scope
        self.stack.append(scope)
        self.functions.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.stack.pop()
        self.functions.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.bindings.local.add(node.name.value)
        outer = self.scope
        outer.bound.add(node.name.value)
        outer.classes[node.name.value] = node
        self.not_references.add(id(node.name))
        scope = Scope(node, outer)
        self.scopes[node] = scope
        self.stack.append(scope)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.stack.pop()

    def visit_Param(self, node: cst.Param) -> None:
        # Also a lambda's: the file-wide bindings count it, though it belongs to no scope here.
        self.bindings.local.add(node.name.value)
        self.not_references.add(id(node.name))

    def visit_Global(self, node: cst.Global) -> None:
        for item in node.names:
            self.scope.declared_global.add(item.name.value)
            self.not_references.add(id(item.name))

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        for item in node.names:
            self.not_references.add(id(item.name))

    def visit_Import(self, node: cst.Import) -> bool:
        names.record_import(self.bindings, node)
        for alias in node.names:
            bound = alias.asname.name if alias.asname else alias.name
            while type(bound) is cst.Attribute:
                bound = bound.value
            if type(bound) is cst.Name:
                self.scope.bound.add(bound.value)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        names.record_import(self.bindings, node)
        if type(node.names) is not cst.ImportStar:
            for alias in node.names:
                bound = alias.asname.name if alias.asname else alias.name
                if type(bound) is cst.Name:
                    self.scope.bound.add(bound.value)
        return False

    # -- stores ----------------------------------------------------------------------------------
    def _store(self, target: cst.BaseExpression, binds: bool = True) -> None:
        """Record what a statement writes (``binds``: the names it binds are the file's local bindings too, as
        for everything but ``del``)."""
        if type(target) in (cst.Tuple, cst.List):
            for element in target.elements:
                self._store(element.value, binds)
        elif type(target) is cst.StarredElement:
            self._store(target.value, binds)
        else:
            self.stores[target] = self.scope
            if type(target) is cst.Name:
                self.scope.bound.add(target.value)
                if binds:
                    self.bindings.local.add(target.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._store(target.target)
            self.assignments.append(Assignment(target.target, node.value, self.scope))
        self.slots[node.value] = Slot("assign", node)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._store(node.target)
        if node.value is not None:
            self.assignments.append(Assignment(node.target, node.value, self.scope))
            self.slots[node.value] = Slot("assign", node)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._store(node.target)
        self.slots[node.value] = Slot("augassign", node)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._store(node.target)
        self.assignments.append(Assignment(node.target, node.value, self.scope))
        self.slots[node.value] = Slot("assign", node)

    def visit_For(self, node: Union[cst.For, cst.CompFor]) -> None:
        self._store(node.target)
        self.loops.append(Loop(node.target, node.iter, self.scope))
        self.slots[node.iter] = Slot("iter", node)

    # A comprehension's `for` binds and iterates like a `for` statement.
    visit_CompFor = visit_For

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._store(node.asname.name)
        self.slots[node.item] = Slot("with", node)

    def visit_Del(self, node: cst.Del) -> None:
        self._store(node.target, binds=False)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None:
            self.bindings.local.update(names.names_in_target(node.name.name))

    # -- reads -----------------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append((node, self.scope))
        self.slots[node.func] = Slot("func", node)
        for arg in node.args:
            self.slots[arg.value] = Slot("arg", node)
            if arg.keyword is not None:
                self.not_references.add(id(arg.keyword))

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None:
            self.slots[node.value] = Slot("return", node)
            if self.functions:
                self.returns.append((self.functions[-1], node.value, self.scope))

    def visit_Expr(self, node: cst.Expr) -> None:
        self.slots[node.value] = Slot("statement", node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.slots[node.value] = Slot("attr", node)
        self.not_references.add(id(node.attr))
        self.references[node.attr.value].append((node, self.scope))

    def visit_Subscript(self, node: cst.Subscript) -> None:
        self.slots[node.value] = Slot("sub", node)
        key = reference_key(node)
        if key is not None:
            self.references[key].append((node, self.scope))

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self.not_references:
            self.references[node.value].append((node, self.scope))
