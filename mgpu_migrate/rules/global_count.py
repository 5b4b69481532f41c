"""MGP140: a loss divided by a count of the batch's tokens or rows gets the count of the global batch (``--to ddp``)."""

from __future__ import annotations


import libcst as cst

from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Rule
from mgpu_migrate.rules.counting import GLOBAL_COUNT, is_count
from mgpu_migrate.rules.syntax import RUNTIME, wrap_in_runtime



class GlobalCount(Rule):
    """
    ## What it does
    Where a loss on the model's outputs is divided by a count computed from the batch
    (``criterion(out, tgt) / ntokens`` after ``ntokens = tgt.ne(PAD).sum()``, as fairseq and OpenNMT
    normalise a summed token loss), the count is summed over the processes:
    ``ntokens = mgpu_runtime.reduce_sum(tgt.ne(PAD).sum())``, at its assignment or inline.

    ## Why is this bad?
    Under DDP each process holds its span of the batch, so a count computed from the batch is the
    process's own. The runtime makes the loss the global batch's (a sum summed over processes), and a
    global sum divided by a local count is about W times too large, with a gradient to match. With the count
    of the global batch, the quotient and its gradient are the original's.

    ## Example
    ```python
    ntokens = target.ne(PAD).sum()
    loss = criterion(output, target) / ntokens
    ```

    ## Use instead
    ```python
    ntokens = mgpu_runtime.reduce_sum(target.ne(PAD).sum())
    loss = criterion(output, target) / ntokens
    ```

    ## Fix safety
    Safe: in a world of one ``reduce_sum`` returns its input. Every other use of the count (logging,
    throughput) then sees the global batch's count, which is what the original counted.
    """

    CODE = GLOBAL_COUNT
    PHASE = PROGRAM
    USES = ("losses",)
    DESCRIPTION = "a count that divides a loss is summed over the processes"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model)
            criterion = nn.CrossEntropyLoss(reduction='sum')
            for x, y in loader:
                ntokens = y.ne(0).sum()
                loss = criterion(model(x), y) / ntokens
            """,
            """
            import torch.nn as nn
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            criterion = mgpu_runtime.DistributedCriterion(nn.CrossEntropyLoss(reduction='sum'))
            for x, y in loader:
                ntokens = mgpu_runtime.reduce_sum(y.ne(0).sum())
                loss = criterion(model(x), y) / ntokens
            """,
            DDP,
            ("MGP101", "MGP102", "MGP140"),
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        done: set[cst.CSTNode] = set()
        for loss in self.analysis.losses.calls:
            division = self.analysis.tree.parent(loss.call)
            if not (
                type(division) is cst.BinaryOperation
                and type(division.operator) is cst.Divide
                and division.left is loss.call
            ):
                continue
            count = self._count(division.right, division)
            if count is None or count in done or not self.rewrite_allowed(count):
                continue
            done.add(count)
            self.edits.replace(count, wrap_in_runtime("reduce_sum"))
            self.edits.need_import(RUNTIME)
            self.rewrote(
                count,
                f"`{self.analysis.code_of(count)}` divides a loss: summed over the processes "
                "(mgpu_runtime.reduce_sum), the count of the global batch",
            )

    def _count(self, divisor: cst.BaseExpression, division: cst.CSTNode) -> cst.BaseExpression | None:
        """The count expression behind ``divisor``: inline, or the value of its one assignment in the scope."""
        if is_count(divisor):
            return divisor
        if type(divisor) is not cst.Name:
            return None
        function = self.analysis.tree.function(division)
        assigned = [
            node.value
            for node in self.analysis.tree.nodes(cst.Assign)
            if self.analysis.tree.function(node) is function
            and len(node.targets) == 1
            and type(node.targets[0].target) is cst.Name
            and node.targets[0].target.value == divisor.value
        ]
        return assigned[0] if len(assigned) == 1 and is_count(assigned[0]) else None


