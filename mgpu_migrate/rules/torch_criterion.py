"""MGP297: ``--style torch``: a criterion stays as it is; where DDP's gradient average changes its loss, say so."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.losses import (
    CLASS_INDEX_LOSSES,
    LOSS_PARAMETERS,
    class_parameters,
    reduction_of,
)
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, TORCH_STYLE, Example
from mgpu_migrate.rules.criterion_wrap import CriterionWrap
from mgpu_migrate.rules.torch_style import LOSS_SCALE, NO_TORCH_FORM, TORCH_OPTIONS

# Options of a class-index loss that keep its mean over rows (the targets' weights are all one).
_ROW_MEAN_OPTIONS = {"reduction", "label_smoothing"}
# The functional class-index losses, wherever they are called (in the loop, a loss function, a forward).
_FUNCTIONAL = {f"torch.nn.functional.{name}" for name in ("cross_entropy", "nll_loss")}


class TorchCriterion(CriterionWrap):
    """
    ## What it does
    Under ``--to ddp --style torch``, where the default style would wrap a criterion in
    ``mgpu_runtime.DistributedCriterion``, leaves it as it is and reports how DDP's averaging of the
    processes' gradients changes its loss: a sum (``reduction='sum'``) then takes steps of
    ``1/world_size`` of the original's, and a cross-entropy or NLL mean is a mean over the targets not
    ignored, exact only if no target equals ``ignore_index`` (-100). A criterion whose mean is weighted by its
    targets (``weight=``, ``ignore_index=``) or whose reduction the code does not show has no plain form: the
    file is left whole (MGP296). A call of ``F.cross_entropy``/``F.nll_loss`` with a mean, anywhere in the file
    (also inside a model's ``forward``), is reported the same way as a cross-entropy criterion's mean.

    ## Why is this bad?
    Each process computes the loss over its own share of the batch and DDP averages the gradients: that is the
    original's gradient only for a mean over rows with equal shares.

    ## Example
    ```python
    criterion = nn.CrossEntropyLoss(reduction="sum")
    ```

    ## Use instead
    ```python
    criterion = nn.CrossEntropyLoss(reduction="sum")   # and the learning rate times the world size
    ```

    ## Fix safety
    Nothing is rewritten.
    """

    CODE = LOSS_SCALE
    STYLES = (TORCH_STYLE,)
    TARGETS = (DDP,)
    REVIEW_CODES = (LOSS_SCALE,)
    DESCRIPTION = "criterion left as it is, with how DDP's gradient average changes its loss (--style torch)"
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            criterion = nn.CrossEntropyLoss(weight=class_weights)
            loss = criterion(model(x), y)
            loss.backward()
            """,
            None,
            DDP,
            ("MGP296",),
            TORCH_OPTIONS,
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            criterion = nn.L1Loss(reduction='sum')
            loss = criterion(model(x), y)
            loss.backward()
            """,
            """
            import torch.nn as nn
            import torch
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None)
            criterion = nn.L1Loss(reduction='sum')
            loss = criterion(model(x), y)
            loss.backward()
            """,
            DDP,
            ("MGP160", "MGP297"),
            TORCH_OPTIONS,
        ),
    )

    def apply(self) -> None:
        super().apply()
        code = self.analysis.code_of
        for call in self.analysis.calls:
            name = self.analysis.resolve(call.func)
            if name not in _FUNCTIONAL:
                continue
            parameters = LOSS_PARAMETERS[name.rpartition(".")[2]]
            positional = [arg for arg in call.args if arg.keyword is None]
            if len(positional) < 2 or reduction_of(call.args[2:], parameters) != "mean":
                continue
            self.left(
                call,
                LOSS_SCALE,
                f"`{shorten(code(call.func), 30)}` means over each process's targets not ignored: not the original's if some are",
            )

    def _wrap(self, criterion, constructions: list, wrapped: set[cst.CSTNode], wrapper: str, how: str) -> None:
        for construction in constructions:
            wrapped.add(construction.value)
            core = construction.core
            reduction = reduction_of(core.args, class_parameters(construction.loss_class))
            spelled = shorten(self.analysis.code_of(core), 50)
            if reduction == "sum":
                self.left(core, LOSS_SCALE, f"`{spelled}` sums: on split data DDP's gradient average makes each step 1/world_size of the original's")
            elif (
                reduction == "mean"
                and construction.loss_class in CLASS_INDEX_LOSSES
                and all(arg.keyword is not None and arg.keyword.value in _ROW_MEAN_OPTIONS for arg in core.args)
            ):
                self.left(core, LOSS_SCALE, f"`{spelled}` averages over targets not ignored: exact only if none is -100")
            else:
                self.left(
                    core,
                    NO_TORCH_FORM,
                    f"`{spelled}`: a mean weighted by its targets, or a reduction not shown: no plain form; file left",
                )
