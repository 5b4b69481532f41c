"""MGP265: under ``--style torch`` a permutation of the batch's rows (mixup, cutmix) keeps the file off DDP."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, TORCH_STYLE, Example, Review, Rule
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS
from mgpu_migrate.analysis.batch import rows_of_a_tensor

# The file is left as it is when this is reported (rules.settle).
MIXED_ROWS = Review(
    "MGP265",
    name="mixed-rows",
    summary="--style torch: the rows of a batch are permuted and mixed: under plain DDP only within each process",
    why=(
        "The training loop permutes the rows of the batch (mixup, CutMix: `index = torch.randperm(x.size(0))`, "
        "then `lam * x + (1 - lam) * x[index]`). Under `--style torch` each process holds only its rows, so it "
        "would mix only those: another augmentation and another loss, which no split of the data can make the "
        "original's without moving rows between processes. The file is left as it is."
    ),
    todo=(
        "Use the default style (`--to ddp`), whose runtime mixes the rows of the global batch as the original "
        "did, or `--to balanced`."
    ),
    veto=True,
)


class MixedRows(Rule):
    """
    ## What it does
    Under ``--to ddp --style torch``, reports a random permutation of the batch's rows
    (``torch.randperm(x.size(0))``, also through a name assigned the batch's size, as mixup, cutmix and
    manifold-mixup helpers draw it; not ``torch.randperm(len(dataset))``, a shuffle of the data). The file is
    then left as it is. The default style migrates it: every process draws the same permutation of the
    global batch (the runtime keeps the generators in step) and mixes the global batch's rows, as the
    original did.

    ## Why is this bad?
    The permutation pairs each row with another row of the whole batch. Under plain DDP each process holds its
    own rows, so it can only pair them with each other: other pairs, another mixed batch, another loss than
    the original's, and no scaling of the gradients can restore it.

    ## Example
    ```python
    index = torch.randperm(x.size(0))
    mixed = lam * x + (1 - lam) * x[index]
    ```

    ## Use instead
    Migrate the file with the default style (``--to ddp``), or gather the batch from every process before
    mixing it (``torch.distributed.nn.all_gather``), then migrate it by hand.

    ## Fix safety
    Nothing is rewritten, in the whole file: ``--to ddp`` migrates a file entirely or not at all.
    """

    CODE = MIXED_ROWS
    PHASE = PROGRAM
    USES = ("values",)
    REVIEW_CODES = (MIXED_ROWS,)
    DESCRIPTION = "--style torch: a permutation of the batch's rows (mixup) keeps the file off DDP"
    TARGETS = (DDP,)
    STYLES = (TORCH_STYLE,)
    EXAMPLES = (
        Example(
            """
            import torch
            import torch.nn as nn

            model = nn.DataParallel(model)
            for x, y in loader:
                index = torch.randperm(x.size(0))
                x = 0.7 * x + 0.3 * x[index]
                loss = criterion(model(x), y)
                loss.backward()
            """,
            None,
            DDP,
            ("MGP265",),
            TORCH_OPTIONS,
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        values = self.analysis.values
        for call in self.analysis.calls_to("torch.randperm"):
            if not call.args:
                continue
            size = call.args[0].value
            assigned = values.of(size, values.scope_of(call)) if type(size) is cst.Name else []
            if not (_batch_rows(size) or (assigned and all(_batch_rows(value) for value in assigned))):
                continue
            code = self.analysis.code_of(call)
            self.left(
                call,
                MIXED_ROWS,
                f"`{shorten(code)}` permutes the rows of the batch: under plain DDP each process would mix only its "
                "own; file left as it is",
            )


def _batch_rows(expr: cst.BaseExpression) -> bool:
    """``x.size(0)``, ``x.shape[0]``: a batch's rows. ``len(dataset)`` is a shuffle of the data, not of a batch."""
    is_len = type(expr) is cst.Call and type(expr.func) is cst.Name and expr.func.value == "len"
    return rows_of_a_tensor(expr) and not is_len
