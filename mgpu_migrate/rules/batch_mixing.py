"""MGP288: a training step that pairs the rows of the batch with each other (CutMix, mixup) keeps the file off DDP."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Rule

ROWS_MIXED = "MGP288"
_PERMUTATION = "torch.randperm"


class BatchMixing(Rule):
    """
    ## What it does
    Reports, inside a training loop, a random permutation of the batch's rows (``torch.randperm(x.size(0))``,
    ``torch.randperm(len(x))``, ``torch.randperm(x.shape[0])``), which CutMix, mixup and shuffle-based
    augmentations use to pair each row with another row of the batch. The file is then left as it is.

    ## Why is this bad?
    DataParallel drew one permutation over the whole batch. Under DDP each process permutes only its own
    rows, so a row is mixed only with rows of its own process: another augmentation, and another loss,
    without an error.

    ## Example
    ```python
    rand_index = torch.randperm(images.size(0))
    images[:, :, y1:y2, x1:x2] = images[rand_index, :, y1:y2, x1:x2]
    ```

    ## Use instead
    ``--to balanced`` (one process: the permutation covers the batch), or mix the rows in the data loader
    (a collate function), before the batch is split, then migrate.

    ## Fix safety
    Nothing is rewritten, in the whole file: ``--to ddp`` migrates a file entirely or not at all.
    """

    CODE = ROWS_MIXED
    PHASE = PROGRAM
    VETOES = frozenset({ROWS_MIXED})
    REVIEW_CODES = {ROWS_MIXED: "the rows of the batch are paired by a random permutation: under DDP only within a process"}
    DESCRIPTION = "random permutations of the batch's rows in a training loop keep the file off DDP"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            "import torch\nimport torch.nn as nn\n\nmodel = nn.DataParallel(model)\nfor x, y in loader:\n"
            "    index = torch.randperm(x.size(0))\n    x = 0.5 * x + 0.5 * x[index]\n    model(x).mean().backward()\n",
            None,
            DDP,
            (ROWS_MIXED,),
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        loops = set(self.analysis.loaders.training_loops)
        for call in self.analysis.calls_to(_PERMUTATION):
            if not call.args or not _row_count(call.args[0].value):
                continue
            if not any(ancestor in loops for ancestor in self.analysis.tree.ancestors(call)):
                continue
            self.left(
                call,
                ROWS_MIXED,
                f"`{shorten(self.analysis.module.code_for_node(call))}` pairs rows of the batch with other rows: under DDP "
                "each process would mix only its own; file left as it is",
            )
            return


def _row_count(expr: cst.BaseExpression) -> bool:
    """``x.size(0)``, ``x.size()[0]``, ``x.shape[0]``, ``len(x)``."""
    if isinstance(expr, cst.Call):
        func = expr.func
        if isinstance(func, cst.Name) and func.value == "len":
            return True
        return isinstance(func, cst.Attribute) and func.attr.value == "size" and bool(expr.args) and _is_zero(expr.args[0].value)
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
        index = expr.slice[0].slice
        value = expr.value
        sized = (isinstance(value, cst.Attribute) and value.attr.value == "shape") or (
            isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "size"
        )
        return sized and isinstance(index, cst.Index) and _is_zero(index.value)
    return False


def _is_zero(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Integer) and expr.evaluated_value == 0
