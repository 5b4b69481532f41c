"""MGP103: under ``--style torch`` a functional loss whose gradient DDP's average changes leaves the file for the runtime."""

from __future__ import annotations

from typing import Optional, Union

import libcst as cst

from mgpu_migrate.analysis.batch import scaled_by_row_count
from mgpu_migrate.analysis.models import becomes_ddp
from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.losses import (
    FUNCTIONAL_LOSSES,
    FUNCTIONAL_ONLY,
    LOSS_PARAMETERS,
    LossCall,
    exact_under_ddp_without_wrapper,
    reduction_of,
)
from mgpu_migrate.rules.base import DDP, TORCH_STYLE, WRAPS, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, runtime_attr, torch_nn_spelling
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS

FUNCTIONAL_LOSS_KEPT = Review(
    "MGP212",
    name="functional-loss-kept",
    summary=(
        "--style torch: a functional loss whose gradient DDP's average changes, in a form the tool cannot read; "
        "left as it is"
    ),
    why=(
        "Under `--style torch` DDP averages the processes' gradients, which changes this functional loss (a sum, or a "
        "cross-entropy mean over the targets not ignored), and its arguments are in a form the tool cannot read (an "
        "input or target given by keyword, `*args`, an option its loss class does not take), so the tool cannot "
        "tell whether the file needs the runtime. The loss is left as it is."
    ),
    todo=(
        "Check the loss's scale against the original (multiply a sum by `dist.get_world_size()`), or migrate with the "
        "default style, whose runtime computes every loss over the global batch."
    ),
)


class FunctionalLoss(Rule):
    """
    ## What it does
    Under ``--to ddp --style torch``, finds a functional loss on a wrapped model's outputs
    (``F.cross_entropy(out, y)``, ``F.kl_div(..., reduction="sum")`` ... every ``torch.nn.functional`` loss that
    splits along the batch) whose gradient DDP's average of the processes' gradients changes: a cross-entropy
    or NLL mean (over the weight of the targets: class weights, ``ignore_index``), a sum that is not divided by
    the batch's rows, a reduction the code does not show. Its exact form sums the loss's numerator and
    denominator over the processes, which only the runtime does, so the file is left as it is (MGP295). The
    default style needs nothing here: its runtime computes every loss over the global batch.

    ## Why is this bad?
    Each process computes the loss over its own share of the batch and DDP averages the gradients: a mean over
    each process's targets, averaged, is not the mean over the batch's when the shares hold different numbers of
    targets that count, and a sum steps ``1/world_size`` as far.

    ## Example
    ```python
    logits = model(x)                       # model = nn.DataParallel(...)
    loss = F.cross_entropy(logits, y, ignore_index=0)
    ```

    ## Use instead
    The default style (``--to ddp``), which leaves the loss as it is.

    ## Fix safety
    Nothing is written: the file is left as it is. A loss whose arguments the tool cannot read (an input or
    target given by keyword, ``*args``, an option the loss's class does not take: ``F.mse_loss(..., weight=w)``)
    is reported (MGP212) and left.
    """

    CODE = Rewrite("MGP103")
    PHASE = WRAPS
    USES = ("losses", "models")
    TARGETS = (DDP,)
    STYLES = (TORCH_STYLE,)
    REVIEW_CODES = (FUNCTIONAL_LOSS_KEPT,)
    DESCRIPTION = "--style torch: a functional loss whose gradient DDP's average changes leaves the file for the runtime"
    EXAMPLES = (
        Example(
            """
            import torch.nn.functional as F
            from torch import nn
            model = nn.DataParallel(model)
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, v), y.view(-1)) + F.mse_loss(logits, z)
            loss.backward()
            """,
            None,
            DDP,
            ("MGP295",),
            TORCH_OPTIONS,
            message="no plain-PyTorch form for MGP103",
            line=5,
        ),
        Example(
            """
            import torch.nn.functional as F
            from torch import nn
            model = nn.DataParallel(model)
            loss = F.kl_div(model(x), target=y, reduction="sum")
            loss.backward()
            """,
            """
            import torch.nn.functional as F
            import torch
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None)
            loss = F.kl_div(model(x), target=y, reduction="sum")
            loss.backward()
            """,
            DDP,
            ("MGP160", FUNCTIONAL_LOSS_KEPT),
            TORCH_OPTIONS,
        ),
    )

    def apply(self) -> None:
        if not self.analysis.models.sites:
            return
        for call in self.analysis.losses.calls:
            if call.functional is not None:
                self._check(call)

    def _check(self, loss: LossCall) -> None:
        if not becomes_ddp(loss.direct | loss.transformed):
            return
        function = _function_name(loss)
        class_name = FUNCTIONAL_LOSSES[loss.functional]
        reduction = reduction_of(loss.call.args[2:], LOSS_PARAMETERS[function])
        if exact_under_ddp_without_wrapper(class_name, reduction):
            return
        if reduction == "sum" and scaled_by_row_count(self.analysis, loss.call, cst.Divide):
            return  # `F.kl_div(..., reduction="sum") / x.size(0)`: a mean over the process's rows, exact as it is
        plan = _plan(loss.call, function)
        if isinstance(plan, str):
            self.left(
                loss.call,
                FUNCTIONAL_LOSS_KEPT,
                f"`{function}` not rewritten: {plan}; its gradient over uneven shares of the batch is not exact",
            )
            return
        self._rewrite(loss, plan)

    def _rewrite(self, loss: LossCall, plan) -> None:
        """The runtime's form (which leaves the file under this style, MGP295): the loss's class, with the
        call's options, in the criterion that sums its numerator and denominator over the processes."""
        if not self.rewrite_allowed(loss.call):
            return
        function = _function_name(loss)
        class_name = FUNCTIONAL_LOSSES[loss.functional]
        nn_spelling, needs_torch = torch_nn_spelling(self.analysis)
        if needs_torch:
            self.edits.need_import("torch")
        loss_class = cst.parse_expression(f"{nn_spelling}.{class_name}")
        inputs, options = plan

        def rewrite(updated: cst.Call) -> cst.Call:
            args = list(updated.args)
            constructor_args = [_as_keyword(args[index], keyword) for index, keyword in options]
            if constructor_args:
                constructor_args[-1] = constructor_args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            call_args = [args[index] for index in inputs]
            call_args[-1] = call_args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            criterion = cst.Call(func=runtime_attr("DistributedCriterion"), args=[cst.Arg(cst.Call(func=loss_class, args=constructor_args))])
            return updated.with_changes(func=criterion, args=call_args)

        self.edits.replace(loss.call, rewrite)
        self.edits.need_import(RUNTIME)
        self.rewrote(loss.call, f"`{function}` needs {RUNTIME}: its numerator and denominator summed over the processes")


def _function_name(loss: LossCall) -> str:
    return loss.functional[len(names.TORCH_FUNCTIONAL) + 1 :]


def _plan(call: cst.Call, function: str) -> Union[str, tuple[list[int], list[tuple[int, Optional[str]]]]]:
    """Which arguments are the loss's (input, target) and which become the class's options (with the
    keyword a positional option takes), or why the call cannot be rewritten."""
    parameters = LOSS_PARAMETERS[function]
    inputs: list[int] = []
    options: list[tuple[int, Optional[str]]] = []
    positional_options = 0
    for index, arg in enumerate(call.args):
        if arg.star:
            return "its arguments are passed through `*`/`**`"
        if arg.keyword is None and len(inputs) < 2:
            inputs.append(index)
            continue
        if arg.keyword is None:
            if positional_options >= len(parameters):
                return "it has more positional arguments than the function takes"
            keyword = rename = parameters[positional_options]
            positional_options += 1
        else:
            keyword, rename = arg.keyword.value, None
            if keyword in ("input", "target"):
                return "its input or target is given by keyword"
        if keyword in FUNCTIONAL_ONLY.get(function, ()):
            return f"`{keyword}` has no counterpart on the loss's class"
        options.append((index, rename))
    if len(inputs) < 2:
        return "its input or target is given by keyword"
    return inputs, options


def _as_keyword(arg: cst.Arg, keyword: Optional[str]) -> cst.Arg:
    if keyword is None:
        return arg
    no_space = cst.SimpleWhitespace("")
    return arg.with_changes(keyword=cst.Name(keyword), equal=cst.AssignEqual(no_space, no_space))
