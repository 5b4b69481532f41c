"""MGP122: the loaders that feed training go through ``mgpu_runtime.distribute_loader`` (``--to ddp``)."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.batch import is_row_count
from mgpu_migrate.analysis.loaders import LOADER, LoaderTrace
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.global_count import GLOBAL_COUNT
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
# What leaving a training loop's data whole means, in the messages that say so.
# How many calls deep a loss handed to a function of this file is followed back.
_ARGUMENT_DEPTH = 3


def _is_name(node: cst.BaseExpression, name: str) -> bool:
    return type(node) is cst.Name and node.value == name


EVALUATION_LOADER_WHOLE = Review(
    "MGP234",
    name="evaluation-loader-whole",
    summary="an evaluation loader left whole: every process evaluates all of it",
    why=(
        "An evaluation loader is left whole: every process evaluates all of it, so the metrics are the "
        "original's, without a speed-up."
    ),
    todo=(
        "To split it, pass it through `mgpu_runtime.distribute_loader(...)` and reduce the metrics over the "
        "processes with `mgpu_runtime.reduce_sum`."
    ),
)
TRAINING_DATA_NOT_FOLLOWED = Review(
    "MGP235",
    name="training-data-not-followed",
    summary="training data the tool cannot follow to a DataLoader, or cannot tell is trained on: not split",
    why=(
        "The tool cannot follow this training loop's data to a DataLoader, or cannot tell whether the loop "
        "trains, so the data is not split. Each process then trains on whole batches: the original's training "
        "only if every process draws the same ones (seeded alike, or not shuffled); the runtime stops the "
        "first step when they differ."
    ),
    todo="Pass the loader through `mgpu_runtime.distribute_loader(...)` where it is built.",
)
SUMMED_LOSS = Review(
    "MGP236",
    name="summed-loss",
    summary="a loss summed by hand: the runtime cannot weight it, so that loop's data is not split",
    why=(
        "The loss is summed by hand, which the runtime cannot weight by each process's share of the batch, so "
        "this loop's data is not split (each process trains on whole batches, as for MGP235)."
    ),
    todo="Use a mean, or a criterion wrapped in `mgpu_runtime.DistributedCriterion`, then distribute the loader.",
    accounts_for_data=True,
)
CUSTOM_SAMPLER = Review(
    "MGP237",
    name="custom-sampler",
    summary="a custom sampler: it runs on the main process only and each of its batches is split",
    why="`distribute_loader` runs a custom sampler on the main process only and splits each batch it makes.",
    todo="If the sampler already splits the data across processes (like `DistributedSampler`), drop that part.",
)
ITERABLE_DATASET = Review(
    "MGP238",
    name="iterable-dataset",
    summary="an iterable dataset: the main process reads every batch and sends each process its rows",
    why=(
        "With an iterable dataset the main process reads every batch and sends each process its rows: correct, "
        "but the loading is not divided among the processes."
    ),
    todo="Nothing, unless loading is the bottleneck: then shard the dataset by `mgpu_runtime.rank()` yourself.",
)
# Calls that count what they are called on (``mask.sum()``, ``x.numel()``), and those that make a mask to count.
_COUNTING = frozenset({"sum", "count_nonzero", "numel", "nelement"})
_MASKS = frozenset({"ne", "eq", "gt", "ge", "lt", "le", "bool"})
_CONVERSIONS = frozenset({"item", "int", "float", "long", "cpu", "detach"})
_BUILTIN_CONVERSIONS = frozenset({"int", "float"})


class TrainingData(Rule):
    """
    ## What it does
    Wraps each ``DataLoader`` that feeds a training loop (the innermost ``for`` loop around
    ``.backward()``, directly or through this file's functions) in ``mgpu_runtime.distribute_loader(...)``,
    at the point closest to its construction that feeds training only. A function that trains only when a
    parameter says so (``def run_epoch(loader, train)`` with ``if train: loss.backward()``) trains on the
    loaders of the calls whose literal says so (``run_epoch(train_loader, True)``). Evaluation loaders are
    left whole.

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
    a functional loss) would be counted with the wrong weight, so that loop's data is left whole (MGP236).
    Data the analysis cannot follow to a ``DataLoader`` is left whole too (MGP235), and so is data that
    reaches a loop training only for some callers (``if train: loss.backward()``) through a call whose
    ``train`` the tool cannot read. Data left whole gives every process whole batches: that is the
    original's training only when every process draws the same batches (a loader seeded alike in every
    process, or not shuffled), and the runtime stops the first optimizer step when they differ. Loops that
    only count (``for epoch in range(epochs)``) are not data loops. An evaluation loader is left whole
    (MGP234): every process evaluates all of it, so metrics are the original's. A custom sampler (MGP237)
    or an iterable dataset (MGP238) is distributed, with a note on what to check.
    """

    CODE = Rewrite("MGP122", accounts_for_data=True)
    PHASE = PROGRAM
    STYLES = (RUNTIME_STYLE,)
    REVIEW_CODES = (EVALUATION_LOADER_WHOLE, TRAINING_DATA_NOT_FOLLOWED, SUMMED_LOSS, CUSTOM_SAMPLER, ITERABLE_DATASET)
    DESCRIPTION = "training loaders distributed with mgpu_runtime.distribute_loader"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            from torch.utils.data import DataLoader

            model = nn.DataParallel(model)
            loader = DataLoader(data, batch_size=8, shuffle=True)
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
            """,
            """
            from torch.utils.data import DataLoader
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            loader = mgpu_runtime.distribute_loader(DataLoader(data, batch_size=8, shuffle=True))
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
            """,
            DDP,
            ("MGP101", "MGP122"),
        ),
        Example(
            """
            import torch.nn as nn
            from torch.utils.data import DataLoader

            model = nn.DataParallel(model)
            loader = DataLoader(data, batch_size=8)
            for x, y in loader:
                loss = (model(x) - y).pow(2).sum()
                loss.backward()
            """,
            """
            from torch.utils.data import DataLoader
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            loader = DataLoader(data, batch_size=8)
            for x, y in loader:
                loss = (model(x) - y).pow(2).sum()
                loss.backward()
            """,
            DDP,
            ("MGP101", "MGP236"),
        ),
    )

    def apply(self) -> None:
        program = self.program
        if not program.migrates:
            return
        flow = self.analysis.loaders
        summed = {loop: self._summed_loss(loop) for loop in flow.training_loops}
        wrapped: set[cst.CSTNode] = set()
        reported: set[cst.CSTNode] = set()
        code = self.analysis.code_of
        for trace in flow.traces:
            if trace.unsure is not None:
                self._report_once(reported, trace.loop, TRAINING_DATA_NOT_FOLLOWED, self._unsure_message(trace))
            if not trace.training:
                continue
            if summed[trace.loop] is not None:
                self._report_once(reported, trace.loop, SUMMED_LOSS, self._summed_message(summed[trace.loop]))
            elif trace.origin is None:
                if any(other.loop is trace.loop and other.origin is not None for other in flow.traces):
                    continue  # the loop draws its batches from a loader the analysis followed
                data = self._drawn_data(trace)
                if data is not None:
                    self._report_once(
                        reported,
                        trace.loop,
                        TRAINING_DATA_NOT_FOLLOWED,
                        f"this training loop's data (`{shorten(code(data))}`) is not followed to a DataLoader: not "
                        "split",
                    )
            elif trace.kind == LOADER:
                point = self._wrap_point(trace, summed)
                if point not in wrapped and self.rewrite_allowed(point):
                    wrapped.add(point)
                    self._distribute(point, trace.origin, trace)
        split = dict.fromkeys(trace.loop for trace in flow.traces if any(step in wrapped for step in trace.path))
        respelled: set[cst.Call] = set()
        for draw, path in flow.old_draws:
            if draw not in respelled and any(step in wrapped for step in path) and self.rewrite_allowed(draw):
                respelled.add(draw)
                self.edits.replace(draw, lambda call: cst.Call(cst.Name("next"), [cst.Arg(call.func.value)]))
                self.rewrote(
                    draw,
                    f"`{shorten(code(draw), 30)}` drawn with `next()`: the distributed loader's iterator, like torch's "
                    "since 1.0, has no Python 2 `.next()`",
                )
        counters = dict.fromkeys(counter for loop in split for counter in sample_counters(self.analysis, loop))
        for counter in counters:
            if self.rewrite_allowed(counter.value):
                self.edits.replace(counter.value, lambda expr: runtime_call("reduce_sum", expr))
                self.rewrote(
                    counter,
                    f"`{shorten(code(counter.target), 30)}` counts the samples of the global batch (summed over the "
                    "processes), as the original did",
                    GLOBAL_COUNT,
                )
        for trace in flow.traces:
            if not trace.training and trace.kind == LOADER and flow.feeds(trace.origin) == {False}:
                self._report_once(
                    reported,
                    trace.origin,
                    EVALUATION_LOADER_WHOLE,
                    "evaluation loader left whole: every process evaluates all of it",
                )

    def _drawn_data(self, trace: LoaderTrace) -> Optional[cst.BaseExpression]:
        """Where a training loop the analysis could not follow gets its data: what it iterates, or, for a loop
        that only counts, the ``next(...)`` it draws batches with (None when it draws none)."""
        if not self.analysis.loaders.counts(trace.loop):
            return trace.path[-1] if trace.path else trace.loop.iter
        drawn = contains(trace.loop.body, lambda n: type(n) is cst.Call and _is_name(n.func, "next"))
        return drawn[0] if drawn else None

    def _unsure_message(self, trace: LoaderTrace) -> str:
        line = self.analysis.position
        traces = self.analysis.loaders.traces
        lines = sorted({line(other.path[-1])[0] for other in traces if other.loop is trace.loop and other.unsure})
        data = ("line " if len(lines) == 1 else "lines ") + ", ".join(map(str, lines))
        return (
            f"this loop trains only when `{shorten(self.analysis.code_of(trace.unsure), 30)}` holds "
            f"(line {line(trace.unsure)[0]}), unknown for the data from {data}: not split"
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

    def _distribute(self, point: cst.BaseExpression, origin: cst.Call, trace: LoaderTrace) -> None:
        self.edits.replace(point, lambda expr: runtime_call("distribute_loader", expr))
        self.edits.need_import(RUNTIME)
        self.rewrote(point, f"training data split across processes with {RUNTIME}.distribute_loader")
        sampler = self._custom_sampler(origin)
        if sampler is not None:
            self.left(
                sampler,
                CUSTOM_SAMPLER,
                "custom sampler: distribute_loader runs it on the main process only and splits each batch it makes",
            )
        dataset = self._iterable_dataset(origin)
        if dataset is not None:
            self.left(
                dataset,
                ITERABLE_DATASET,
                "iterable dataset: the main process reads every batch and sends each process its rows",
            )

    def _report_once(self, reported: set, node: cst.CSTNode, code: str, message: str) -> None:
        if node not in reported:
            reported.add(node)
            self.left(node, code, message)

    # -- sum-reduced losses ------------------------------------------------------------------------
    def _summed_loss(self, loop: cst.For) -> Optional[cst.CSTNode]:
        """A value summed by hand that a backward pass of this training loop is called on, if any (the pass
        in the loop's body, or in a function of this file the loop calls)."""
        for call in self.analysis.loaders.backward_calls(loop):
            receiver = (
                call.func.value if type(call.func) is cst.Attribute else (call.args[0].value if call.args else None)
            )
            region = self._region(call, loop)
            for value in self._values_of(receiver, region, loop, _ARGUMENT_DEPTH):
                if self._is_summed(value):
                    return value
            accumulated = self._accumulated_over_rows(receiver, region)
            if accumulated is not None:
                return accumulated
        return None

    def _accumulated_over_rows(self, receiver, region: cst.CSTNode) -> Optional[cst.CSTNode]:
        """``loss += f(out[b], y[b])`` in ``for b in range(out.shape[0])``: one term per row, a sum."""
        if type(receiver) is not cst.Name:
            return None
        for node in contains(region, lambda n: type(n) is cst.AugAssign and type(n.operator) is cst.AddAssign):
            if type(node.target) is not cst.Name or node.target.value != receiver.value:
                continue
            for loop in self.analysis.tree.ancestors(node):
                if loop is region:
                    break
                if (
                    type(loop) is cst.For
                    and type(loop.iter) is cst.Call
                    and type(loop.iter.func) is cst.Name
                    and loop.iter.func.value == "range"
                    and len(loop.iter.args) == 1
                    and is_row_count(self.analysis, loop.iter.args[0].value)
                ):
                    return node
        return None

    def _region(self, node: cst.CSTNode, loop: cst.For) -> cst.CSTNode:
        """Where the names ``node`` reads are assigned: the loop's body when ``node`` is in it, otherwise the
        body of the function that holds ``node`` (the module at top level)."""
        tree = self.analysis.tree
        if loop in tree.ancestors(node) and tree.function(node) is tree.function(loop):
            return loop.body
        function = tree.function(node)
        return function.body if function is not None else self.analysis.module

    def _values_of(self, receiver, region: cst.CSTNode, loop: cst.For, depth: int) -> list[cst.BaseExpression]:
        """What ``receiver`` may hold: what ``region`` assigns to it, or what this file's calls pass to it
        when it is a parameter of the function whose body ``region`` is."""
        # `scaler.scale(loss).backward()`: the scaled value.
        while (
            type(receiver) is cst.Call
            and type(receiver.func) is cst.Attribute
            and receiver.func.attr.value == "scale"
            and receiver.args
        ):
            receiver = receiver.args[0].value
        if type(receiver) is not cst.Name:
            return [receiver] if receiver is not None else []
        assigned = [
            node.value
            for node in contains(region, lambda n: type(n) in (cst.Assign, cst.AugAssign))
            for target in ([t.target for t in node.targets] if type(node) is cst.Assign else [node.target])
            if type(target) is cst.Name and target.value == receiver.value
        ]
        if assigned:
            return assigned
        index = self.analysis.flow
        function = self.analysis.tree.parent(region)
        if depth == 0 or type(function) is not cst.FunctionDef or receiver.value not in index.parameters(function):
            return []
        place = (index.scopes[function], receiver.value)
        return [
            value
            for call, _, implicit in index.call_sites(function)
            for position, arg in enumerate(call.args)
            if index.parameter_place(function, call, position, implicit) == place
            for value in self._values_of(arg.value, self._region(call, loop), loop, depth - 1)
        ]

    def _is_summed(self, value: cst.BaseExpression) -> bool:
        if type(value) is cst.BinaryOperation:
            if type(value.operator) is cst.Divide and is_row_count(self.analysis, value.right):
                return False  # a sum over the rows divided by their count: a mean
            if type(value.operator) is cst.Multiply and (
                is_row_count(self.analysis, value.left) or is_row_count(self.analysis, value.right)
            ):
                return True  # a mean times the row count: a sum
            return self._is_summed(value.left) or self._is_summed(value.right)
        if type(value) is not cst.Call:
            return False
        if type(value.func) is cst.Attribute and value.func.attr.value == "sum":
            return True
        if self.analysis.resolve(value.func) == "torch.sum":
            return True
        if value in self.rewritten:
            return False  # a loss the criterion rules hand to DistributedCriterion, which weights sums itself
        for arg in value.args:
            if arg.keyword is not None and arg.keyword.value == "reduction":
                return type(arg.value) is cst.SimpleString and arg.value.evaluated_value == "sum"
            if arg.keyword is not None and arg.keyword.value == "size_average":
                return type(arg.value) is cst.Name and arg.value.value == "False"
        return False

    def _summed_message(self, value: cst.CSTNode) -> str:
        line, _ = self.analysis.position(value)
        return (
            f"the loss is summed by hand (line {line}), which the runtime cannot weight by each share: this loop's "
            "data is not split"
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
                if type(value) is cst.Name and value.value == "None":
                    continue
                if type(value) is not cst.Call or self.analysis.resolve(value.func) not in _TORCH_SAMPLERS:
                    return arg.value
                inner = argument(value, "sampler", 0) if name == "batch_sampler" else None
                if inner is not None and self._custom_sampler_values(inner.value, scope):
                    return arg.value
        return None

    def _custom_sampler_values(self, expr: cst.BaseExpression, scope) -> bool:
        return any(
            type(value) is not cst.Call or self.analysis.resolve(value.func) not in _TORCH_SAMPLERS
            for value in self.analysis.values.of(expr, scope)
        )

    def _iterable_dataset(self, loader: cst.Call) -> Optional[cst.BaseExpression]:
        """The loader's dataset when it is built from a class of this file deriving from ``IterableDataset``."""
        arg = argument(loader, "dataset", 0)
        if arg is None:
            return None
        classes = {s.name.value: s for s in self.analysis.module.body if type(s) is cst.ClassDef}
        for value in self.analysis.values.of(arg.value, self.analysis.values.scope_of(loader)):
            if type(value) is cst.Call and type(value.func) is cst.Name and value.func.value in classes:
                if any(
                    self.analysis.resolve(base.value) in _ITERABLE_DATASETS for base in classes[value.func.value].bases
                ):
                    return arg.value
        return None


# -- schedules counted in samples -------------------------------------------------------------------
def sample_counters(analysis, loop: cst.For) -> list[cst.AugAssign]:
    """``used_sample += real_image.shape[0]``, ``self.tokens += (y >= 0).sum()`` in a training loop whose
    data is split (or in the function of this file that runs its backward pass), whose total the file
    compares with something (a progressive-growing phase, a warm-up ``if``): counted on each process's
    share, the schedule it drives would run W times slower, and differ between processes."""
    tree = analysis.tree
    code = analysis.code_of
    regions = [loop.body]
    regions += [
        function
        for function in (tree.function(call) for call in analysis.loaders.backward_calls(loop))
        if function is not tree.function(loop)
    ]
    found: list[cst.AugAssign] = []
    for region in dict.fromkeys(regions):
        if region is None:
            continue
        added = contains(region, lambda n: type(n) is cst.AugAssign and type(n.operator) is cst.AddAssign)
        found += [node for node in added if node not in found and _counts_samples(analysis, node.value)]
    if not found:
        return found
    # Which of them the file compares with something: only names ending like a counter are generated.
    tails = {_tail(node.target) for node in found}
    compared = {
        code(node)
        for comparison in tree.nodes(cst.Comparison)
        for node in contains(comparison, lambda n: type(n) in (cst.Name, cst.Attribute) and _tail(n) in tails)
    }
    return [node for node in found if code(node.target) in compared]


def _tail(node: cst.CSTNode) -> str | None:
    """``used_sample`` of ``used_sample``, ``tokens`` of ``self.tokens``."""
    if type(node) is cst.Name:
        return node.value
    return node.attr.value if type(node) is cst.Attribute else None


def _counts_samples(analysis, value: cst.BaseExpression) -> bool:
    while type(value) is cst.Call:
        func = value.func
        if type(func) is cst.Name and func.value in _BUILTIN_CONVERSIONS and len(value.args) == 1:
            value = value.args[0].value
        elif type(func) is cst.Attribute and func.attr.value in _CONVERSIONS and not value.args:
            value = func.value
        else:
            break
    if is_row_count(analysis, value):
        return True
    if type(value) is not cst.Call or type(value.func) is not cst.Attribute or value.args:
        return False
    counted, receiver = value.func.attr.value, value.func.value
    if counted in ("numel", "nelement"):
        return True
    if counted not in _COUNTING:
        return False
    return type(receiver) is cst.Comparison or (
        type(receiver) is cst.Call
        and type(receiver.func) is cst.Attribute
        and receiver.func.attr.value in _MASKS
    )
