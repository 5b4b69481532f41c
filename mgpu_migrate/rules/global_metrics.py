"""MGP180: counts a training loop adds up from the batch's rows are the global batch's (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.batch import is_row_count
from mgpu_migrate.analysis.guards import under_main_process_block
from mgpu_migrate.analysis.loaders import DISTRIBUTED
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import CHECKS, DDP, TORCH_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.counting import is_count, sample_counters
from mgpu_migrate.rules.syntax import RUNTIME, wrap_in_runtime

GLOBAL_METRIC = Rewrite("MGP180")
RANK_MEAN_METRIC = Review(
    "MGP330",
    name="rank-mean-metric",
    summary="a running mean over the process's rows (an accuracy): printed or logged, it is the process's share",
    why=(
        "A training loop whose data is split adds up a mean over this process's rows that is no loss (an accuracy "
        "`(pred == y).float().mean()`): printed, logged or compared with the best so far, it is the process's "
        "share of the batch, not the batch's."
    ),
    todo=(
        "Weigh it by the rows it averaged over: `mgpu_runtime.reduce_mean(value, count=len(y))` is the global "
        "batch's mean; or count instead (`correct += (pred == y).sum()`), which the tool sums over the processes "
        "(MGP180)."
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
        "the default style, which sums it with `mgpu_runtime.reduce_sum` (MGP180)."
    ),
)
WRITER_ON_EVERY_PROCESS = Review(
    "MGP332",
    name="writer-on-every-process",
    summary="a TensorBoard SummaryWriter built by every process: each value is logged once per process",
    why=(
        "A TensorBoard `SummaryWriter` is built by every process of the distributed run: each writes an event "
        "file of its own into the log directory, so TensorBoard shows every scalar, image and histogram once per "
        "process (the values are the same where they are global, such as the runtime's losses)."
    ),
    todo=(
        "Build it on the main process only (`writer = SummaryWriter(...) if mgpu_runtime.is_main_process() else "
        "None`) and log under `if writer is not None:`, or give each process a directory of its own."
    ),
)
CONDITIONAL_COUNT = Review(
    "MGP334",
    name="conditional-count",
    summary="a running count of the process's rows under an `if` of the loop: the process's share, not summed",
    why=(
        "A training loop whose data is split adds up a count of this process's rows under an `if` (or a `try`) "
        "of the loop: printed or logged, it is the process's share. The tool does not sum it there: the test may "
        "hold on some processes only (`if mask.any():`), and a sum that the others never reach waits forever."
    ),
    todo=(
        "Sum the count over the processes where every process passes, after the loop "
        "(`correct = mgpu_runtime.reduce_sum(correct)`), or count unconditionally (a count of zero rows is 0)."
    ),
)
_SUMMARY_WRITERS = frozenset({"torch.utils.tensorboard.SummaryWriter", "torch.utils.tensorboard.writer.SummaryWriter", "tensorboardX.SummaryWriter"})
# What makes a mean a metric of predictions rather than a loss: a comparison of outputs and targets.
_COMPARING_METHODS = frozenset({"eq", "ne", "argmax", "topk"})


class GlobalMetrics(Rule):
    """
    ## What it does
    In a training loop whose data is split across the processes, a running count of the batch's rows
    (``correct += pred.eq(y).sum().item()``, ``total += y.size(0)``), or a sum over them
    (``running_loss += loss.item() * x.size(0)``), adds up the global batch's:
    ``correct += mgpu_runtime.reduce_sum(pred.eq(y).sum().item())``. A running mean over the rows that is not
    a loss (``acc += (pred == y).float().mean()``) is reported (MGP330).

    ## Why is this bad?
    Each process holds its own rows of every batch, so a count of them is the process's share: an accuracy
    printed at the end of the epoch (``100.0 * correct / total``), a value logged or compared with the best so
    far, would be rank 0's share of the data, with no word said. The loss values need nothing: the runtime's
    loss is the global batch's on every process.

    ## Example
    ```python
    for x, y in loader:
        ...
        correct += out.argmax(1).eq(y).sum().item()
        total += y.size(0)
    print(100.0 * correct / total)
    ```

    ## Use instead
    ```python
    for x, y in loader:
        ...
        correct += mgpu_runtime.reduce_sum(out.argmax(1).eq(y).sum().item())
        total += mgpu_runtime.reduce_sum(y.size(0))
    print(100.0 * correct / total)
    ```

    ## Fix safety
    Safe: every process runs each step of a split loop, so the sums are met everywhere; in a world of one
    ``reduce_sum`` returns its input. Each is one small collective per step. Only loops whose data the
    migration splits are touched: a loader left whole gives every process the whole batch, already the
    original's count. A mean over the rows cannot be summed (MGP330): ``mgpu_runtime.reduce_mean(value,
    count=rows)`` is the batch's. Under ``--style torch`` (no runtime) counts are reported (MGP331), not rewritten.
    A count under an ``if`` of the loop is reported (MGP334), not summed: a sum that only the processes whose
    rows pass the test reach would wait forever for the others. A TensorBoard ``SummaryWriter`` built outside a main-process-only block is reported (MGP332): every process
    writes an event file of its own into the log directory, and TensorBoard shows each value once per process.
    """

    CODE = GLOBAL_METRIC
    # A check: it reads which training loops the data rule split.
    PHASE = CHECKS
    USES = ("loaders",)
    REVIEW_CODES = (RANK_MEAN_METRIC, RANK_COUNT_METRIC, WRITER_ON_EVERY_PROCESS, CONDITIONAL_COUNT)
    DESCRIPTION = "running counts of a split training loop's rows summed over the processes"
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
                running += out.mean().item()
            """,
            """
            from torch.utils.data import DataLoader
            import mgpu_runtime

            mgpu_runtime.setup()

            model = mgpu_runtime.DistributedDataParallel(model)
            for x, y in mgpu_runtime.distribute_loader(DataLoader(data, batch_size=8)):
                out = model(x)
                out.mean().backward()
                correct += mgpu_runtime.reduce_sum(out.argmax(1).eq(y).sum().item())
                total += mgpu_runtime.reduce_sum(len(y))
                running += out.mean().item()
            """,
            DDP,
            ("MGP120", "MGP101", "MGP122", GLOBAL_METRIC, GLOBAL_METRIC),
        ),
        Example(
            """
            import torch.nn as nn
            from torch.utils.data import DataLoader

            model = nn.DataParallel(model)
            for x, y in DataLoader(data, batch_size=8):
                out = model(x)
                out.mean().backward()
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
                accuracy += (out.argmax(1) == y).float().mean().item()
            """,
            DDP,
            ("MGP120", "MGP101", "MGP122", RANK_MEAN_METRIC),
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        torch_style = self.options.style == TORCH_STYLE
        self._report_writers("dist.get_rank() == 0" if torch_style else f"{RUNTIME}.is_main_process()")
        code = self.analysis.code_of
        for loop in self._split_loops():
            bound = _bound_names(loop)
            schedules = None
            for update in contains(loop.body, lambda node: type(node) is cst.AugAssign):
                if type(update.operator) is not cst.AddAssign or self._loop_of(update) is not loop:
                    continue
                # A sample count the file compares drives a schedule: the data rule sums it (MGP140).
                schedules = set(sample_counters(self.analysis, loop)) if schedules is None else schedules
                if update in schedules:
                    continue
                value = update.value
                if not any(type(n) is cst.Name and n.value in bound for n in contains(value, lambda _: True)):
                    continue  # not computed from this step's batch (`total += args.batch_size`)
                name = shorten(code(update.target), 30)
                counts = is_count(value) or is_row_count(self.analysis, value) or self._times_rows(value)
                if counts and torch_style:
                    self.left(
                        value,
                        RANK_COUNT_METRIC,
                        f"`{name}` adds up a count of this process's rows: printed or logged, it is this process's "
                        "share; sum it over the processes (dist.all_reduce) for the batch's",
                    )
                elif counts and self._conditional(update, loop):
                    self.left(
                        value,
                        CONDITIONAL_COUNT,
                        f"`{name}` adds up a count of this process's rows under an `if`: it is this process's share "
                        f"(a {RUNTIME}.reduce_sum there could wait for processes that skip it)",
                    )
                elif counts and self.rewrite_allowed(value):
                    self.edits.replace(value, wrap_in_runtime("reduce_sum"))
                    self.edits.need_import(RUNTIME)
                    self.rewrote(
                        value,
                        f"`{name}` adds up a count (or sum) of this process's rows: summed over the processes "
                        f"({RUNTIME}.reduce_sum), the global batch's, as the original counted",
                    )
                elif _compared_mean(value):
                    weighed = "weigh it by its rows and sum" if torch_style else f"{RUNTIME}.reduce_mean(value, count=rows)"
                    self.left(
                        value,
                        RANK_MEAN_METRIC,
                        f"`{name}` adds up a mean over this process's rows: printed or logged, it is this process's "
                        f"share; {weighed} for the batch's",
                    )

    def _times_rows(self, value: cst.BaseExpression) -> bool:
        """``loss.item() * x.size(0)``: a mean times the rows it averaged over, the rows' sum. Summed over the
        processes it is the original's, whether the mean is the global batch's or the process's own."""
        return (
            type(value) is cst.BinaryOperation
            and type(value.operator) is cst.Multiply
            and (is_row_count(self.analysis, value.left) or is_row_count(self.analysis, value.right))
        )

    def _report_writers(self, main_process: str) -> None:
        for call in self.analysis.calls:
            if self.analysis.resolve(call.func) in _SUMMARY_WRITERS and not under_main_process_block(self.analysis, call):
                self.left(
                    call,
                    WRITER_ON_EVERY_PROCESS,
                    "every process writes a TensorBoard event file of its own: each value is logged once per "
                    f"process; build and use it under `if {main_process}:`",
                )

    def _split_loops(self) -> list[cst.For]:
        """The training loops whose data this migration splits (or a runtime loader already split)."""
        loops: list[cst.For] = []
        for trace in self.analysis.loaders.traces:
            split = trace.kind == DISTRIBUTED or any(step in self.rewritten for step in trace.path)
            if trace.training and split and type(trace.loop) is cst.For and trace.loop not in loops:
                loops.append(trace.loop)
        return loops

    def _conditional(self, node: cst.CSTNode, loop: cst.For) -> bool:
        """Whether an ``if`` (or a ``try``) of ``loop``'s body decides whether ``node`` runs."""
        for ancestor in self.analysis.tree.ancestors(node):
            if ancestor is loop:
                return False
            if type(ancestor) in (cst.If, cst.Try):
                return True
        return False

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
