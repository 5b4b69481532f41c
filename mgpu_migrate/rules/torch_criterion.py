"""MGP297: under ``--style torch`` a criterion stays as it is, with how DDP's gradient average changes its loss."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.batch import scaled_by_row_count
from mgpu_migrate.analysis.losses import (
    CLASS_INDEX_LOSSES,
    LOSS_PARAMETERS,
    Construction,
    Criterion,
    class_parameters,
    exact_under_ddp_without_wrapper,
    reduction_of,
)
from mgpu_migrate.analysis.models import becomes_ddp
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.program import existing_setup
from mgpu_migrate.rules.base import DDP, TORCH_STYLE, WRAPS, Example, Rule
from mgpu_migrate.rules.torch_style import LOSS_SCALE, NO_TORCH_FORM, TORCH_OPTIONS

# Options of a class-index loss that keep its mean over rows (the targets' weights are all one).
_ROW_MEAN_OPTIONS = {"reduction", "label_smoothing"}
# The functional class-index losses, wherever they are called (in the loop, a loss function, a forward).
_FUNCTIONAL = {f"torch.nn.functional.{name}" for name in ("cross_entropy", "nll_loss")}


class TorchCriterion(Rule):
    """
    ## What it does
    Under ``--to ddp --style torch``, leaves each criterion on a wrapped model's outputs as it is and reports
    how DDP's averaging of the processes' gradients changes its loss: a sum (``reduction='sum'``) then takes
    steps of ``1/world_size`` of the original's, and a cross-entropy or NLL mean is a mean over the targets
    not ignored, exact only if no target equals ``ignore_index`` (-100). A criterion whose mean is weighted by
    its targets (``weight=``, ``ignore_index=``) or whose reduction the code does not show has no plain form:
    the file is left whole (MGP296). A call of ``F.cross_entropy``/``F.nll_loss`` with a mean, anywhere in the
    file (also inside a model's ``forward``), is reported the same way as a cross-entropy criterion's mean.
    Means over rows or elements (``MSELoss()``, ``L1Loss()`` ...), and a sum divided by the batch's rows, are
    the original's and are not reported.

    ## Why is this bad?
    Each process computes the loss over its own share of the batch and DDP averages the gradients: that is the
    original's gradient only for a mean over rows with equal shares. (The default style has no such limit: its
    runtime computes every loss on the global batch.)

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
    PHASE = WRAPS
    USES = ("losses", "models")
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
        if not self.analysis.models.sites:
            return
        reported: set[cst.CSTNode] = set()
        for criterion in self.analysis.losses.criteria:
            if any(construction.parallel for construction in criterion.constructions):
                continue  # already takes per-device outputs (the runtime's, or PyTorch-Encoding's: MGP104)
            for construction, reduction in self._changed_by_the_average(criterion):
                if construction.value not in reported:
                    reported.add(construction.value)
                    self._report(construction, reduction)
        self._report_functional_means()

    def _changed_by_the_average(self, criterion: Criterion) -> list[tuple[Construction, str | None]]:
        """The constructions of a criterion on a DDP model's outputs whose loss DDP's average changes, each with
        its reduction (None when the code does not show it)."""
        if not any(becomes_ddp(call.direct | call.transformed) for call in criterion.calls):
            return []
        # A file with a distributed path of its own (init_process_group, DistributedSampler) keeps its losses as
        # that path has them.
        if existing_setup(self.analysis):
            return []
        # `criterion(out, y) / x.size(0)` with reduction="sum" everywhere: a mean over the process's rows.
        per_row = bool(criterion.calls) and all(
            scaled_by_row_count(self.analysis, call.call, cst.Divide) for call in criterion.calls
        )
        changed = []
        for construction in criterion.constructions:
            if construction.loss_class is None:
                continue
            reduction = reduction_of(construction.core.args, class_parameters(construction.loss_class))
            if not (exact_under_ddp_without_wrapper(construction.loss_class, reduction) or (reduction == "sum" and per_row)):
                changed.append((construction, reduction))
        return changed

    def _report(self, construction: Construction, reduction: str | None) -> None:
        core = construction.core
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

    def _report_functional_means(self) -> None:
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
