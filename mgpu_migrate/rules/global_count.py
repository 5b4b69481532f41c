"""MGP140: under ``--style torch`` a loss divided by a count of the batch leaves the file for the runtime."""

from __future__ import annotations


import libcst as cst

from mgpu_migrate.rules.base import DDP, PROGRAM, TORCH_STYLE, Example, Rule
from mgpu_migrate.rules.counting import GLOBAL_COUNT, is_count
from mgpu_migrate.rules.syntax import RUNTIME, wrap_in_runtime
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS



class GlobalCount(Rule):
    """
    ## What it does
    Under ``--to ddp --style torch``, finds a loss on the model's outputs divided by a count computed from the
    batch (``criterion(out, tgt) / ntokens`` after ``ntokens = tgt.ne(PAD).sum()``, as fairseq and OpenNMT
    normalise a summed token loss). Its exact form divides by the count of the global batch, which only the
    runtime gives (``mgpu_runtime.reduce_sum`` of the count), so the file is left as it is (MGP295). The default
    style needs nothing here: the runtime's batches are the global batch's, and so is every count of them.

    ## Why is this bad?
    Under plain DDP each process holds its share of the batch, so a count computed from it is the process's
    own, and each process's quotient weighs its rows by its own count: another loss than the original's
    whenever the shares hold different numbers of tokens.

    ## Example
    ```python
    ntokens = target.ne(PAD).sum()
    loss = criterion(output, target) / ntokens
    ```

    ## Use instead
    The default style (``--to ddp``), which leaves both lines as they are.

    ## Fix safety
    Nothing is written: the file is left as it is.
    """

    CODE = GLOBAL_COUNT
    PHASE = PROGRAM
    USES = ("losses",)
    DESCRIPTION = "--style torch: a count of the batch that divides a loss is each process's own; file left for the runtime"
    TARGETS = (DDP,)
    STYLES = (TORCH_STYLE,)
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
            None,
            DDP,
            ("MGP295",),
            TORCH_OPTIONS,
            message="no plain-PyTorch form for MGP140",
            line=6,
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
                f"`{self.analysis.code_of(count)}` divides a loss: the count of the global batch needs "
                "mgpu_runtime.reduce_sum",
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


