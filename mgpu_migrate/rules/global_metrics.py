"""MGP330, MGP331: under ``--style torch``, counts and means of a process's rows."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.batch import is_row_count
from mgpu_migrate.analysis.loaders import DISTRIBUTED
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import CHECKS, DDP, TORCH_STYLE, Example, Review, Rule
from mgpu_migrate.rules.counting import is_count, sample_counters
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS

RANK_MEAN_METRIC = Review(
    "MGP330",
    name="rank-mean-metric",
    summary="--style torch: a running mean over the process's rows (an accuracy): printed or logged, it is its share",
    why=(
        "Under `--style torch`, a training loop whose data is split adds up a mean over this process's rows that is "
        "no loss (an accuracy `(pred == y).float().mean()`): printed, logged or compared with the best so far, it is "
        "the process's share of the batch, not the batch's."
    ),
    todo=(
        "Weigh it by the rows it averaged over and sum both over the processes (`dist.all_reduce`), or migrate with "
        "the default style, whose batches and outputs are the global batch's: there the mean is the batch's as it is."
    ),
)
RANK_COUNT_METRIC = Review(
    "MGP331",
    name="rank-count-metric",
    summary="--style torch: a running count of the process's rows: printed or logged, it is the process's share",
    why=(
        "Under `--style torch`, a training loop whose data is split adds up a count of this process's rows "
        "(`correct += pred.eq(y).sum().item()`, `total += y.size(0)`): printed, logged or compared with the best "
        "so far, it is the process's share of the batch, not the batch's."
    ),
    todo=(
        "Sum it over the processes before it is read (`dist.all_reduce` of a tensor holding it), or migrate with "
        "the default style, whose batches and outputs are the global batch's: there the count is the batch's as it is."
    ),
)
# What makes a mean a metric of predictions rather than a loss: a comparison of outputs and targets.
_COMPARING_METHODS = frozenset({"eq", "ne", "argmax", "topk"})


class GlobalMetrics(Rule):
    """
    ## What it does
    Under ``--style torch``, in a training loop whose data is split across the processes, reports a running
    count of the batch's rows
    (``correct += pred.eq(y).sum().item()``, ``total += y.size(0)``) or a sum over them
    (``running_loss += loss.item() * x.size(0)``) (MGP331), and a running mean over the rows that is not a loss
    (``acc += (pred == y).float().mean()``) (MGP330). It rewrites nothing.

    ## Why is this bad?
    Under ``--style torch`` each process holds its own rows of every batch, so a count of them is
    the process's share: an accuracy printed at the end of the epoch (``100.0 * correct / total``), a value
    logged or compared with the best so far, would be rank 0's share of the data. The default style needs
    nothing for them: its batches and outputs are the global batch's, so are the counts and means the loop
    takes of them.

    ## Example
    ```python
    correct += pred.eq(y).sum().item()
    ```

    ## Use instead
    ```python
    correct += pred.eq(y).sum().item()   # then, before it is read:
    counts = torch.tensor([correct]); dist.all_reduce(counts); correct = counts.item()
    ```

    ## Fix safety
    Nothing is rewritten. Only loops whose data the migration splits are read for counts: a loader left whole
    gives every process the whole batch, already the original's count. A sample count that a schedule compares
    (``used_sample += x.size(0)``, then ``if used_sample > ...``) is the data rule's (MGP162), not reported here.
    """

    CODE = RANK_COUNT_METRIC
    # A check: it reads which training loops the data rule split.
    PHASE = CHECKS
    USES = ("loaders",)
    REVIEW_CODES = (RANK_COUNT_METRIC, RANK_MEAN_METRIC)
    DESCRIPTION = "--style torch: running counts and means of a process's rows"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            from torch.utils.data import DataLoader

            model = nn.DataParallel(model)
            for x, y in DataLoader(data, batch_size=8):
                out = model(x)
                out.mean().backward()
                correct += out.argmax(1).eq(y).sum().item()
                total += len(y)
                accuracy += (out.argmax(1) == y).float().mean().item()
            """,
            """
            from torch.utils.data import DataLoader
            import mgpu_runtime

            mgpu_runtime.setup()

            model = mgpu_runtime.DistributedDataParallel(model)
            for x, y in mgpu_runtime.distribute_loader(DataLoader(data, batch_size=8)):
                out = model(x)
                out.mean().backward()
                correct += out.argmax(1).eq(y).sum().item()
                total += len(y)
                accuracy += (out.argmax(1) == y).float().mean().item()
            """,
            DDP,
            ("MGP120", "MGP101", "MGP122"),
            name="the-runtimes-counts-and-means-are-the-global-batchs",
        ),
        Example(
            """
            import torch.nn as nn
            from torch.utils.data import DataLoader

            model = nn.DataParallel(model)
            loader = DataLoader(data, batch_size=8)
            for epoch in range(2):
                for x, y in loader:
                    out = model(x)
                    out.mean().backward()
                    correct += out.argmax(1).eq(y).sum().item()
                    accuracy += (out.argmax(1) == y).float().mean().item()
            """,
            """
            from torch.utils.data import DataLoader
            import torch
            import torch.distributed as dist
            import os

            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ['LOCAL_RANK']))
            dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')

            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None)
            sampler = torch.utils.data.DistributedSampler(data, shuffle=False)
            loader = DataLoader(data, batch_size=8 // dist.get_world_size(), sampler=sampler)
            for epoch in range(2):
                for x, y in loader:
                    out = model(x)
                    out.mean().backward()
                    correct += out.argmax(1).eq(y).sum().item()
                    accuracy += (out.argmax(1) == y).float().mean().item()
            dist.destroy_process_group()
            """,
            DDP,
            ("MGP161", "MGP160", "MGP162", "MGP299", RANK_COUNT_METRIC, RANK_MEAN_METRIC),
            TORCH_OPTIONS,
            message="adds up a mean over this process's rows",
            line=11,
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        if self.options.style != TORCH_STYLE:
            return  # the runtime's batches and outputs are global: so is every count and mean the loop takes of them
        code = self.analysis.code_of
        for loop in self._split_loops():
            bound = _bound_names(loop)
            schedules = None
            for update in contains(loop.body, lambda node: type(node) is cst.AugAssign):
                if type(update.operator) is not cst.AddAssign or self._loop_of(update) is not loop:
                    continue
                # A sample count the file compares drives a schedule: the data rule's (it needs the runtime).
                schedules = set(sample_counters(self.analysis, loop)) if schedules is None else schedules
                if update in schedules:
                    continue
                value = update.value
                if not any(type(n) is cst.Name and n.value in bound for n in contains(value, lambda _: True)):
                    continue  # not computed from this step's batch (`total += args.batch_size`)
                name = shorten(code(update.target), 30)
                if is_count(value) or is_row_count(self.analysis, value) or self._times_rows(value):
                    self.left(
                        value,
                        RANK_COUNT_METRIC,
                        f"`{name}` adds up a count of this process's rows: printed or logged, it is this process's "
                        "share; sum it over the processes (dist.all_reduce) for the batch's",
                    )
                elif _compared_mean(value):
                    self.left(
                        value,
                        RANK_MEAN_METRIC,
                        f"`{name}` adds up a mean over this process's rows: printed or logged, it is this process's "
                        "share; weigh it by its rows and sum for the batch's",
                    )

    def _times_rows(self, value: cst.BaseExpression) -> bool:
        """``loss.item() * x.size(0)``: a mean times the rows it averaged over, the rows' sum. Summed over the
        processes it is the original's, whether the mean is the global batch's or the process's own."""
        return (
            type(value) is cst.BinaryOperation
            and type(value.operator) is cst.Multiply
            and (is_row_count(self.analysis, value.left) or is_row_count(self.analysis, value.right))
        )

    def _split_loops(self) -> list[cst.For]:
        """The training loops whose data this migration splits (or a runtime loader already split)."""
        loops: list[cst.For] = []
        for trace in self.analysis.loaders.traces:
            split = trace.kind == DISTRIBUTED or any(step in self.rewritten for step in trace.path)
            if trace.training and split and type(trace.loop) is cst.For and trace.loop not in loops:
                loops.append(trace.loop)
        return loops

    def _loop_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The innermost loop around ``node`` (an evaluation loop inside a training loop is its own)."""
        return next((a for a in self.analysis.tree.ancestors(node) if type(a) in (cst.For, cst.While)), None)


def _bound_names(loop: cst.For) -> set[str]:
    """The names a step of ``loop`` binds: its target and what its body assigns."""
    targets = [loop.target]
    # Not what a step adds to (`correct += ...`): a running total is no value of this step's batch.
    for node in contains(loop.body, lambda n: type(n) in (cst.Assign, cst.AnnAssign)):
        targets += [t.target for t in node.targets] if type(node) is cst.Assign else [node.target]
    return {
        name.value
        for target in targets
        for name in contains(target, lambda n: type(n) is cst.Name)
    }


def _compared_mean(value: cst.BaseExpression) -> bool:
    """A full mean (``x.mean()``, ``torch.mean(x)``) of predictions compared with targets."""
    for call in contains(value, lambda n: type(n) is cst.Call and type(n.func) is cst.Attribute):
        func = call.func
        on_torch = type(func.value) is cst.Name and func.value.value == "torch"
        if func.attr.value != "mean" or len(call.args) != (1 if on_torch else 0):
            continue
        reduced = call.args[0].value if on_torch else func.value
        if contains(reduced, _compares):
            return True
    return False


def _compares(node: cst.CSTNode) -> bool:
    if type(node) is cst.Comparison:
        return True
    return type(node) is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value in _COMPARING_METHODS
