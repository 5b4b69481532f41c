"""MGP102: wrap the criterion that consumes a wrapped model's outputs, where the criterion is built.

With its ``--style torch`` twin, ``TorchCriterion`` (MGP297): the criterion stays as it is, and where DDP's
gradient average changes its loss, a diagnostic says so.
"""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.batch import scaled_by_row_count
from mgpu_migrate.analysis.losses import (
    CLASS_INDEX_LOSSES,
    CUSTOM,
    LOSS_PARAMETERS,
    PARALLEL,
    SPLITTABLE,
    UNSPLITTABLE,
    Criterion,
    LossCall,
    class_parameters,
    exact_under_ddp_without_wrapper,
    reduction_of,
)
from mgpu_migrate.analysis.models import becomes_ddp
from mgpu_migrate.diagnostics import Code, shorten
from mgpu_migrate.program import existing_setup
from mgpu_migrate.rules.base import BALANCED, DDP, RUNTIME_STYLE, TORCH_STYLE, WRAPS, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, wrap_in_runtime
from mgpu_migrate.rules.torch_style import LOSS_SCALE, NO_TORCH_FORM, TORCH_OPTIONS


CRITERION_USED_OTHERWISE = Review(
    "MGP203",
    name="criterion-used-otherwise",
    summary=(
        "the criterion is used other than by calling it (attribute read, passed to code outside the "
        "file); not wrapped, its loss is computed on the gathered output"
    ),
    why=(
        "The criterion is used other than by calling it (an attribute read, passed to code outside the file); "
        "a wrapped criterion would not offer what that use expects."
    ),
    todo=(
        "Nothing, if the loss on the gathered output is fine (it is what DataParallel did). To compute it per "
        "device, wrap the criterion by hand in `mgpu_runtime.DataParallelCriterion`."
    ),
)
LOSS_NOT_SPLITTABLE = Review(
    "MGP204",
    name="loss-not-splittable",
    summary=(
        "the loss is not one the runtime can split exactly (a custom loss, CTCLoss, a per-sample "
        "weight); not wrapped, its loss is computed on the gathered output"
    ),
    why=(
        "The runtime computes exactly only the losses whose reduction it knows (torch's losses with mean, sum "
        "or none, `ignore_index`, class weights). A custom loss, `CTCLoss` or a per-sample weight could give "
        "another value when computed per piece."
    ),
    todo=(
        "Nothing: the loss is computed on the gathered output, as before. Wrap it by hand only if it is a mean "
        "or a sum over the rows of the batch."
    ),
)
LOSS_OUT_OF_SIGHT = Review(
    "MGP205",
    name="loss-out-of-sight",
    summary=(
        "no loss on this model's outputs is computed in this file: the outputs (or the model) go to "
        "code the tool cannot see, where a loss runs on the gathered output"
    ),
    why=(
        "No loss on this model's outputs is computed in this file: the outputs, or the model, go to code the "
        "tool cannot see (a caller, another module), where the loss runs on the gathered output."
    ),
    todo=(
        "Wrap that criterion in `mgpu_runtime.DataParallelCriterion` where it is built if it is a torch loss "
        "of rows (cross-entropy, MSE ...), or leave it: the loss is computed on the gathered output, as before. "
        "Leave a loss that compares the rows of a batch (a batch-hard triplet loss, a contrastive or "
        "Jensen-Shannon loss over the batch): computed per piece it would be another loss, with no error."
    ),
)
SUBMODULE_LOSS_GATHERED = Review(
    "MGP206",
    name="submodule-loss-gathered",
    summary=(
        "only a sub-module is wrapped: its output is gathered where the rest of the model uses it, "
        "so the loss is computed on the output device, as before"
    ),
    why=(
        "Only a sub-module is wrapped: its output is gathered where the rest of the model uses it, so the loss "
        "is computed on the output device, as before."
    ),
    todo="Nothing. Wrap the whole model to compute the loss beside each piece of the output.",
)
LOSS_ON_TRANSFORMED_OUTPUT = Review(
    "MGP207",
    name="loss-on-transformed-output",
    summary=(
        "the loss gets a value computed from the outputs (`out.view(...)`), so the outputs are "
        "gathered first; compute it in the model's forward to keep the loss per device"
    ),
    why=(
        "The loss gets a value computed from the outputs (`out.view(...)`, `log_softmax(out)`), so the outputs "
        "are gathered before it is computed."
    ),
    todo="Move that computation into the model's `forward` so that the loss receives the outputs themselves.",
)
CRITERION_FROM_ELSEWHERE = Review(
    "MGP213",
    name="criterion-from-elsewhere",
    summary=(
        "a wrapped criterion can also come from code the tool cannot follow (a factory of another module, "
        "a parameter passed from outside the file); that criterion is not wrapped"
    ),
    why=(
        "A wrapped criterion can also come from code the tool cannot follow (a factory of another module, a "
        "parameter passed from outside the file), so that one is not wrapped."
    ),
    todo=(
        "Wrap it where it is built, in `mgpu_runtime.DataParallelCriterion` (balanced) or "
        "`mgpu_runtime.DistributedCriterion` (ddp), if it is a loss of rows (a torch loss, a mean over the rows). "
        "Not a loss that compares the rows of a batch (a batch-hard triplet loss, a contrastive or Jensen-Shannon "
        "loss over the batch): on a piece of the batch it is another loss, with no error; under --to ddp such a "
        "loss leaves the file (MGP287 for a project's loss class)."
    ),
)


class CriterionWrap(Rule):
    """
    ## What it does
    Wraps a criterion that computes a loss on a wrapped model's outputs where the criterion is built
    (``nn.CrossEntropyLoss(...)``, also stored on ``self``, chained with ``.cuda()``/``.to(device)``, passed
    to a function of the same file or given as a parameter's default): in ``mgpu_runtime.DataParallelCriterion``
    for ``--to balanced``; in ``mgpu_runtime.DistributedCriterion`` for ``--to ddp`` where the DDP runtime
    needs it for an exact gradient. The criterion is found by following the model's outputs to the calls
    that take them (``criterion(out, y)``, ``criterion(main, y) + criterion(aux, y)`` after
    ``main, aux = model(x)``, ``self.criterion(out, y)`` in another method).

    ## Why is this bad?
    Balanced: called on the gathered output, the loss (and the output's gradient) is computed on the first
    device, which holds the whole batch's output on top of its own share. The runtime's criterion computes
    the loss beside each piece of the output and combines the pieces into exactly the unsplit batch's loss.
    DDP: the runtime weighs each process's gradient by its share of the global batch, which is exact for a
    mean over rows; a sum (``reduction='sum'``), a reduction the code does not show, or a cross-entropy/NLL
    mean (over the weight of the targets: class weights, ``ignore_index``) needs the criterion's numerator
    and denominator summed over processes, which ``DistributedCriterion`` does.

    ## Example
    ```python
    model = nn.DataParallel(model)
    criterion = nn.CrossEntropyLoss(ignore_index=-100)
    loss = criterion(model(inputs), targets)
    ```

    ## Use instead
    ```python
    model = mgpu_runtime.DataParallelModel(model)
    criterion = mgpu_runtime.DataParallelCriterion(nn.CrossEntropyLoss(ignore_index=-100))
    loss = criterion(model(inputs), targets)
    ```

    ```python
    criterion = mgpu_runtime.DistributedCriterion(nn.CrossEntropyLoss(ignore_index=-100))   # --to ddp
    ```

    ## Fix safety
    Safe: given anything but the model's per-device outputs (another model's outputs, a tensor) the
    balanced criterion is the plain one, the distributed one is the plain one in a single process, and both
    combine torch's losses exactly (class weights, ``ignore_index``, ``reduction='sum'``, uneven splits).
    Under DDP, losses that are means over rows or elements (``MSELoss()``, ``L1Loss()`` ...) are left as
    they are: already exact. It is not applied when the criterion is used
    other than by calling it (its ``.weight`` is read, it is passed to code outside the file: MGP203),
    when it is not one of torch's losses that split along the batch (a custom loss, ``CTCLoss``,
    ``BCELoss(weight=...)``: MGP204), or when the loss only ever sees a transformed output
    (``logits.view(-1, v)``, gathered first: MGP207). Where no loss on a model's outputs is in the file at
    all, MGP205 says where the outputs go; a wrapped sub-module gets MGP206; a criterion that can also come
    from code out of sight (``build_loss(cfg)`` in another branch) gets MGP213 there.
    """

    CODE: Code = Rewrite("MGP102")  # its torch twin only reports: a review code
    PHASE = WRAPS
    USES = ("losses", "models")
    STYLES = (RUNTIME_STYLE,)
    REVIEW_CODES = (
        CRITERION_USED_OTHERWISE,
        LOSS_NOT_SPLITTABLE,
        LOSS_OUT_OF_SIGHT,
        SUBMODULE_LOSS_GATHERED,
        LOSS_ON_TRANSFORMED_OUTPUT,
        CRITERION_FROM_ELSEWHERE,
    )
    DESCRIPTION = "criterion on a wrapped model's outputs wrapped in the runtime's criterion for the target"
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            criterion = nn.CrossEntropyLoss()
            loss = criterion(model(x), y)
            """,
            """
            import torch.nn as nn
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model)
            criterion = mgpu_runtime.DataParallelCriterion(nn.CrossEntropyLoss())
            loss = criterion(model(x), y)
            """,
            BALANCED,
            ("MGP101", "MGP102"),
        ),
        Example(
            """
            import torch
            class Trainer:
                def __init__(self, net):
                    self.net = torch.nn.DataParallel(net)
                    self.loss = torch.nn.MSELoss(reduction='sum').cuda()
                def step(self, x, y):
                    pred, aux = self.net(x)
                    return self.loss(pred, y)
            """,
            """
            import torch
            import mgpu_runtime
            class Trainer:
                def __init__(self, net):
                    self.net = mgpu_runtime.DataParallelModel(net)
                    self.loss = mgpu_runtime.DataParallelCriterion(torch.nn.MSELoss(reduction='sum').cuda())
                def step(self, x, y):
                    pred, aux = self.net(x)
                    return self.loss(pred, y)
            """,
            BALANCED,
            ("MGP101", "MGP102"),
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            criterion = nn.NLLLoss(weight=w)
            print(criterion.weight)
            loss = criterion(model(x), y)
            """,
            """
            import torch.nn as nn
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model)
            criterion = nn.NLLLoss(weight=w)
            print(criterion.weight)
            loss = criterion(model(x), y)
            """,
            BALANCED,
            ("MGP101", "MGP203"),
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            criterion = FocalLoss(gamma=2)
            loss = criterion(model(x), y)
            """,
            """
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model)
            criterion = FocalLoss(gamma=2)
            loss = criterion(model(x), y)
            """,
            BALANCED,
            ("MGP101", "MGP204"),
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            loss = compute_loss(model(x), y)
            """,
            """
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model)
            loss = compute_loss(model(x), y)
            """,
            BALANCED,
            ("MGP101", "MGP205"),
        ),
        Example(
            """
            import torch.nn as nn
            model.features = nn.DataParallel(model.features)
            """,
            """
            import mgpu_runtime
            model.features = mgpu_runtime.DataParallelModel(model.features)
            """,
            BALANCED,
            ("MGP101", "MGP206"),
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            criterion = nn.CrossEntropyLoss()
            logits = model(x)
            loss = criterion(logits.view(-1, logits.size(-1)), y.view(-1))
            """,
            """
            import torch.nn as nn
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model)
            criterion = nn.CrossEntropyLoss()
            logits = model(x)
            loss = criterion(logits.view(-1, logits.size(-1)), y.view(-1))
            """,
            BALANCED,
            ("MGP101", "MGP207"),
        ),
        Example(
            """
            import torch.nn as nn
            from losses import build_loss
            model = nn.DataParallel(model)
            criterion = nn.CrossEntropyLoss() if cfg.ce else build_loss(cfg)
            loss = criterion(model(x), y)
            """,
            """
            import torch.nn as nn
            from losses import build_loss
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model)
            criterion = mgpu_runtime.DataParallelCriterion(nn.CrossEntropyLoss()) if cfg.ce else build_loss(cfg)
            loss = criterion(model(x), y)
            """,
            BALANCED,
            ("MGP101", "MGP102", "MGP213"),
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            criterion = nn.CrossEntropyLoss()  # noqa: MGP102
            loss = criterion(model(x), y)
            """,
            """
            import torch.nn as nn
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model)
            criterion = nn.CrossEntropyLoss()  # noqa: MGP102
            loss = criterion(model(x), y)
            """,
            BALANCED,
            ("MGP101",),
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            criterion = nn.CrossEntropyLoss(ignore_index=0)
            mse = nn.MSELoss()
            loss = criterion(model(x), y) + mse(model(x), z)
            """,
            """
            import torch.nn as nn
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            criterion = mgpu_runtime.DistributedCriterion(nn.CrossEntropyLoss(ignore_index=0))
            mse = nn.MSELoss()
            loss = criterion(model(x), y) + mse(model(x), z)
            """,
            DDP,
            ("MGP101", "MGP102"),
        ),
        Example(
            """
            import torch
            class Trainer:
                def __init__(self, net):
                    self.net = torch.nn.DataParallel(net)
                    self.loss = torch.nn.L1Loss(reduction='sum')
                def step(self, x, y):
                    return self.loss(self.net(x).flatten(1), y)
            """,
            """
            import torch
            import mgpu_runtime
            class Trainer:
                def __init__(self, net):
                    self.net = mgpu_runtime.DistributedDataParallel(net)
                    self.loss = mgpu_runtime.DistributedCriterion(torch.nn.L1Loss(reduction='sum'))
                def step(self, x, y):
                    return self.loss(self.net(x).flatten(1), y)
            """,
            DDP,
            ("MGP101", "MGP102"),
        ),
    )

    def apply(self) -> None:
        models = self.analysis.models
        if not models.sites:
            return
        losses = self.analysis.losses
        wrapped: set[cst.CSTNode] = set()
        for criterion in losses.criteria:
            if any(construction.kind == PARALLEL for construction in criterion.constructions):
                continue  # already takes per-device outputs (the runtime's, or PyTorch-Encoding's: MGP104)
            if self.target == BALANCED:
                self._wrap_balanced(criterion, wrapped)
            else:
                self._wrap_ddp(criterion, wrapped)
        if self.target == BALANCED:
            for call in losses.calls:
                if call.transformed and not call.direct:
                    self._transformed(call)
            self._report_unparallelized_sites()

    def _wrap_balanced(self, criterion: Criterion, wrapped: set[cst.CSTNode]) -> None:
        if not any(call.direct for call in criterion.calls):
            return  # every loss call gets a transformed output: reported per call (MGP207)
        for construction in criterion.constructions:
            if construction.kind in (UNSPLITTABLE, CUSTOM):
                self.left(
                    construction.core,
                    LOSS_NOT_SPLITTABLE,
                    f"{construction.reason}: not wrapped; its loss is computed on the gathered output, as before",
                )
        splittable = [c for c in criterion.constructions if c.kind == SPLITTABLE and c.value not in wrapped]
        self._wrap(criterion, splittable, wrapped, "DataParallelCriterion", "the loss is computed beside each piece of the output")
        if splittable and not criterion.misuses:
            for source in criterion.unfollowed:
                self.left(
                    source.node,
                    CRITERION_FROM_ELSEWHERE,
                    f"the criterion wrapped at line {self.analysis.position(splittable[0].core)[0]} can also come from "
                    f"{source.what}, which is not wrapped",
                )

    def _wrap_ddp(self, criterion: Criterion, wrapped: set[cst.CSTNode]) -> None:
        if not any(becomes_ddp(call.direct | call.transformed) for call in criterion.calls):
            return
        # A file with a distributed path of its own (init_process_group, DistributedSampler) keeps its losses as
        # that path has them; so does a second run after apex's DDP became the runtime's (idempotence).
        if existing_setup(self.analysis):
            return
        # `criterion(out, y) / x.size(0)` with reduction="sum" everywhere: a mean over the process's rows.
        per_row = bool(criterion.calls) and all(
            scaled_by_row_count(self.analysis, call.call, cst.Divide) for call in criterion.calls
        )
        needed = []
        for construction in criterion.constructions:
            if construction.loss_class is None or construction.value in wrapped:
                continue
            reduction = reduction_of(construction.core.args, class_parameters(construction.loss_class))
            if exact_under_ddp_without_wrapper(construction.loss_class, reduction) or (reduction == "sum" and per_row):
                continue
            needed.append(construction)
        self._wrap(criterion, needed, wrapped, "DistributedCriterion", "exact loss and gradient over the global batch")

    def _wrap(self, criterion: Criterion, constructions: list, wrapped: set[cst.CSTNode], wrapper: str, how: str) -> None:
        if not constructions:
            return
        if criterion.misuses:
            use = criterion.misuses[0]
            line = self.analysis.position(use.node)[0]
            consequence = (
                "its loss is computed on the gathered output"
                if wrapper == "DataParallelCriterion"
                else "its gradient over uneven shares of the batch is not exact"
            )
            for construction in constructions:
                self.left(
                    construction.core,
                    CRITERION_USED_OTHERWISE,
                    f"criterion not wrapped: {use.what} (line {line}); {consequence}",
                )
            return
        for construction in constructions:
            wrapped.add(construction.value)
            if not self.rewrite_allowed(construction.core):
                continue
            self.edits.replace(construction.value, wrap_in_runtime(wrapper))
            self.edits.need_import(RUNTIME)
            self.rewrote(construction.core, f"criterion wrapped in {RUNTIME}.{wrapper}: {how}")

    def _transformed(self, call: LossCall) -> None:
        if call.functional is not None:
            return  # the functional-loss rule reports its own calls
        code = self.analysis.code_of(call.prediction)
        self.left(
            call.call,
            LOSS_ON_TRANSFORMED_OUTPUT,
            f"the loss gets `{shorten(code)}`, computed from the model's outputs, so they are gathered first",
        )

    def _report_unparallelized_sites(self) -> None:
        models = self.analysis.models
        losses = self.analysis.losses
        covered = models.backward_sites()
        loss_nodes = set()
        for call in losses.calls:
            covered |= call.direct | call.transformed
            loss_nodes.add(call.call)
        output_escapes = models.output_escapes()
        model_escapes = models.model_escapes()
        direct = {site for call in losses.calls for site in call.direct}
        for site in models.sites:
            submodule = models.is_submodule(site)
            if submodule is not None and site not in direct:  # a loss on its own output is wrapped (MGP102)
                self.left(
                    site.call,
                    SUBMODULE_LOSS_GATHERED,
                    f"only the sub-module `{shorten(submodule)}` is wrapped: the loss is computed on its gathered "
                    "output, as before",
                )
                continue
            if site in covered:
                continue
            escapes = [e for e in output_escapes.get(site, ()) if e.node not in loss_nodes]
            escapes = models.after_wrap(site, escapes + model_escapes.get(site, []))
            if not escapes:
                continue
            first = min(escapes, key=lambda e: self.analysis.position(e.node))
            subject = "its outputs go" if first in output_escapes.get(site, ()) else "the model goes"
            self.left(
                site.call,
                LOSS_OUT_OF_SIGHT,
                f"no loss on this model's outputs here: {subject} to {first.what} "
                f"(line {self.analysis.position(first.node)[0]}), where a loss runs on the gathered output",
            )


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
