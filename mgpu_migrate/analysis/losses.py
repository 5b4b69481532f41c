"""Losses on wrapped models' outputs: the calls that compute them and where each criterion is built.

A *loss call* is a call whose prediction (its first argument) is a wrapped model's output: a functional
loss (``F.cross_entropy(out, y)``) or a criterion object (``criterion(out, y)``, ``self.criterion(...)``).
The prediction is either *direct* (the output or a part of it: ``out``, ``main``, ``out[0]``,
``out.logits``), which the runtime can take per device, or *transformed* (``out.view(-1, v)``,
``F.log_softmax(out, 1)``), which is gathered before the loss sees it.

A *criterion* groups the places a criterion object passes through (``criterion`` in ``main``, the
``criterion`` parameter of ``train``, ``self.criterion``) with where it is built (the *constructions*:
``nn.CrossEntropyLoss(...)``, possibly ``.cuda()``-chained, inline as an argument, or a parameter's default).
Calls to anything that is neither a known criterion nor built in this file as one (an imported ``accuracy``,
a ``build_loss(cfg)`` result) are not loss calls: they are where the outputs leave the file
(``ModelFlow.output_escapes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.models import MODULE_METHODS_RETURNING_SELF, ModelFlow, Sites
from mgpu_migrate.analysis.scopes import FlowIndex, Place, Scope

# torch's loss classes whose batch splits exactly under the runtime's criterion (per-sample or per-element
# means, sums, class-index cross-entropy with weights and ignore_index); each with its functional twin.
SPLITTABLE_LOSSES = {
    "CrossEntropyLoss": "cross_entropy",
    "NLLLoss": "nll_loss",
    "MSELoss": "mse_loss",
    "L1Loss": "l1_loss",
    "SmoothL1Loss": "smooth_l1_loss",
    "HuberLoss": "huber_loss",
    "BCELoss": "binary_cross_entropy",
    "BCEWithLogitsLoss": "binary_cross_entropy_with_logits",
    "KLDivLoss": "kl_div",
    "SoftMarginLoss": "soft_margin_loss",
    "MultiLabelSoftMarginLoss": "multilabel_soft_margin_loss",
    "MultiMarginLoss": "multi_margin_loss",
    "MultiLabelMarginLoss": "multilabel_margin_loss",
    "PoissonNLLLoss": "poisson_nll_loss",
    "HingeEmbeddingLoss": "hinge_embedding_loss",
}
# Each functional loss's parameters after (input, target), in order. Its class takes the same ones, in the
# same order, except the per-element weights only the function accepts (FUNCTIONAL_ONLY).
LOSS_PARAMETERS = {
    "cross_entropy": ("weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing"),
    "nll_loss": ("weight", "size_average", "ignore_index", "reduce", "reduction"),
    "mse_loss": ("size_average", "reduce", "reduction", "weight"),
    "l1_loss": ("size_average", "reduce", "reduction", "weight"),
    "smooth_l1_loss": ("size_average", "reduce", "reduction", "beta"),
    "huber_loss": ("reduction", "delta", "weight"),
    "binary_cross_entropy": ("weight", "size_average", "reduce", "reduction"),
    "binary_cross_entropy_with_logits": ("weight", "size_average", "reduce", "reduction", "pos_weight"),
    "kl_div": ("size_average", "reduce", "reduction", "log_target"),
    "soft_margin_loss": ("size_average", "reduce", "reduction"),
    "multilabel_soft_margin_loss": ("weight", "size_average", "reduce", "reduction"),
    "multi_margin_loss": ("p", "margin", "weight", "size_average", "reduce", "reduction"),
    "multilabel_margin_loss": ("size_average", "reduce", "reduction"),
    "poisson_nll_loss": ("log_input", "full", "size_average", "eps", "reduce", "reduction"),
    "hinge_embedding_loss": ("margin", "size_average", "reduce", "reduction"),
}
FUNCTIONAL_ONLY = {"mse_loss": frozenset({"weight"}), "l1_loss": frozenset({"weight"}), "huber_loss": frozenset({"weight"})}
# Losses whose mean is over the weight of the targets, not over rows (class weights, ignore_index).
CLASS_INDEX_LOSSES = frozenset({"CrossEntropyLoss", "NLLLoss"})
# The functional losses, by canonical name, with their class.
FUNCTIONAL_LOSSES = {f"{names.TORCH_FUNCTIONAL}.{function}": cls for cls, function in SPLITTABLE_LOSSES.items()}
# Criteria that already take per-device outputs.
PARALLEL_CRITERIA = frozenset({names.RUNTIME_CRITERION, names.ENCODING_CRITERION, names.RUNTIME_DISTRIBUTED_CRITERION})



@dataclass(frozen=True, eq=False)
class LossCall:
    call: cst.Call
    scope: Scope
    prediction: cst.BaseExpression
    direct: Sites
    """Sites whose output (or a part of it) is the prediction as the model returned it."""
    transformed: Sites
    """Sites whose output reaches the prediction only through some computation (gathered first)."""
    functional: Optional[str] = None
    """The canonical name of a functional loss (``torch.nn.functional.cross_entropy``); None for a criterion."""


@dataclass(frozen=True, eq=False)
class Construction:
    value: cst.BaseExpression
    """The expression that builds the criterion, wrapped as a whole (``nn.CrossEntropyLoss().cuda()``)."""
    core: cst.Call
    """The constructor call inside ``value``."""
    loss_class: Optional[str] = None
    """The name of torch's loss class (``CrossEntropyLoss``), when it is one (None: a loss class of the project)."""
    parallel: bool = False
    """A criterion that takes a wrapper's per-device outputs (the runtime's, or PyTorch-Encoding's)."""


@dataclass(eq=False)
class Criterion:
    places: set[Place] = field(default_factory=set)
    calls: list[LossCall] = field(default_factory=list)
    constructions: list[Construction] = field(default_factory=list)


class LossFlow:
    def __init__(self, analysis, models: ModelFlow) -> None:
        self.analysis = analysis
        self.models = models
        self.calls: list[LossCall] = []
        self.criteria: list[Criterion] = []
        if models.sites:
            self.index: FlowIndex = models.index
            self._find()

    # -- loss calls --------------------------------------------------------------------------------
    def _find(self) -> None:
        candidates: dict[Place, list[LossCall]] = {}
        for call, scope in self.index.calls:
            prediction = _prediction(call)
            if prediction is None:
                continue
            direct = self.models.output_sites(prediction, scope)
            transformed = self.models.derived_sites(prediction, scope) - direct
            if not (direct or transformed):
                continue
            qualified = self.analysis.resolve(call.func)
            if qualified in FUNCTIONAL_LOSSES:
                self.calls.append(LossCall(call, scope, prediction, direct, transformed, qualified))
                continue
            if qualified is not None or self.index.callee(call, scope) is not None:
                continue
            place = self.index.place_of(call.func, scope)
            if place is not None:
                candidates.setdefault(place, []).append(LossCall(call, scope, prediction, direct, transformed))
        claimed: set[Place] = set()
        for place in candidates:
            if place in claimed:
                continue
            criterion = self._criterion(place)
            if not criterion.constructions:
                continue  # not built as a criterion anywhere in this file: an escape, not a loss
            claimed |= criterion.places
            criterion.calls = [c for p in criterion.places for c in candidates.get(p, ())]
            self.calls.extend(criterion.calls)
            self.criteria.append(criterion)

    # -- criteria ----------------------------------------------------------------------------------
    def _criterion(self, start: Place) -> Criterion:
        criterion = Criterion()
        pending = [start]
        while pending:
            place = pending.pop()
            if place in criterion.places:
                continue
            criterion.places.add(place)
            pending.extend(self._sources(place, criterion))
            pending.extend(self._uses(place))
        return criterion

    def _sources(self, place: Place, criterion: Criterion) -> list[Place]:
        """Record where the value at ``place`` comes from; return the places it is copied from."""
        more: list[Place] = []
        index = self.index
        for assignment in index.assignments:
            if place in index.assigned_places(assignment.target, assignment.scope) and type(assignment.target) not in (cst.Tuple, cst.List):
                more.extend(self._value_source(assignment.value, assignment.scope, criterion))
        scope, name = place
        function = scope.node if type(scope.node) is cst.FunctionDef else None
        if function is not None and name in index.parameters(function):
            sites = index.call_sites(function)
            for call, caller_scope, implicit in sites:
                for position, arg in enumerate(call.args):
                    if index.parameter_place(function, call, position, implicit) == place:
                        more.extend(self._value_source(arg.value, caller_scope, criterion))
            default = _parameter_default(function, name)
            if default is not None and not (type(default) is cst.Name and default.value == "None"):
                more.extend(self._value_source(default, scope.parent or scope, criterion))
        return more

    def _value_source(self, value: cst.BaseExpression, scope: Scope, criterion: Criterion) -> list[Place]:
        if type(value) in (cst.IfExp, cst.BooleanOperation):
            parts = (value.body, value.orelse) if type(value) is cst.IfExp else (value.left, value.right)
            return [p for part in parts for p in self._value_source(part, scope, criterion)]
        core = _strip_module_methods(value)
        if type(core) is cst.Name and core.value == "None":
            return []
        if type(core) in (cst.Name, cst.Attribute, cst.Subscript):
            place = self.index.place_of(core, scope)
            return [place] if place else []
        if type(core) is cst.Call:
            callee = self.index.callee(core, scope)
            if callee is not None and callee[1] == 0:
                # A factory of this file: what it returns is the source.
                function = callee[0]
                return [
                    p
                    for returning, returned, inner in self.index.returns
                    if returning is function
                    for p in self._value_source(returned, inner, criterion)
                ]
        construction = self._construction(value, core, scope)
        if construction is not None:
            criterion.constructions.append(construction)
        return []

    def _construction(self, value: cst.BaseExpression, core: cst.BaseExpression, scope: Scope) -> Optional[Construction]:
        if type(core) is not cst.Call:
            return None
        qualified = self.analysis.resolve(core.func)
        if qualified in PARALLEL_CRITERIA:
            return Construction(value, core, parallel=True)
        if qualified is not None and qualified.startswith("torch.nn."):
            name = qualified[len("torch.nn."):]
            return Construction(value, core, loss_class=name) if name.endswith("Loss") else None
        if self._is_loss_class(core.func, scope):
            return Construction(value, core)
        return None

    def _is_loss_class(self, func: cst.BaseExpression, scope: Scope) -> bool:
        """A class of this file, or one whose name says it is a loss (``FocalLoss``, ``DiceCriterion``)."""
        if type(func) is cst.Name:
            owner = scope.lookup(func.value)
            if func.value in owner.classes:
                return True
        last = func.attr.value if type(func) is cst.Attribute else getattr(func, "value", "")
        return isinstance(last, str) and last[:1].isupper() and last.endswith(("Loss", "Criterion"))

    def _uses(self, place: Place) -> list[Place]:
        """The places the criterion at ``place`` is copied to: assigned, or passed to a function of this file."""
        more: list[Place] = []
        index = self.index
        for node, scope, slot in index.references(place):
            if slot is None:
                continue
            if slot.kind == "assign":
                more.extend(self._assignment_targets(slot.parent, scope))
            elif slot.kind == "arg" and type(slot.parent) is cst.Call:
                more.extend(param for param in index.parameters_receiving(slot.parent, node, scope) or () if param is not None)
        return more

    def _assignment_targets(self, statement: cst.CSTNode, scope: Scope) -> list[Place]:
        targets = []
        if type(statement) is cst.Assign:
            targets = [t.target for t in statement.targets]
        elif type(statement) in (cst.AnnAssign, cst.NamedExpr):
            targets = [statement.target]
        places = []
        for target in targets:
            if type(target) in (cst.Name, cst.Attribute, cst.Subscript):
                place = self.index.place_of(target, scope)
                if place is not None:
                    places.append(place)
        return places


def class_parameters(loss_class: str) -> Optional[tuple[str, ...]]:
    """The constructor parameters of one of torch's splittable loss classes, in order; None for others."""
    function = SPLITTABLE_LOSSES.get(loss_class)
    if function is None:
        return None
    return tuple(p for p in LOSS_PARAMETERS[function] if p not in FUNCTIONAL_ONLY.get(function, ()))


def reduction_of(args: Sequence[cst.Arg], parameters: Optional[tuple[str, ...]]) -> Optional[str]:
    """The reduction a loss's options ask for (``mean``, ``sum``, ``none``), None when it cannot be read
    from the code (a variable, the legacy ``size_average``/``reduce``, options that cannot be placed)."""
    positional = 0
    reduction = "mean"
    for arg in args:
        if arg.star:
            return None
        if arg.keyword is None:
            if parameters is None or positional >= len(parameters):
                return None
            keyword = parameters[positional]
            positional += 1
        else:
            keyword = arg.keyword.value
        if keyword in ("size_average", "reduce"):
            if type(arg.value) is cst.Name and arg.value.value == "None":
                continue  # the legacy options' default
            return None
        if keyword == "reduction":
            if type(arg.value) is not cst.SimpleString:
                return None
            reduction = arg.value.evaluated_value
    return reduction


def exact_under_ddp_without_wrapper(loss_class: str, reduction: Optional[str]) -> bool:
    """Whether the DDP runtime's gradient weighting (each rank's gradient times its share of the global batch)
    alone makes this loss's gradient exact: true for means over rows or elements and for unreduced losses;
    false for sums, for a reduction the code does not show, and for cross-entropy/NLL, whose mean is over
    the weight of the targets (class weights, ignored targets), not over rows."""
    if reduction == "none":
        return True
    # KLDivLoss's 'batchmean' is a sum over the rank's rows divided by their count: a mean over rows.
    return reduction in ("mean", "batchmean") and loss_class not in CLASS_INDEX_LOSSES


def _strip_module_methods(value: cst.BaseExpression) -> cst.BaseExpression:
    """``nn.CrossEntropyLoss()`` for ``nn.CrossEntropyLoss().cuda()``: the methods return the module itself."""
    while (
        type(value) is cst.Call
        and type(value.func) is cst.Attribute
        and value.func.attr.value in MODULE_METHODS_RETURNING_SELF
    ):
        value = value.func.value
    return value


def _prediction(call: cst.Call) -> Optional[cst.BaseExpression]:
    """A loss's first argument (``input=`` when given by keyword)."""
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is None or arg.keyword.value == "input":
            return arg.value
    return None


def _parameter_default(function: cst.FunctionDef, name: str) -> Optional[cst.BaseExpression]:
    params = function.params
    for param in (*params.posonly_params, *params.params, *params.kwonly_params):
        if param.name.value == name:
            return param.default
    return None
