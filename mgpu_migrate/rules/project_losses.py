"""MGP287: under ``--style torch`` a loss class of the project that no per-process mean reproduces keeps the file off DDP."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.models import MODULE_METHODS_RETURNING_SELF
from mgpu_migrate.analysis.project import project_of
from mgpu_migrate.rules.base import DDP, PROGRAM, TORCH_STYLE, Example, Review, Rule
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS

UNEVEN_LOSS = Review(
    "MGP287",
    name="uneven-project-loss",
    summary="--style torch: a loss class of the project that a mean over each process's rows cannot reproduce",
    why=(
        "A loss class of the project ranks the rows of the batch (`topk`, `sort`: OHEM) or averages over a "
        "count that varies with them (`masked_select`, `ignore_index`). Under `--style torch` each process's loss "
        "over its own rows, averaged by DDP, is another loss than the original's. The file is left as it is."
    ),
    todo=(
        "Use the default style (`--to ddp`), whose runtime computes the loss over the global batch, exactly as "
        "before, or `--to balanced`."
    ),
    veto=True,
)


class ProjectLosses(Rule):
    """
    ## What it does
    Under ``--to ddp --style torch``, reads the class of each criterion that is not one of torch's losses when
    the project defines it in
    another module (``from utils.loss import MixSoftmaxCrossEntropyOHEMLoss``, ``from model import
    FastSpeech2Loss``). When its code ranks or compares the rows of the batch (``topk``, ``sort``, ``cdist``:
    OHEM, hard mining) or averages over a number of elements that varies with the data (``masked_select``,
    ``ignore_index``, ``nonzero``), the file is left as it is, and the diagnostic names that line.

    ## Why is this bad?
    Under plain DDP each process computes the loss on its own rows and the gradients are averaged with equal
    weights. That is the original's loss only for a mean over rows with equal shares. OHEM would keep the
    hardest pixels of each process instead of the batch's; a mean over the valid frames or pixels of each
    process, averaged, weighs a process with few of them as much as one with many. Training changes
    without an error. The default style migrates such a file: its runtime's outputs are the global batch's,
    so the loss class sees the whole batch, as it did in the original.

    ## Example
    ```python
    from utils.loss import MixSoftmaxCrossEntropyOHEMLoss   # its forward keeps the top-k pixel losses
    criterion = MixSoftmaxCrossEntropyOHEMLoss(ignore_index=-1)
    ```

    ## Use instead
    The default style (``--to ddp``), or rewrite the loss to return a sum and a count that the processes add
    up, then migrate by hand.

    ## Fix safety
    Nothing is rewritten, in the whole file: ``--to ddp`` migrates a file entirely or not at all.
    """

    CODE = UNEVEN_LOSS
    PHASE = PROGRAM
    USES = ("losses", "models", "values")
    REVIEW_CODES = (UNEVEN_LOSS,)
    DESCRIPTION = "--style torch: the project's loss classes that rank rows or average over masks keep the file off DDP"
    TARGETS = (DDP,)
    STYLES = (TORCH_STYLE,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model)
            criterion = nn.MSELoss()
            for x, y in loader:
                criterion(model(x), y).backward()
            """,
            """
            import torch.nn as nn
            import torch

            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None)
            criterion = nn.MSELoss()
            for x, y in loader:
                criterion(model(x), y).backward()
            """,
            DDP,
            ("MGP160",),
            TORCH_OPTIONS,
        ),
    )

    def apply(self) -> None:
        project = project_of(self.analysis.path)
        if project is None or not self.program.migrates:
            return
        for construction in self._loss_constructions():
            qualified = self.analysis.resolve(construction.func)
            found = project.find(qualified) if qualified else None
            uneven = project.uneven_loss(found) if found is not None else None
            if uneven is None:
                continue
            line, operation = uneven
            self.left(
                construction,
                UNEVEN_LOSS,
                f"`{found.name}` ({found.where.rpartition(':')[0]}:{line}: `{operation}`) ranks the batch's rows or "
                "averages over a count that varies with them: file left as it is",
            )
            return

    def _loss_constructions(self) -> list[cst.Call]:
        """The calls that build what the model's outputs are given to: the criteria the loss analysis found
        (through a wrapper around them, ``DataParallelCriterion(criterion)``), and any object called with an
        output (``Loss(batch, output)``)."""
        found: list[cst.Call] = []
        values = self.analysis.values
        for criterion in self.analysis.losses.criteria:
            for construction in criterion.constructions:
                if construction.loss_class is not None:
                    continue
                found.append(construction.core)
                if construction.core.args:
                    inner = construction.core.args[0].value
                    found += [_constructor(v) for v in values.of(inner, values.scope_of(inner)) if type(v) is cst.Call]
        models = self.analysis.models
        for call in self.analysis.calls:
            if type(call.func) is not cst.Name:
                continue
            scope = values.scope_of(call)
            if any(models.derived_sites(arg.value, scope) for arg in call.args):
                found += [_constructor(v) for v in values.of(call.func, scope) if type(v) is cst.Call]
        return found


def _constructor(call: cst.Call) -> cst.Call:
    """``Loss(...)`` in ``Loss(...).to(device)`` or ``Loss(...).cuda()``."""
    while type(call.func) is cst.Attribute and type(call.func.value) is cst.Call and (
        call.func.attr.value in MODULE_METHODS_RETURNING_SELF
    ):
        call = call.func.value
    return call
