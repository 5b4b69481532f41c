"""Wrapped models: where a file wraps a model, which places hold it, where it runs, where its outputs go.

A *wrap site* is a call that makes a data-parallel model (``nn.DataParallel(...)`` in every spelling,
PyTorch-Encoding's ``DataParallelModel``, a subclass of ``DataParallel`` defined in the file, the runtime's
own wrappers) or directly computes parallel outputs (the functional ``data_parallel``). From the sites,
facts are propagated to a fixpoint over the file's assignments, loops, calls into functions of this file
and returns:

* which places hold a wrapped model (``model``, ``self.net``, ``model.features``, the items of
  ``self.models``), including the result of builder helpers (``def init_net(net): ...; return net``);
* which places hold (a part of) its outputs, untransformed: ``out = model(x)``, ``main, aux = model(x)``,
  ``logits = out[0]``, ``out.logits``;
* which places hold values *derived* from the outputs by tensor operations (``loss = out[0].mean()``);
* where outputs go to code this file does not show (``metric.update(out)``, ``loss_fn(out, y)``), and
  where the wrapped model itself leaves (passed to, or returned to, code outside the file).

Each fact carries the wrap sites it comes from, so a rule can say what happened to each site.
"""

from __future__ import annotations

import builtins
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.hand_written import calls_of_data_parallel_by_hand
from mgpu_migrate.analysis.project import Found, Project, project_of
from mgpu_migrate.analysis.scopes import FlowIndex, Function, Place, Scope, item_place
from mgpu_migrate.analysis.subclasses import Subclass
from mgpu_migrate.analysis.subclasses import from_ast as subclass_facts
from mgpu_migrate.analysis.tree import contains, item_target
from mgpu_migrate.analysis.walk import EXPRESSIONS, kinds

# Methods of nn.Module that return the module itself: ``nn.DataParallel(model).cuda()`` is the wrapper.
MODULE_METHODS_RETURNING_SELF = frozenset(
    {"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "train", "eval", "type", "requires_grad_", "share_memory"}
)
# Tensor attributes that describe a value: nothing computed from the outputs flows through them.
TENSOR_DESCRIPTION = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad"})
# Tensor attributes that are values computed from the whole (gathered) tensor, not a part of a structure.
TENSOR_METADATA = TENSOR_DESCRIPTION | {"data", "grad", "T", "mT", "H", "mH"}
_BUILTINS = frozenset(dir(builtins))

# What each kind of wrap site makes.
TORCH, ENCODING, SUBCLASS, RUNTIME, FUNCTIONAL = "torch", "encoding", "subclass", "runtime", "functional"
_SITE_KINDS = {
    names.DATA_PARALLEL: TORCH,
    names.CALLBACK_DATA_PARALLEL: TORCH,
    names.ENCODING_MODEL: ENCODING,
    names.RUNTIME_MODEL: RUNTIME,
    names.RUNTIME_DDP: RUNTIME,
    names.DATA_PARALLEL_FUNCTION: FUNCTIONAL,
    names.RUNTIME_DATA_PARALLEL_FUNCTION: FUNCTIONAL,
}

Sites = frozenset

# Calls that make something that is certainly not an nn.Module: a wrap of it parallelizes nothing.
_OPTIMIZERS = "torch.optim."
_SCHEDULERS = "torch.optim.lr_scheduler."
_NOT_OPTIMIZERS = "torch.optim.swa_utils."  # AveragedModel is a module
_TENSOR_FACTORIES = frozenset(
    f"torch.{name}"
    for name in (
        "tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "rand", "randn", "randint",
        "randperm", "arange", "linspace", "logspace", "eye", "zeros_like", "ones_like", "empty_like",
        "full_like", "rand_like", "randn_like", "randint_like", "Tensor", "FloatTensor", "LongTensor",
    )
)
_LITERALS = {
    kind: what
    for classes, what in (
        ((cst.List, cst.ListComp), "a list"),
        ((cst.Dict, cst.DictComp), "a dict"),
        ((cst.Tuple,), "a tuple"),
        ((cst.Set, cst.SetComp), "a set"),
        ((cst.BaseString,), "a string"),
        ((cst.BaseNumber,), "a number"),
        ((cst.Lambda,), "a lambda"),
    )
    for kind in kinds(*classes)
}
_CONSTANTS = {"None": "None", "True": "a bool", "False": "a bool"}


@dataclass(frozen=True, eq=False)
class WrapSite:
    call: cst.Call
    scope: Scope
    kind: str

    @property
    def module(self) -> Optional[cst.BaseExpression]:
        """The wrapped module argument."""
        for arg in self.call.args:
            if (arg.keyword is None and not arg.star) or (arg.keyword is not None and arg.keyword.value == "module"):
                return arg.value
        return None


@dataclass(frozen=True)
class Escape:
    """A node where a site's model or outputs go to code this file does not show, described for a person."""

    node: cst.CSTNode
    what: str


class ModelFlow:
    """Where each wrapped model of a file lives, runs, and sends its outputs (see the module doc)."""

    def __init__(self, analysis) -> None:
        self.analysis = analysis
        self.subclasses = self._data_parallel_subclasses()
        # Calls of a DataParallel subclass of another module of the project: what its class overrides (None: not one).
        self.project_subclasses: dict[cst.Call, Optional[Subclass]] = {}
        self.sites: list[WrapSite] = []
        self._site_by_call: dict[cst.Call, WrapSite] = {}
        self.wrapped: dict[Place, Sites] = defaultdict(frozenset)
        self.outputs: dict[Place, Sites] = defaultdict(frozenset)
        self.derived: dict[Place, Sites] = defaultdict(frozenset)
        self._returns_model: dict[Function, Sites] = defaultdict(frozenset)
        self._returns_outputs: dict[Function, Sites] = defaultdict(frozenset)
        self._returns_derived: dict[Function, Sites] = defaultdict(frozenset)
        # While the facts propagate: the facts each step reads, and the step at which each fact last grew.
        self._reads: list[tuple[int, object]] | None = None
        self._grown: dict[tuple[int, object], int] = {}
        self._step = 0
        # DataParallel calls that wrap something certainly not a module (an optimizer ...), with what it is:
        # they parallelize nothing, so they are no wrap sites; the wrapper rule leaves them for review.
        self.not_modules: dict[cst.Call, str] = {}
        # Calls of torch's data_parallel written by hand (WaveRNN's ``data_parallel_workaround(model, x, m)``, of
        # this file or the project's): functional sites, whose function's own module calls the runtime's instead.
        self.by_hand: frozenset[cst.Call] = calls_of_data_parallel_by_hand(
            analysis.path, analysis.source, analysis.calls, analysis.resolve
        )
        # The scope pass costs about half a parse: a file without a wrap site never pays for it.
        if (
            not self.subclasses
            and not self.by_hand
            and not any(analysis.resolve(call.func) in _SITE_KINDS or self._project_subclass(call) for call in analysis.calls)
        ):
            return
        for call, scope in self.index.calls:
            kind = self._site_kind(call, scope)
            if kind == TORCH:
                wrapped = WrapSite(call, scope, kind).module
                what = self._not_a_module(wrapped, scope, call) if wrapped is not None else None
                if what is not None:
                    self.not_modules[call] = what
                    continue
            if kind is not None:
                site = WrapSite(call, scope, kind)
                self.sites.append(site)
                self._site_by_call[call] = site
        if self.sites:
            self._propagate()

    # -- sites -----------------------------------------------------------------------------------

    @property
    def index(self) -> FlowIndex:
        """The file's flow index, made on first use: a file without a wrap site never pays for its scope pass, yet
        a query about one (an entry script's helper call given a value: has it the model's outputs?) is answered,
        with no site."""
        return self.analysis.flow
    def _site_kind(self, call: cst.Call, scope: Scope) -> Optional[str]:
        kind = _SITE_KINDS.get(self.analysis.resolve(call.func) or "")
        if kind is None and call in self.by_hand:
            return FUNCTIONAL
        if kind is None and type(call.func) is cst.Name and self.subclasses:
            owner = scope.lookup(call.func.value)
            if owner.classes.get(call.func.value) in self.subclasses:
                kind = SUBCLASS
        if kind is None and self._project_subclass(call) is not None:
            kind = SUBCLASS
        return kind

    def _project_subclass(self, call: cst.Call) -> Optional[Subclass]:
        """What the class ``call`` makes overrides, when it is a direct DataParallel subclass of another module of the
        project (yolact's or EfficientDet's ``CustomDataParallel``, imported from ``utils.utils``); None for any other
        call. Whether its module rebases it (MGP106) is the wrap rule's to ask (it depends on the target)."""
        if call in self.project_subclasses:
            return self.project_subclasses[call]
        qualified = self.analysis.resolve(call.func) or ""
        facts = None
        if qualified.endswith("DataParallel") and qualified.split(".")[0] not in names.NOT_THE_PROJECT:
            canonical = self.analysis.bindings.canonical(qualified)
            project = project_of(self.analysis.path) if canonical not in names.MIGRATED_NAMES else None
            found = project.find(qualified) if project is not None else None
            if found is not None and project.direct_data_parallel_subclass(found):
                facts = subclass_facts(found.node, found.where.rpartition(":")[0])
        self.project_subclasses[call] = facts
        return facts

    def _data_parallel_subclasses(self) -> set[cst.ClassDef]:
        """Classes of this file (outside functions) deriving, directly or through each other, from torch's
        ``DataParallel``."""
        # The parent map's classes, in source order (LibCST's ``children`` would rebuild every node it passes).
        tree = self.analysis.tree
        classes = [cls for cls in tree.nodes(cst.ClassDef) if tree.function(cls) is None]
        by_name = {cls.name.value: cls for cls in classes}
        found: set[cst.ClassDef] = set()
        changed = True
        while changed:
            changed = False
            for cls in classes:
                if cls in found:
                    continue
                for base in cls.bases:
                    local = by_name.get(base.value.value) if type(base.value) is cst.Name else None
                    if local in found or self.analysis.resolve(base.value) in (names.DATA_PARALLEL, names.RUNTIME_MODEL):
                        found.add(cls)
                        changed = True
                        break
        return found

    def _not_a_module(self, expr: cst.BaseExpression, scope: Scope, wrap: cst.Call, depth: int = 4) -> Optional[str]:
        """What ``expr`` holds, for a person (``an optimizer (`torch.optim.SGD`)``), when it is certainly not an
        ``nn.Module``: an optimizer, a learning-rate scheduler, a tensor or a literal, or a name or attribute
        this file binds only to such values (``wrap``'s own result aside: ``opt = DataParallel(opt)``); None
        when it may be a module."""
        literal = _LITERALS.get(type(expr))
        if literal is not None:
            return literal
        if type(expr) is cst.Name and expr.value in _CONSTANTS:
            return _CONSTANTS[expr.value]
        if type(expr) is cst.Call:
            qualified = self.analysis.resolve(expr.func) or ""
            is_class = qualified.rpartition(".")[2][:1].isupper()
            if qualified.startswith(_SCHEDULERS) and is_class:
                return f"a learning-rate scheduler (`{qualified}`)"
            if qualified.startswith(_OPTIMIZERS) and not qualified.startswith(_NOT_OPTIMIZERS) and is_class:
                return f"an optimizer (`{qualified}`)"
            return f"a tensor (`{qualified}`)" if qualified in _TENSOR_FACTORIES else None
        if depth == 0 or names.head_name(expr) in self.analysis.bindings.imported:
            return None
        stored = self.analysis.values.assigned_only(expr, scope)
        found = [
            self._not_a_module(value, value_scope, wrap, depth - 1)
            for value, value_scope in stored or ()
            if value is not wrap
        ]
        return found[0] if found and all(found) else None

    def site_of(self, call: cst.Call) -> Optional[WrapSite]:
        return self._site_by_call.get(call)

    # -- what an expression holds -----------------------------------------------------------------
    # These run for every expression of every step of the propagation: node kinds are told apart by their type
    # (LibCST's concrete node classes have no subclasses), since a failing ``isinstance`` against one of its
    # node classes goes through the abstract-base-class check and costs several type comparisons.
    def model_sites(self, expr: cst.BaseExpression, scope: Scope) -> Sites:
        """The wrap sites whose model ``expr`` evaluates to."""
        if type(expr) is cst.Call:
            site = self._site_by_call.get(expr)
            if site is not None:
                return frozenset() if site.kind == FUNCTIONAL else frozenset({site})
            func = expr.func
            if type(func) is cst.Attribute and func.attr.value in MODULE_METHODS_RETURNING_SELF:
                return self.model_sites(func.value, scope)
            callee = self.index.callee(expr, scope)
            return self._fact(self._returns_model, callee[0]) if callee else frozenset()
        if type(expr) in (cst.Name, cst.Attribute, cst.Subscript):
            place = self.index.place_of(expr, scope)
            return self._fact(self.wrapped, place) if place else frozenset()
        if type(expr) is cst.IfExp:
            return self.model_sites(expr.body, scope) | self.model_sites(expr.orelse, scope)
        if type(expr) is cst.BooleanOperation:
            return self.model_sites(expr.left, scope) | self.model_sites(expr.right, scope)
        return frozenset()

    def container_sites(self, expr: cst.BaseExpression, scope: Scope) -> Sites:
        """The wrap sites whose models are items of the container ``expr`` evaluates to."""
        if type(expr) in (cst.List, cst.Tuple, cst.Set):
            found: Sites = frozenset()
            for element in expr.elements:
                if type(element) is cst.StarredElement:
                    found |= self.container_sites(element.value, scope)
                else:
                    found |= self.model_sites(element.value, scope)
            return found
        if type(expr) in (cst.ListComp, cst.GeneratorExp, cst.SetComp):
            return self.model_sites(expr.elt, scope)
        if type(expr) is cst.DictComp:
            return self.model_sites(expr.value, scope)
        if type(expr) is cst.Dict:
            return frozenset().union(
                *(self.model_sites(e.value, scope) for e in expr.elements if type(e) is cst.DictElement)
            )
        if type(expr) is cst.Call and expr.args and not expr.args[0].keyword:
            # nn.ModuleList([...]), nn.ModuleDict({...}), list(...), tuple(...)
            return self.container_sites(expr.args[0].value, scope)
        if type(expr) in (cst.Name, cst.Attribute, cst.Subscript):
            place = self.index.place_of(expr, scope)
            return self._fact(self.wrapped, item_place(place)) if place else frozenset()
        return frozenset()

    def output_sites(self, expr: cst.BaseExpression, scope: Scope) -> Sites:
        """The wrap sites of which ``expr`` is the output, or a part of it, as the model returned it."""
        if type(expr) is cst.Call:
            site = self._site_by_call.get(expr)
            if site is not None:
                return frozenset({site}) if site.kind == FUNCTIONAL else frozenset()
            func = expr.func
            if type(func) is cst.Attribute and func.attr.value == "forward":
                func = func.value
            found = self.model_sites(func, scope)
            callee = self.index.callee(expr, scope)
            return found | self._fact(self._returns_outputs, callee[0]) if callee else found
        if type(expr) is cst.Subscript:
            return self.output_sites(expr.value, scope) | self._place_fact(self.outputs, expr, scope)
        if type(expr) is cst.Attribute:
            if expr.attr.value in TENSOR_METADATA:
                return frozenset()
            return self.output_sites(expr.value, scope) | self._place_fact(self.outputs, expr, scope)
        if type(expr) is cst.Name:
            return self._place_fact(self.outputs, expr, scope)
        return frozenset()

    def derived_sites(self, expr: cst.CSTNode, scope: Scope) -> Sites:
        """The wrap sites whose outputs ``expr`` is computed from, through operators, subscripts, methods of
        those values, and torch or builtin functions. A value that goes through any other call (a loss
        function, a metric) is not counted: what that call returns is not known here."""
        if type(expr) is cst.Attribute and expr.attr.value in TENSOR_DESCRIPTION:
            return frozenset()
        found = self.output_sites(expr, scope) if type(expr) in EXPRESSIONS else frozenset()
        if type(expr) in (cst.Name, cst.Attribute, cst.Subscript):
            found |= self._place_fact(self.derived, expr, scope)
        if type(expr) is cst.Call:
            callee = self.index.callee(expr, scope)
            if callee is not None:
                return found | self._fact(self._returns_derived, callee[0])
            func = expr.func
            if type(func) is cst.Attribute and not self._is_torch(func):
                receiver = self.derived_sites(func.value, scope)
                if not receiver:
                    return found
                return found | receiver | self._derived_in_args(expr, scope)
            if self._is_torch(func) or self._is_builtin(func, scope):
                return found | self._derived_in_args(expr, scope)
            return found
        for part in _operands(expr):
            found |= self.derived_sites(part, scope)
        return found

    def _derived_in_args(self, call: cst.Call, scope: Scope) -> Sites:
        return frozenset().union(*(self.derived_sites(arg.value, scope) for arg in call.args))

    def _place_fact(self, facts: dict[Place, Sites], expr: cst.BaseExpression, scope: Scope) -> Sites:
        place = self.index.place_of(expr, scope)
        return self._fact(facts, place) if place else frozenset()

    def _fact(self, facts: dict, key) -> Sites:
        """What ``facts`` (one of the fact tables) holds for ``key``. Every query reads the tables through here,
        so the propagation knows what each of its steps read."""
        if self._reads is not None:
            self._reads.append((id(facts), key))
        return facts.get(key, frozenset())

    def _add(self, facts: dict, key, sites: Sites) -> bool:
        """Add ``sites`` to what ``facts`` holds for ``key``; whether that grew."""
        if not sites:
            return False
        before = facts.get(key, frozenset())
        after = before | sites
        if after == before:
            return False
        facts[key] = after
        self._grown[id(facts), key] = self._step
        return True

    def _is_torch(self, func: cst.BaseExpression) -> bool:
        qualified = self.analysis.resolve(func)
        return qualified is not None and (qualified == "torch" or qualified.startswith("torch."))

    def _is_builtin(self, func: cst.BaseExpression, scope: Scope) -> bool:
        return type(func) is cst.Name and func.value in _BUILTINS and func.value not in scope.lookup(func.value).bound

    # -- propagation -------------------------------------------------------------------------------
    def _propagate(self) -> None:
        index = self.index
        steps = [
            *(partial(self._assign, step.target, step.value, step.scope) for step in index.assignments),
            *(partial(self._loop, loop.target, loop.iterable, loop.scope) for loop in index.loops),
            *(partial(self._bind_arguments, call, scope) for call, scope in index.calls),
            *(partial(self._return, function, value, scope) for function, value, scope in index.returns),
        ]
        # A step computes its facts from the facts it reads: one none of whose reads grew since it last ran would
        # compute what it added then, and add nothing. It is skipped; each round adds what a full round would.
        last_run: list[int] = [-1] * len(steps)
        reads: list[list[tuple[int, object]]] = [[] for _ in steps]
        grown = self._grown
        for _ in range(50):  # a fixpoint; the bound only guards against a bug, real files need a handful
            changed = False
            for number, step in enumerate(steps):
                ran = last_run[number]
                if ran >= 0 and all(grown.get(key, -1) < ran for key in reads[number]):
                    continue
                self._step += 1
                last_run[number] = self._step
                self._reads = reads[number] = []
                changed |= step()
            self._reads = None
            if not changed:
                return

    def _return(self, function: Function, value: cst.BaseExpression, scope: Scope) -> bool:
        changed = self._add(self._returns_model, function, self.model_sites(value, scope))
        changed |= self._add(self._returns_outputs, function, self.output_sites(value, scope))
        changed |= self._add(self._returns_derived, function, self.derived_sites(value, scope))
        return changed

    def _assign(self, target: cst.BaseExpression, value: cst.BaseExpression, scope: Scope) -> bool:
        if type(target) in (cst.Tuple, cst.List):
            if type(value) in (cst.Tuple, cst.List) and len(value.elements) == len(target.elements):
                return any(
                    [self._assign(t.value, v.value, scope) for t, v in zip(target.elements, value.elements)]
                )
            # Unpacking: each name gets a part of the outputs, or an item of a container of models.
            parts = self.output_sites(value, scope)
            derived = self.derived_sites(value, scope)
            items = self.container_sites(value, scope)
            changed = False
            for place in self.index.assigned_places(target, scope):
                changed |= self._add(self.outputs, place, parts)
                changed |= self._add(self.derived, place, derived)
                changed |= self._add(self.wrapped, place, items)
            return changed
        place = self.index.place_of(target, scope)
        if place is None:
            return False
        changed = self._add(self.wrapped, place, self.model_sites(value, scope))
        changed |= self._add(self.wrapped, item_place(place), self.container_sites(value, scope))
        changed |= self._add(self.outputs, place, self.output_sites(value, scope))
        changed |= self._add(self.derived, place, self.derived_sites(value, scope))
        return changed

    def _loop(self, target: cst.BaseExpression, iterable: cst.BaseExpression, scope: Scope) -> bool:
        items = self.container_sites(iterable, scope)
        place = self.index.place_of(item_target(target, iterable), scope)
        return self._add(self.wrapped, place, items) if place else False

    def _bind_arguments(self, call: cst.Call, scope: Scope) -> bool:
        callee = self.index.callee(call, scope)
        if callee is None:
            return False
        function, implicit = callee
        changed = False
        for position, arg in enumerate(call.args):
            place = self.index.parameter_place(function, call, position, implicit)
            if place is None:
                continue
            changed |= self._add(self.wrapped, place, self.model_sites(arg.value, scope))
            changed |= self._add(self.wrapped, item_place(place), self.container_sites(arg.value, scope))
            changed |= self._add(self.outputs, place, self.output_sites(arg.value, scope))
            changed |= self._add(self.derived, place, self.derived_sites(arg.value, scope))
        return changed

    # -- results for rules ------------------------------------------------------------------------
    def model_calls(self) -> list[tuple[cst.Call, Scope, Sites]]:
        """Every forward call of a wrapped model (and every functional ``data_parallel`` call)."""
        found: list[tuple[cst.Call, Scope, Sites]] = []
        if not self.sites:
            return found
        for call, scope in self.index.calls:
            sites = self.output_sites(call, scope) if self.index.callee(call, scope) is None else frozenset()
            if sites:
                found.append((call, scope, sites))
        return found

    def backward_sites(self) -> Sites:
        """Sites whose outputs reach ``.backward()`` through tensor operations only: the loss was computed
        inside the model (HF style), or by torch functions on the outputs."""
        found: Sites = frozenset()
        for call, scope in self.index.calls:
            func = call.func
            if type(func) is cst.Attribute and func.attr.value == "backward":
                found |= self._mentioned_sites(func.value, scope)
            elif self.analysis.resolve(func) == "torch.autograd.backward" and call.args:
                found |= self._mentioned_sites(call.args[0].value, scope)
        return found

    def _mentioned_sites(self, expr: cst.CSTNode, scope: Scope) -> Sites:
        """Sites derived anywhere inside ``expr``, through any call: ``scaler.scale(loss)`` mentions ``loss``."""
        found = self.derived_sites(expr, scope) if isinstance(expr, cst.BaseExpression) else frozenset()
        for child in expr.children:
            found |= self._mentioned_sites(child, scope)
        return found

    def output_escapes(self) -> dict[WrapSite, list[Escape]]:
        """Calls to code outside this file (neither torch nor a builtin) that receive a site's outputs."""
        escapes: dict[WrapSite, list[Escape]] = defaultdict(list)
        for call, scope in self.index.calls:
            if self._is_followed_or_known(call, scope):
                continue
            for arg in call.args:
                for site in self.derived_sites(arg.value, scope):
                    escapes[site].append(Escape(call, f"`{self._callee_text(call)}(...)`"))
        return escapes

    def after_wrap(self, site: WrapSite, escapes: list[Escape]) -> list[Escape]:
        """``escapes`` without those that run before ``site`` wraps the model: earlier in the same function,
        outside any loop around the wrap (``print_network(net)`` just before ``net = DataParallel(net)``)."""
        tree = self.analysis.tree
        function = tree.function(site.call)
        wrapped_at = self.analysis.position(site.call)
        loops = {node for node in tree.ancestors(site.call) if type(node) in (cst.For, cst.While)}

        def before(escape: Escape) -> bool:
            return (
                tree.function(escape.node) is function
                and self.analysis.position(escape.node) < wrapped_at
                and not loops & set(tree.ancestors(escape.node))
            )

        return [escape for escape in escapes if not before(escape)]

    def model_escapes(self) -> dict[WrapSite, list[Escape]]:
        """Where a wrapped model goes to code outside this file: an argument of such a call, or the return
        value of a function nothing in this file calls."""
        escapes: dict[WrapSite, list[Escape]] = defaultdict(list)
        for call, scope in self.index.calls:
            if self._is_followed_or_known(call, scope):
                continue
            for arg in call.args:
                for site in self.model_sites(arg.value, scope) | self.container_sites(arg.value, scope):
                    escapes[site].append(Escape(call, f"`{self._callee_text(call)}(...)`"))
        for function, value, scope in self.index.returns:
            if self.index.call_sites(function):
                continue
            for site in self.model_sites(value, scope) | self.container_sites(value, scope):
                escapes[site].append(Escape(value, f"the caller of `{function.name.value}()`"))
        return escapes

    def _is_followed_or_known(self, call: cst.Call, scope: Scope) -> bool:
        if call in self._site_by_call or self.index.callee(call, scope) is not None:
            return True
        if self._is_torch(call.func) or self._is_builtin(call.func, scope):
            return True
        func = call.func
        # A method of a model or of its outputs (``model.load_state_dict``, ``out.view``) is torch's own.
        return type(func) is cst.Attribute and bool(
            self.model_sites(func.value, scope) or self.derived_sites(func.value, scope)
        )

    def _callee_text(self, call: cst.Call) -> str:
        return self.analysis.code_of(call.func)

    def assigned_to(self, site: WrapSite) -> list[tuple[cst.BaseExpression, Scope]]:
        """The targets the site's model is first stored in (``model`` in ``model = nn.DataParallel(m).cuda()``)."""
        found = []
        for assignment in self.index.assignments:
            value = assignment.value
            while (
                type(value) is cst.Call
                and type(value.func) is cst.Attribute
                and value.func.attr.value in MODULE_METHODS_RETURNING_SELF
            ):
                value = value.func.value
            if value is site.call:
                found.append((assignment.target, assignment.scope))
        return found

    def is_submodule(self, site: WrapSite) -> Optional[str]:
        """The code of the attribute or item a site wraps when it wraps part of a model, not a whole one:
        ``model.features = DataParallel(model.features)``, ``model[0] = DataParallel(model[0])``, or
        ``self.encoder = DataParallel(...)`` in an ``nn.Module``'s own methods."""
        code = self.analysis.code_of
        for target, scope in self.assigned_to(site):
            if type(target) is cst.Subscript:
                # `model[0] = DataParallel(model[0])`: an item of a Sequential wrapped in place (an item of a
                # plain list of models, `students[i]`, is a whole model).
                if site.module is not None and code(site.module) == code(target) and self._is_layer_container(
                    target.value, scope
                ):
                    return code(target)
                continue
            if type(target) is not cst.Attribute:
                continue
            place = self.index.place_of(target, scope)
            if place is None:
                continue
            owner, path = place
            if path.startswith("self.") and owner.is_class and self._is_nn_module(owner.node):
                if self._holds_other_modules(owner.node, target.attr.value):
                    return code(target)
                continue  # a wrapper class around the model alone (RCAN's `Model`): the wrap is all it trains
            module = site.module
            if not path.startswith("self.") and module is not None and code(module) == code(target):
                return code(target)
        return None

    def parts_wrapped_alone(self, site: WrapSite) -> tuple[str, int, bool] | None:
        """For a site that wraps one of several parts of a model each wrapped on its own (MuZero's networks, kept
        on ``self.X`` by an ``nn.Module`` class; ``model.a = DataParallel(model.a)`` beside ``model.b = ...``):
        the model's name (its class, or the code of what holds the parts), how many parts are wrapped, and whether
        the class holds nothing else (no module or parameter but the wraps)."""
        code = self.analysis.code_of
        for target, scope in self.assigned_to(site):
            place = self.index.place_of(target, scope) if type(target) is cst.Attribute else None
            if place is not None and place[1].startswith("self.") and place[0].is_class:
                cls = place[0].node
                wrapped = {
                    other.attr.value
                    for other_site in self.sites
                    for other, _ in self.assigned_to(other_site)
                    if _is_self_attribute(other) and cls in self.analysis.tree.ancestors(other)
                }
                if len(wrapped) > 1:
                    return cls.name.value, len(wrapped), not self._holds_other_modules(cls, *wrapped)
            if type(target) not in (cst.Attribute, cst.Subscript):
                continue
            holder = code(target.value)
            parts = {
                code(other)
                for other_site in self.sites
                for other, _ in self.assigned_to(other_site)
                if type(other) in (cst.Attribute, cst.Subscript) and code(other.value) == holder and self.is_submodule(other_site)
            }
            if len(parts) > 1:
                return holder, len(parts), False
        return None

    def _holds_other_modules(self, cls: cst.ClassDef, *wrapped: str) -> bool:
        """Whether an ``nn.Module`` class may hold parameters besides its attributes ``wrapped``: another
        attribute is given a module (``torch.nn``'s, or what an unknown call returns), is called (``self.head(x)``)
        or asked for its parameters, or the class registers parameters, buffers or modules itself."""
        resolve = self.analysis.resolve
        methods = {s.name.value for s in cls.body.body if type(s) is cst.FunctionDef}
        for node in contains(cls, lambda n: type(n) in (cst.Assign, cst.AnnAssign, cst.Call), into_functions=True):
            if type(node) is cst.Call:
                func = node.func
                if type(func) is cst.Name and func.value == "setattr":
                    return True
                if type(func) is not cst.Attribute:
                    continue
                owner = func.value
                if type(owner) is cst.Name and owner.value == "self":
                    if func.attr.value.startswith(("register_", "add_module")):
                        return True
                    if func.attr.value not in methods | _MODULE_METHODS and func.attr.value not in wrapped:
                        return True  # `self.head(x)`: a module held here
                elif _is_self_attribute(owner) and owner.attr.value not in wrapped and func.attr.value == "parameters":
                    return True
                continue
            targets = [t.target for t in node.targets] if type(node) is cst.Assign else [node.target]
            for target in targets:
                if not _is_self_attribute(target) or target.attr.value in wrapped or node.value is None:
                    continue
                value = node.value
                if type(value) is cst.Call:
                    qualified = resolve(value.func) or ""
                    if qualified.startswith("torch.nn.") or not qualified.startswith("torch."):
                        return True  # a torch.nn module or parameter, or what an unknown builder returns
        return False

    def _is_layer_container(self, expr: cst.BaseExpression, scope: Scope) -> bool:
        """Whether ``expr`` is bound to ``nn.Sequential(...)``: its items are layers of one model."""
        values = self.analysis.values
        return any(
            type(value) is cst.Call and self.analysis.resolve(value.func) == "torch.nn.Sequential"
            for value in values.of(expr, scope)
        )

    def _is_nn_module(self, cls: cst.ClassDef, seen: frozenset = frozenset()) -> bool:
        for base in cls.bases:
            qualified = self.analysis.resolve(base.value)
            if qualified == names.TORCH_MODULE or (qualified or "").startswith("torch.nn."):
                return True
            if type(base.value) is cst.Name and cls not in seen:
                owner = self.index.scopes[cls].parent.lookup(base.value.value)
                parent = owner.classes.get(base.value.value)
                if parent is not None and self._is_nn_module(parent, seen | {cls}):
                    return True
        return False


_LEAVES = kinds(cst.Name, cst.BaseNumber, cst.BaseString, cst.Ellipsis, cst.Lambda)

# What a generic expression is computed from: its children that are (or hold) expressions.
_OPERANDS = kinds(
    cst.BaseExpression, cst.Arg, cst.BaseElement, cst.BaseSlice, cst.SubscriptElement, cst.ComparisonTarget,
    cst.DictElement, cst.StarredDictElement, cst.CompFor, cst.CompIf, cst.FormattedStringExpression,
)

def _operands(expr: cst.CSTNode) -> list[cst.CSTNode]:
    """The sub-expressions a value is computed from, spelled out for the common expressions (libcst's
    generic ``children`` walks the whole node, whitespace included, and dominates the analysis otherwise)."""
    if type(expr) in _LEAVES:
        return []
    if type(expr) is cst.Attribute:
        return [expr.value]
    if type(expr) is cst.Subscript:
        parts: list[cst.CSTNode] = [expr.value]
        for element in expr.slice:
            index = element.slice
            if type(index) is cst.Index:
                parts.append(index.value)
            else:
                parts.extend(bound for bound in (index.lower, index.upper, index.step) if bound is not None)
        return parts
    if type(expr) in (cst.BinaryOperation, cst.BooleanOperation):
        return [expr.left, expr.right]
    if type(expr) is cst.UnaryOperation:
        return [expr.expression]
    if type(expr) is cst.Comparison:
        return [expr.left, *(target.comparator for target in expr.comparisons)]
    if type(expr) is cst.IfExp:
        return [expr.test, expr.body, expr.orelse]
    if type(expr) in (cst.Tuple, cst.List, cst.Set):
        return [element.value for element in expr.elements]
    if type(expr) in (cst.Await, cst.NamedExpr):
        return [expr.expression if type(expr) is cst.Await else expr.value]
    return [
        child
        for child in expr.children
        if type(child) in _OPERANDS
    ]


# nn.Module's own methods, which a subclass calls on itself (`self.train()`): no module of its own.
_MODULE_METHODS = frozenset(
    {
        "train", "eval", "parameters", "named_parameters", "buffers", "named_buffers", "children", "modules",
        "named_modules", "state_dict", "load_state_dict", "to", "cuda", "cpu", "half", "float", "double", "type",
        "apply", "zero_grad", "forward", "requires_grad_",
    }
)


def _is_self_attribute(node: cst.CSTNode) -> bool:
    return type(node) is cst.Attribute and type(node.value) is cst.Name and node.value.value == "self"


def becomes_ddp(sites: Sites) -> bool:
    """Whether some of these wrap sites are DistributedDataParallel models under ``--to ddp``."""
    return any(site.kind in (TORCH, RUNTIME) for site in sites)


def model_class(analysis, wrap: cst.Call, classes: dict[str, cst.ClassDef]) -> Optional[cst.ClassDef]:
    """The class of this file (``classes``, by name) whose object ``wrap`` wraps (``nn.DataParallel(Net())``, also
    through a name and through calls that return the module: ``net.cuda()``), or None."""
    module = _wrapped_argument(wrap)
    if module is None:
        return None
    values = analysis.values
    for value in values.of(module, values.scope_of(wrap)):
        value = without_self_returning_calls(value)
        if type(value) is cst.Call and type(value.func) is cst.Name and value.func.value in classes:
            return classes[value.func.value]
    return None


def wrapped_classes(analysis, wrap: cst.Call, project: Project) -> list[Found]:
    """The project classes whose object ``wrap`` may wrap: a class of this file, or a class of the project built
    directly or by a factory of it (``model.resnet50(...)``, pytorch-retinanet's, returns ``ResNet(...)``)."""
    classes = {s.name.value: s for s in analysis.module.body if type(s) is cst.ClassDef}
    model = model_class(analysis, wrap, classes)
    if model is not None:
        own = project.own(model.name.value, analysis.source)
        return [own] if own is not None else []
    module = _wrapped_argument(wrap)
    if module is None:
        return []
    values = analysis.values
    found = []
    for value in values.of(module, values.scope_of(wrap)):
        value = without_self_returning_calls(value)
        qualified = analysis.resolve(value.func) if type(value) is cst.Call else None
        if not qualified or qualified.startswith(("torch.", "torchvision.", "builtins.")):
            continue
        definition = project.find(qualified)
        cls = project.built_class(definition) if definition is not None else None
        if cls is not None:
            found.append(cls)
    return found


def without_self_returning_calls(value: cst.BaseExpression) -> cst.BaseExpression:
    """``net`` of ``net.cuda().train()``: the module that calls returning it are made on."""
    while type(value) is cst.Call and type(value.func) is cst.Attribute and value.func.attr.value in MODULE_METHODS_RETURNING_SELF:
        value = value.func.value
    return value


def _wrapped_argument(wrap: cst.Call) -> Optional[cst.BaseExpression]:
    """The module a wrap is given (``module=`` or its first positional argument)."""
    for position, arg in enumerate(wrap.args):
        if arg.keyword is not None and arg.keyword.value == "module":
            return arg.value
        if arg.keyword is None and not arg.star and position == 0:
            return arg.value
    return None
