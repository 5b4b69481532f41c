"""What an expression may hold: the values this file stores in a name or an attribute, followed back.

Built on the flow index (``scopes.py``): every assignment recorded by the place it writes, unpacking
included (``train, val = make_loaders()`` stores the first element of what ``make_loaders`` returns), so
``of(expr)`` answers "what may this be?" with the expressions that were stored, through chains of
assignments and both branches of a ternary. Flow-insensitive, like the index.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.scopes import FlowIndex, Function, Place, Scope, item_place


class Values:
    def __init__(self, index: FlowIndex) -> None:
        self.index = index
        self.stored: dict[Place, list[tuple[cst.BaseExpression, Scope, Optional[int]]]] = defaultdict(list)
        for assignment in index.assignments:
            target, scope = assignment.target, assignment.scope
            if type(target) in (cst.Tuple, cst.List):
                for position, element in enumerate(target.elements):
                    place = index.place_of(element.value, scope)
                    if place is not None:
                        self.stored[place].append((assignment.value, scope, position))
            else:
                place = index.place_of(target, scope)
                if place is not None:
                    self.stored[place].append((assignment.value, scope, None))
        self.returns: dict[Function, list[tuple[cst.BaseExpression, Scope]]] = defaultdict(list)
        for function, value, scope in index.returns:
            self.returns[function].append((value, scope))
        self._call_scopes = dict(index.calls)

    def scope_of(self, call: cst.Call) -> Scope:
        """The scope a call is made in."""
        return self._call_scopes.get(call, self.index.module_scope)

    def element(
        self, value: cst.BaseExpression, scope: Scope, position: Optional[int]
    ) -> list[tuple[cst.BaseExpression, Scope]]:
        """The part of ``value`` an unpacking assignment stores at ``position`` (all of it when None)."""
        if position is None:
            return [(value, scope)]
        if type(value) in (cst.Tuple, cst.List):
            elements = value.elements
            if position < len(elements) and not any(type(e) is cst.StarredElement for e in elements):
                return [(elements[position].value, scope)]
            return []
        if type(value) is cst.Call:
            callee = self.index.callee(value, scope)
            if callee is not None:
                return [
                    part
                    for returned, returned_scope in self.returns.get(callee[0], [])
                    if type(returned) in (cst.Tuple, cst.List)
                    for part in self.element(returned, returned_scope, position)
                ]
        return []

    def assigned_only(
        self, expr: cst.BaseExpression, scope: Scope
    ) -> Optional[list[tuple[cst.BaseExpression, Scope]]]:
        """The values stored in the name or attribute ``expr`` reads, when whole-value assignments are the only
        bindings this file makes of it; None when anything else binds it too (a parameter, a loop, ``with``,
        ``del``, an augmented or unpacking assignment, an annotation without a value), or nothing does."""
        place = self.index.place_of(expr, scope) if type(expr) in (cst.Name, cst.Attribute) else None
        if place is None or place[1] in place[0].params:
            return None
        stored = self.stored.get(place, [])
        if not stored or any(position is not None for _, _, position in stored):
            return None
        if len(stored) != self.index.store_count(place):
            return None
        return [(value, value_scope) for value, value_scope, _ in stored]

    def entries(self, expr: cst.Subscript, scope: Scope) -> Optional[list[tuple[cst.BaseExpression, Scope]]]:
        """What an entry of a dict or list may be (the transfer-learning tutorial's ``dataloaders[phase]`` of
        ``{x: DataLoader(...) for x in ['train', 'val']}``): every entry the key may pick, when the container is
        only ever bound whole to displays or comprehensions, plus what is stored into it by key (``loaders['train']
        = ...``); None when that cannot be told (a container of another kind, ``{**other}``, a parameter)."""
        key = expr.slice[0].slice.value if len(expr.slice) == 1 and type(expr.slice[0].slice) is cst.Index else None
        return self.container_entries(expr.value, scope, key.evaluated_value if type(key) is cst.SimpleString else None)

    def container_entries(
        self, container: cst.BaseExpression, scope: Scope, wanted: Optional[str | bytes] = None
    ) -> Optional[list[tuple[cst.BaseExpression, Scope]]]:
        """``entries`` of the name or attribute ``container``: the entry at the string key ``wanted`` (and every
        entry whose key is not a string), or every entry when ``wanted`` is None."""
        base = self.index.place_of(container, scope) if type(container) in (cst.Name, cst.Attribute) else None
        containers = self.assigned_only(container, scope) if base is not None else None
        if base is None or not containers:
            return None
        found: list[tuple[cst.BaseExpression, Scope]] = []
        for container, container_scope in containers:
            if type(container) is cst.DictComp:
                found.append((container.value, container_scope))
            elif type(container) is cst.ListComp:
                found.append((container.elt, container_scope))
            elif type(container) in (cst.Dict, cst.List, cst.Tuple):
                for element in container.elements:
                    if type(element) not in (cst.DictElement, cst.Element):
                        return None
                    keyed = type(element) is cst.DictElement and type(element.key) is cst.SimpleString
                    if wanted is None or not keyed or element.key.evaluated_value == wanted:
                        found.append((element.value, container_scope))
            else:
                return None
        found += [(value, value_scope) for value, value_scope, _ in self.stored.get(item_place(base), ())]
        return found or None

    def of(self, expr: cst.BaseExpression, scope: Scope, depth: int = 4) -> list[cst.BaseExpression]:
        """What ``expr`` may evaluate to: the expressions stored in it, followed ``depth`` assignments back,
        and both branches of a ternary; ``expr`` itself when nothing is known."""
        if type(expr) is cst.IfExp:
            return self.of(expr.body, scope, depth) + self.of(expr.orelse, scope, depth)
        place = self.index.place_of(expr, scope) if type(expr) in (cst.Name, cst.Attribute) else None
        stored = self.stored.get(place, []) if place is not None and depth > 0 else []
        if not stored:
            return [expr]
        return [
            found
            for value, value_scope, position in stored
            for part, part_scope in self.element(value, value_scope, position)
            for found in self.of(part, part_scope, depth - 1)
        ]
