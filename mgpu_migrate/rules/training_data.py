"""MGP122: the loaders that feed training go through ``mgpu_runtime.distribute_loader`` (``--to ddp``)."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.entrypoint import distributed_program
from mgpu_migrate.analysis.loaders import LOADER, LoaderTrace
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.rules.base import DDP, Example, Rule
from mgpu_migrate.rules.syntax import RUNTIME, argument, runtime_call

# torch's own samplers draw from the generator the runtime keeps in step; others may not.
_TORCH_SAMPLERS = {
    f"torch.utils.data{module}.{name}"
    for module in ("", ".sampler")
    for name in ("RandomSampler", "SequentialSampler", "SubsetRandomSampler", "WeightedRandomSampler", "BatchSampler")
}
_ITERABLE_DATASETS = {"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"}
# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)
_SAMPLER_POSITIONS = {"sampler": 3, "batch_sampler": 4}


class TrainingData(Rule):
    """
    ## What it does
    Wraps each ``DataLoader`` that feeds a training loop (the innermost ``for`` loop around
    ``.backward()``, directly or through this file's functions) in ``mgpu_runtime.distribute_loader(...)``,
    at the point closest to its construction that feeds training only. Evaluation loaders are left whole.

    ## Why is this bad?
    Under DDP each process must train on its own part of every batch, or every process computes the same
    gradient and the run is no faster. ``distribute_loader`` gives each process its slice of each of the
    original's global batches, in the original order and with the original sampler's randomness, and the
    runtime weights the gradients by each slice's share, so the run trains on exactly the original batches.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
    ```

    ## Use instead
    ```python
    loader = mgpu_runtime.distribute_loader(DataLoader(dataset, batch_size=32, shuffle=True))
    ```

    ## Fix safety
    Safe for losses that are a mean over the batch (also computed inside the model), and for criteria the
    runtime sees through ``DistributedCriterion``. A loss summed by hand (``.sum()``, ``reduction="sum"`` in
    a functional loss) would be counted with the wrong weight, so that loop's data is left whole (MGP236):
    every process then trains on whole batches, which is correct but not faster. Data the analysis cannot
    follow to a ``DataLoader`` is left whole too (MGP235). An evaluation loader is left whole (MGP234): every
    process evaluates all of it, so metrics are the original's. A custom sampler (MGP237) or an iterable
    dataset (MGP238) is distributed, with a note on what to check.
    """

    CODE = "MGP122"
    REVIEW_CODES = {
        "MGP234": "an evaluation loader left whole: every process evaluates all of it",
        "MGP235": "training data the tool cannot follow to a DataLoader: not split across processes",
        "MGP236": "a loss summed by hand: the runtime cannot weight it, so that loop's data is not split",
        "MGP237": "a custom sampler: it runs on the main process only and each of its batches is split",
        "MGP238": "an iterable dataset: the main process reads every batch and sends each process its rows",
    }
    DESCRIPTION = "training loaders distributed with mgpu_runtime.distribute_loader"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            "import torch.nn as nn\nfrom torch.utils.data import DataLoader\n\nmodel = nn.DataParallel(model)\n"
            "loader = DataLoader(data, batch_size=8, shuffle=True)\nfor x, y in loader:\n"
            "    loss = criterion(model(x), y)\n    loss.backward()\n",
            "from torch.utils.data import DataLoader\nimport mgpu_runtime\n\nmgpu_runtime.setup()\n\n"
            "model = mgpu_runtime.DistributedDataParallel(model)\n"
            "loader = mgpu_runtime.distribute_loader(DataLoader(data, batch_size=8, shuffle=True))\nfor x, y in loader:\n"
            "    loss = criterion(model(x), y)\n    loss.backward()\n",
            DDP,
            ("MGP101", "MGP120", "MGP122"),
        ),
        Example(
            "import torch.nn as nn\nfrom torch.utils.data import DataLoader\n\nmodel = nn.DataParallel(model)\n"
            "loader = DataLoader(data, batch_size=8)\nfor x, y in loader:\n"
            "    loss = (model(x) - y).pow(2).sum()\n    loss.backward()\n",
            "from torch.utils.data import DataLoader\nimport mgpu_runtime\n\nmgpu_runtime.setup()\n\n"
            "model = mgpu_runtime.DistributedDataParallel(model)\n"
            "loader = DataLoader(data, batch_size=8)\nfor x, y in loader:\n"
            "    loss = (model(x) - y).pow(2).sum()\n    loss.backward()\n",
            DDP,
            ("MGP101", "MGP120", "MGP236"),
        ),
    )

    def apply(self) -> None:
        program = distributed_program(self.analysis, self.edits.replacements)
        if not program.migrates:
            return
        flow = self.analysis.loaders
        summed = {loop: self._summed_loss(loop) for loop in flow.training_loops}
        wrapped: set[cst.CSTNode] = set()
        reported: set[cst.CSTNode] = set()
        for trace in flow.traces:
            if not trace.training:
                continue
            if summed[trace.loop] is not None:
                self._report_once(reported, trace.loop, "MGP236", self._summed_message(summed[trace.loop]))
            elif trace.origin is None:
                iterable = self.analysis.module.code_for_node(trace.path[-1]) if trace.path else "its data"
                self._report_once(
                    reported,
                    trace.loop,
                    "MGP235",
                    f"this training loop's data (`{iterable}`) is not followed to a DataLoader here, so it is not "
                    f"split across processes (each trains on whole batches: correct, not faster); pass the loader "
                    f"through {RUNTIME}.distribute_loader(...) where it is built",
                )
            elif trace.kind == LOADER:
                point = self._wrap_point(trace, summed)
                if point not in wrapped and self.rewrite_allowed(point):
                    wrapped.add(point)
                    self._distribute(point, trace.origin)
        for trace in flow.traces:
            if not trace.training and trace.kind == LOADER and flow.feeds(trace.origin) == {False}:
                self._report_once(
                    reported,
                    trace.origin,
                    "MGP234",
                    "evaluation loader left whole: every process evaluates all of it (the original's metrics, no "
                    "speed-up); to split it, distribute it and reduce the metrics with mgpu_runtime.reduce_sum",
                )

    def _wrap_point(self, trace: LoaderTrace, summed: dict) -> cst.BaseExpression:
        """The step closest to the loader's origin that feeds only training loops whose data may be split (the
        loop's own iterable at the latest)."""
        traces = self.analysis.loaders.traces

        def splittable(other: LoaderTrace) -> bool:
            return other.training and other.kind == LOADER and summed[other.loop] is None

        for step in reversed(trace.path):
            if all(splittable(other) for other in traces if any(s is step for s in other.path)):
                return step
        return trace.path[0]

    def _distribute(self, point: cst.BaseExpression, origin: cst.Call) -> None:
        self.edits.replace(point, lambda expr: runtime_call("distribute_loader", expr))
        self.edits.need_import(RUNTIME)
        self.rewrote(point, f"training data split across processes with {RUNTIME}.distribute_loader")
        sampler = self._custom_sampler(origin)
        if sampler is not None:
            self.left(
                sampler,
                "MGP237",
                "custom sampler: distribute_loader runs it on the main process only and splits each batch it "
                "makes; if it already splits data across processes (like DistributedSampler), drop that part",
            )
        dataset = self._iterable_dataset(origin)
        if dataset is not None:
            self.left(
                dataset,
                "MGP238",
                "iterable dataset: the main process reads every batch and sends each process its rows (correct; "
                "the loading is not divided among the processes)",
            )

    def _report_once(self, reported: set, node: cst.CSTNode, code: str, message: str) -> None:
        if node not in reported:
            reported.add(node)
            self.left(node, code, message)

    # -- sum-reduced losses ------------------------------------------------------------------------
    def _summed_loss(self, loop: cst.For) -> Optional[cst.CSTNode]:
        """A value summed by hand that the loop calls ``.backward()`` on, if any."""
        loop_scope = {}
        for node in contains(loop.body, lambda n: isinstance(n, (cst.Assign, cst.AugAssign))):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            for target in targets:
                if isinstance(target, cst.Name):
                    loop_scope.setdefault(target.value, []).append(node.value)
        for call in contains(loop.body, lambda n: isinstance(n, cst.Call) and self.analysis.loaders.is_backward(n)):
            receiver = (
                call.func.value if isinstance(call.func, cst.Attribute) else (call.args[0].value if call.args else None)
            )
            for value in self._values_of(receiver, loop_scope):
                if self._is_summed(value):
                    return value
        return None

    def _values_of(self, receiver, assigned) -> list[cst.BaseExpression]:
        # `scaler.scale(loss).backward()`: the scaled value.
        while (
            isinstance(receiver, cst.Call)
            and isinstance(receiver.func, cst.Attribute)
            and receiver.func.attr.value == "scale"
            and receiver.args
        ):
            receiver = receiver.args[0].value
        if isinstance(receiver, cst.Name):
            return assigned.get(receiver.value, [])
        return [receiver] if receiver is not None else []

    def _is_summed(self, value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.BinaryOperation):
            return self._is_summed(value.left) or self._is_summed(value.right)
        if not isinstance(value, cst.Call):
            return False
        if isinstance(value.func, cst.Attribute) and value.func.attr.value == "sum":
            return True
        if self.analysis.resolve(value.func) == "torch.sum":
            return True
        if value in self.edits.replacements:
            return False  # a loss the criterion rules hand to DistributedCriterion, which weights sums itself
        for arg in value.args:
            if arg.keyword is not None and arg.keyword.value == "reduction":
                return isinstance(arg.value, cst.SimpleString) and arg.value.evaluated_value == "sum"
            if arg.keyword is not None and arg.keyword.value == "size_average":
                return isinstance(arg.value, cst.Name) and arg.value.value == "False"
        return False

    def _summed_message(self, value: cst.CSTNode) -> str:
        line, _ = self.analysis.position(value)
        return (
            f"the loss is summed by hand (line {line}), which the runtime cannot weight by each process's share of "
            "the batch, so this loop's data is not split (each process trains on whole batches: correct, not "
            f"faster); use a mean, or a criterion wrapped in {RUNTIME}.DistributedCriterion, then distribute the loader"
        )

    # -- what to check on a distributed loader ------------------------------------------------------
    def _custom_sampler(self, loader: cst.Call) -> Optional[cst.BaseExpression]:
        """A sampler that is not one of torch's, given to the loader directly or inside a ``BatchSampler``."""
        scope = self.analysis.values.scope_of(loader)
        for name, position in _SAMPLER_POSITIONS.items():
            arg = argument(loader, name, position)
            if arg is None:
                continue
            for value in self.analysis.values.of(arg.value, scope):
                if isinstance(value, cst.Name) and value.value == "None":
                    continue
                if not isinstance(value, cst.Call) or self.analysis.resolve(value.func) not in _TORCH_SAMPLERS:
                    return arg.value
                inner = argument(value, "sampler", 0) if name == "batch_sampler" else None
                if inner is not None and self._custom_sampler_values(inner.value, scope):
                    return arg.value
        return None

    def _custom_sampler_values(self, expr: cst.BaseExpression, scope) -> bool:
        return any(
            not isinstance(value, cst.Call) or self.analysis.resolve(value.func) not in _TORCH_SAMPLERS
            for value in self.analysis.values.of(expr, scope)
        )

    def _iterable_dataset(self, loader: cst.Call) -> Optional[cst.BaseExpression]:
        """The loader's dataset when it is built from a class of this file deriving from ``IterableDataset``."""
        arg = argument(loader, "dataset", 0)
        if arg is None:
            return None
        classes = {s.name.value: s for s in self.analysis.module.body if isinstance(s, cst.ClassDef)}
        for value in self.analysis.values.of(arg.value, self.analysis.values.scope_of(loader)):
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in classes:
                if any(
                    self.analysis.resolve(base.value) in _ITERABLE_DATASETS for base in classes[value.func.value].bases
                ):
                    return arg.value
        return None
