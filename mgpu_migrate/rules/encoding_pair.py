"""MGP104: PyTorch-Encoding's ``DataParallelModel``/``DataParallelCriterion`` pair becomes the runtime's."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.models import ENCODING, WrapSite
from mgpu_migrate.analysis.scopes import Place, Scope
from mgpu_migrate.analysis.tree import is_zero
from mgpu_migrate.rules.base import BALANCED, DDP, WRAPS, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, runtime_attr

# Arguments of Encoding's wrappers with no meaning for DDP (one device per process) or for the runtime's
# criterion (it takes the devices from the outputs).
_DEVICE_ARGUMENTS = ("device_ids", "output_device", "dim")


ENCODING_PAIR_KEPT = Review(
    "MGP208",
    name="encoding-pair-kept",
    summary=(
        "PyTorch-Encoding's model outputs are used as a per-device list (or the wrap has dim != 0 "
        "under --to ddp); the pair is left as it is"
    ),
    why=(
        "PyTorch-Encoding's model returns one output per device; code that uses them as a list (or a wrap with "
        "`dim != 0` under `--to ddp`) would not work with the runtime's model, whose output behaves like the "
        "gathered one."
    ),
    todo="Use the outputs as one value (as after a gather), then run the tool again; or keep the pair.",
)


class EncodingPair(Rule):
    """
    ## What it does
    Replaces PyTorch-Encoding's pair (``from encoding.parallel import DataParallelModel,
    DataParallelCriterion``, or a vendored copy of its ``parallel.py``: a module of the user's own called
    ``parallel``, in a file that imports torch and no other framework) with the runtime's:
    ``mgpu_runtime.DataParallelModel`` and ``mgpu_runtime.DataParallelCriterion(criterion)`` for
    ``--to balanced``; ``mgpu_runtime.DistributedDataParallel(module)`` and the criterion itself for
    ``--to ddp`` (``criterion = DataParallelCriterion(criterion)`` goes). The imports the rewrite leaves unused
    are removed. torch's ``gather(outputs, 0, dim=0)`` of the per-device outputs (how Encoding's scripts
    evaluate) becomes ``mgpu_runtime.gather(outputs)``. GluonCV's pair of the same names
    (``gluoncv.utils.parallel``, for MXNet), and any ``parallel`` module of another framework, is not
    PyTorch-Encoding's and is left alone: it is no PyTorch code.

    ## Why is this bad?
    Encoding's criterion averages the per-device losses with equal weights, which is wrong when the batch
    does not split evenly (batch 5 on 2 devices gives 1.6302 where the cross-entropy is 1.5898), gives NaN
    when a device's targets are all ``ignore_index``, and fails on a batch that yields a single piece. The
    runtime's model gives the outputs as the global batch's values, on which the criterion computes the loss
    of the whole batch: the runtime's ``DataParallelCriterion`` only calls it, and keeps the pair's shape in
    a balanced script.

    ## Example
    ```python
    from encoding.parallel import DataParallelModel, DataParallelCriterion
    model = DataParallelModel(model, device_ids=[0, 1])
    criterion = DataParallelCriterion(criterion, device_ids=[0, 1])
    ```

    ## Use instead
    ```python
    model = mgpu_runtime.DataParallelModel(model, device_ids=[0, 1])
    criterion = mgpu_runtime.DataParallelCriterion(criterion)
    ```

    ## Fix safety
    The loss becomes the exact loss of the unsplit batch instead of Encoding's average of per-device
    averages: equal for even splits, corrected otherwise. Encoding's model returns a *list* of per-device
    outputs; when code in this file uses that list as one (indexes it, iterates over it, unpacks it, passes
    it anywhere but to a criterion or to torch's gather onto the first device, or reads it after such a gather
    without reassigning it), the pair is left as it is, with MGP208. The criterion's
    ``device_ids``/``output_device``/``dim`` are dropped: the outputs carry their devices.
    """

    CODE = Rewrite("MGP104")
    PHASE = WRAPS
    USES = ("flow", "losses", "models")
    REVIEW_CODES = (ENCODING_PAIR_KEPT,)
    DESCRIPTION = "PyTorch-Encoding's DataParallelModel/DataParallelCriterion replaced with the runtime's"
    EXAMPLES = (
        Example(
            """
            from encoding.parallel import DataParallelModel, DataParallelCriterion
            model = DataParallelModel(model, device_ids=[0, 1])
            criterion = DataParallelCriterion(criterion, device_ids=[0, 1])
            loss = criterion(model(image), target)
            """,
            """
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model, device_ids=[0, 1])
            criterion = mgpu_runtime.DataParallelCriterion(criterion)
            loss = criterion(model(image), target)
            """,
            BALANCED,
            ("MGP104",),
        ),
        Example(
            """
            import torch
            from .utils.parallel import DataParallelModel, DataParallelCriterion
            model = DataParallelModel(model, device_ids=[0, 1])
            criterion = DataParallelCriterion(criterion)
            outputs = model(image)
            loss = criterion(outputs, target)
            """,
            """
            import torch
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            outputs = model(image)
            loss = criterion(outputs, target)
            """,
            DDP,
            ("MGP104",),
        ),
        Example(
            """
            from encoding.parallel import DataParallelModel, DataParallelCriterion
            self.model = DataParallelModel(self.model).cuda()
            self.criterion = DataParallelCriterion(self.criterion, device_ids=[0, 1]).cuda()
            loss = self.criterion(self.model(image), target)
            """,
            """
            import mgpu_runtime
            self.model = mgpu_runtime.DistributedDataParallel(self.model).cuda()
            self.criterion = self.criterion.cuda()
            loss = self.criterion(self.model(image), target)
            """,
            DDP,
            ("MGP104",),
            message="PyTorch-Encoding's DataParallelCriterion dropped: the criterion",
            line=3,
        ),
        Example(
            """
            from torch.nn.parallel.scatter_gather import gather
            from encoding.parallel import DataParallelModel
            model = DataParallelModel(model)
            def evaluate(image):
                outputs = model(image)
                outputs = gather(outputs, 0, dim=0)
                return outputs[0].argmax(1)
            """,
            """
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model)
            def evaluate(image):
                outputs = model(image)
                outputs = mgpu_runtime.gather(outputs)
                return outputs[0].argmax(1)
            """,
            BALANCED,
            ("MGP104",),
        ),
        Example(
            """
            import encoding
            model = encoding.parallel.DataParallelModel(model)
            criterion = encoding.parallel.DataParallelCriterion(criterion)
            outputs = model(image)
            loss = criterion(outputs, target)
            pred = outputs[0][0]
            """,
            None,
            BALANCED,
            ("MGP208",),
        ),
        Example(
            """
            import mxnet as mx
            from gluoncv.utils.parallel import DataParallelModel, DataParallelCriterion
            model = DataParallelModel(model, ctx_list)
            criterion = DataParallelCriterion(loss, ctx_list)
            """,
            None,
            DDP,
        ),
    )

    def apply(self) -> None:
        models = self.analysis.models
        sites = [site for site in models.sites if site.kind == ENCODING]
        criteria = self.analysis.calls_to(names.ENCODING_CRITERION)
        if not sites and not criteria:
            return
        self._gathers: list[cst.Call] = []
        reason = self._blocker(sites, criteria)
        if reason is not None:
            node, why = reason
            line = self.analysis.position(node)[0]
            for call in [site.call for site in sites] + criteria:
                self.left(
                    call,
                    ENCODING_PAIR_KEPT,
                    f"PyTorch-Encoding's parallel pair left as it is: {why} (line {line})",
                )
            return
        for site in sites:
            self._swap_model(site.call)
        for call in criteria:
            self._swap_criterion(call)
        for call in self._gathers:
            self._swap_gather(call)

    def _swap_model(self, call: cst.Call) -> None:
        if not self.rewrite_allowed(call):
            return
        if self.target == BALANCED:
            self.edits.replace(call.func, lambda _: runtime_attr("DataParallelModel"))
            name = "DataParallelModel"
        else:
            kept = _without_device_arguments(call)
            self.edits.replace(call, lambda updated: _keep_args(updated, kept, "DistributedDataParallel"))
            name = "DistributedDataParallel"
        self.edits.need_import(RUNTIME)
        self.rewrote(call, f"PyTorch-Encoding's DataParallelModel replaced with {RUNTIME}.{name}")

    def _swap_criterion(self, call: cst.Call) -> None:
        if not self.rewrite_allowed(call):
            return
        if self.target == BALANCED:
            kept = _without_device_arguments(call)
            self.edits.replace(call, lambda updated: _keep_args(updated, kept, "DataParallelCriterion"))
            self.edits.need_import(RUNTIME)
            self.rewrote(call, f"PyTorch-Encoding's DataParallelCriterion replaced with {RUNTIME}.DataParallelCriterion")
            return
        # The runtime's outputs are the global batch's: the criterion itself computes the whole batch's loss.
        module = _argument(call, "module", 0)
        statement = self.analysis.tree.parent(call)
        code = self.analysis.code_of
        if type(statement) is cst.Assign and len(statement.targets) == 1 and code(statement.targets[0].target) == code(module):
            self.edits.replace(statement, lambda _: cst.RemovalSentinel.REMOVE)  # `criterion = criterion`
        else:
            self.edits.replace(call, lambda updated: _argument(updated, "module", 0))
        self.rewrote(call, "PyTorch-Encoding's DataParallelCriterion dropped: the criterion computes the whole batch's loss")

    def _swap_gather(self, call: cst.Call) -> None:
        if not self.rewrite_allowed(call):
            return
        self.edits.replace(call, _runtime_gather)
        self.edits.need_import(RUNTIME)
        self.rewrote(call, f"torch's gather of PyTorch-Encoding's per-device outputs replaced with {RUNTIME}.gather")

    def _is_default_gather(self, call: cst.Call, outputs: cst.CSTNode) -> bool:
        """``gather(outputs, 0, dim=0)`` of torch's scatter_gather: onto the first device, along the batch, which is
        what ``mgpu_runtime.gather`` gives for a model with the default devices."""
        if self.analysis.resolve(call.func) not in _TORCH_GATHER or not call.args or call.args[0].value is not outputs:
            return False
        known = {"outputs", "target_device", "dim"}
        if any(arg.star or (arg.keyword is not None and arg.keyword.value not in known) for arg in call.args):
            return False
        return all(value is None or is_zero(value) for value in (_argument(call, "target_device", 1), _argument(call, "dim", 2)))

    # -- precondition: Encoding's list of outputs only reaches its criterion or torch's gather ----------
    def _blocker(self, sites: list[WrapSite], criteria: list[cst.Call]) -> Optional[tuple[cst.CSTNode, str]]:
        models = self.analysis.models
        if self.target == DDP:
            for call in criteria:
                module = _argument(call, "module", 0)
                if module is None or any(arg.star for arg in call.args):
                    return call, "the criterion it wraps is not an argument the tool can read"
            for site in sites:
                dim = _argument(site.call, "dim", 3)
                if dim is not None and not (type(dim) is cst.Integer and dim.evaluated_value == 0):
                    return site.call, "the model is split along `dim` != 0, which DDP cannot do"
        loss_predictions = {call.prediction for call in self.analysis.losses.calls}
        seen: set = set()
        for call, scope, found in models.model_calls():
            if found & set(sites):
                blocker = self._value_uses(call, scope, loss_predictions, seen)
                if blocker is not None:
                    return blocker
        return None

    def _value_uses(self, node: cst.CSTNode, scope: Scope, predictions: set, seen: set) -> Optional[tuple[cst.CSTNode, str]]:
        """Where the outputs held by ``node`` are used other than as a criterion's prediction."""
        index = self.analysis.flow
        if node in predictions:
            return None
        slot = index.slots.get(node)
        kind, parent = (slot.kind, slot.parent) if slot else ("other", None)
        if kind == "assign" and type(parent) in (cst.Assign, cst.AnnAssign):
            targets = [t.target for t in parent.targets] if type(parent) is cst.Assign else [parent.target]
            for target in targets:
                if type(target) not in (cst.Name, cst.Attribute):
                    return target, "the outputs are unpacked"
                place = index.place_of(target, scope)
                if place is not None:
                    blocker = self._place_uses(place, predictions, seen)
                    if blocker is not None:
                        return blocker
            return None
        if kind == "arg" and type(parent) is cst.Call:
            if self._is_default_gather(parent, node):
                self._gathers.append(parent)
                return None
            for place in index.parameters_receiving(parent, node, scope) or ():
                if place is not None:
                    return self._place_uses(place, predictions, seen)
            return parent, f"the outputs are passed to `{self.analysis.code_of(parent.func)}(...)`"
        if kind == "return":
            function = scope.node if type(scope.node) is cst.FunctionDef else None
            sites = index.call_sites(function) if function is not None else []
            if not sites:
                return node, "the outputs are returned to code outside this file"
            for call, caller_scope, _ in sites:
                blocker = self._value_uses(call, caller_scope, predictions, seen)
                if blocker is not None:
                    return blocker
            return None
        return node, "the outputs are used as a list"

    def _place_uses(self, place: Place, predictions: set, seen: set) -> Optional[tuple[cst.CSTNode, str]]:
        if place in seen:
            return None
        seen.add(place)
        regathered = self._regathered_lines(place)
        for node, scope, _ in self.analysis.flow.references(place):
            if regathered and self._reads_gathered(node, regathered):
                continue
            blocker = self._value_uses(node, scope, predictions, seen)
            if blocker is not None:
                return blocker
        return None

    def _regathered_lines(self, place: Place) -> list[tuple[int, bool]]:
        """``outputs = gather(outputs, 0, dim=0)`` (True) and any other assignment of ``place`` (False), by line:
        after the first kind, and until the next assignment, ``outputs`` holds the gathered value."""
        index = self.analysis.flow
        lines = []
        for assignment in index.assignments:
            if index.place_of(assignment.target, assignment.scope) != place:
                continue
            value = assignment.value
            regather = (
                type(value) is cst.Call
                and bool(value.args)
                and index.place_of(value.args[0].value, assignment.scope) == place
                and self._is_default_gather(value, value.args[0].value)
            )
            lines.append((self.analysis.position(assignment.target)[0], regather))
        return sorted(lines) if any(regather for _, regather in lines) else []

    def _reads_gathered(self, node: cst.CSTNode, lines: list[tuple[int, bool]]) -> bool:
        line = self.analysis.position(node)[0]
        latest = [regather for assigned, regather in lines if assigned < line]
        return bool(latest) and latest[-1]


_TORCH_GATHER = frozenset({"torch.nn.parallel.scatter_gather.gather", "torch.nn.parallel.gather"})


def _argument(call: cst.Call, keyword: str, position: int) -> Optional[cst.BaseExpression]:
    for index, arg in enumerate(call.args):
        if (arg.keyword is not None and arg.keyword.value == keyword) or (arg.keyword is None and index == position):
            return arg.value
    return None


def _without_device_arguments(call: cst.Call) -> list[int]:
    """Indices of the arguments to keep: the wrapped module (or criterion) and unrelated keywords."""
    kept = []
    for index, arg in enumerate(call.args):
        if arg.keyword is None and not arg.star:
            if index == 0:
                kept.append(index)
        elif arg.keyword is not None and arg.keyword.value not in _DEVICE_ARGUMENTS:
            kept.append(index)
    return kept


def _keep_args(updated: cst.Call, kept: list[int], name: str) -> cst.Call:
    args = [updated.args[index] for index in kept]
    if args:
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return updated.with_changes(func=runtime_attr(name), args=args)


def _runtime_gather(updated: cst.Call) -> cst.Call:
    outputs = updated.args[0].with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT, comma=cst.MaybeSentinel.DEFAULT)
    return updated.with_changes(func=runtime_attr("gather"), args=[outputs])
