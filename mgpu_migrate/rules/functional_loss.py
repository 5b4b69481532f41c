"""MGP103: a functional loss on a wrapped model's outputs becomes the runtime's criterion around its class."""

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
    PER_SAMPLE_WEIGHT,
    LossCall,
    exact_under_ddp_without_wrapper,
    reduction_of,
)
from mgpu_migrate.rules.base import BALANCED, DDP, WRAPS, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, runtime_attr, torch_nn_spelling
from mgpu_migrate.diagnostics import shorten

FUNCTIONAL_LOSS_KEPT = Review(
    "MGP212",
    name="functional-loss-kept",
    summary=(
        "a functional loss on the model's outputs was left as it is (a transformed input, or options "
        "the loss's class cannot take); it is computed on the gathered output"
    ),
    why=(
        "The functional loss gets a transformed input, or options its loss class cannot take, so it cannot be "
        "handed to the runtime's criterion; it is computed on the gathered output."
    ),
    todo=(
        "Nothing, if the loss on the gathered output is fine. Otherwise compute the transformation in the "
        "model's `forward` and pass the outputs to the loss directly."
    ),
)


class FunctionalLoss(Rule):
    """
    ## What it does
    Rewrites a functional loss computed on a wrapped model's outputs (``F.cross_entropy(out, y)``,
    ``F.mse_loss``, ``F.nll_loss``, ``F.binary_cross_entropy_with_logits`` ... every ``torch.nn.functional``
    loss that splits along the batch) into the runtime's criterion around the loss's class, with the same
    options: ``mgpu_runtime.DataParallelCriterion(nn.CrossEntropyLoss(ignore_index=0))(out, y)`` for
    ``--to balanced``; ``mgpu_runtime.DistributedCriterion(...)`` for ``--to ddp``, only for the losses
    whose gradient the DDP runtime cannot make exact alone (cross-entropy/NLL, sums: see MGP102).

    ## Why is this bad?
    A functional loss called on the outputs of ``nn.DataParallel`` works on the gathered output: the whole
    batch's output, and its gradient, sit on the first device. The runtime's criterion computes the loss
    beside each piece of the output; it needs the loss's class to combine the pieces exactly (the mean of a
    cross-entropy with ``ignore_index`` is a sum over a count, not an average of averages). Under DDP the
    same class tells the distributed criterion what to sum over processes.

    ## Example
    ```python
    logits = model(x)                       # model = nn.DataParallel(...)
    loss = F.cross_entropy(logits, y, ignore_index=0)
    ```

    ## Use instead
    ```python
    logits = model(x)                       # model = mgpu_runtime.DataParallelModel(...)
    loss = mgpu_runtime.DataParallelCriterion(nn.CrossEntropyLoss(ignore_index=0))(logits, y)
    ```

    ## Fix safety
    Safe: the class computes what the function computes with the same options (positional options become
    keywords), and given plain tensors the runtime's criterion is the plain loss. Not applied (MGP212) when
    the loss gets a value computed from the outputs (``F.nll_loss(F.log_softmax(out, 1), y)``: gathered
    first), when the input or target is given by keyword or through ``*args``, or when an option has no
    counterpart on the class (``F.mse_loss(..., weight=w)``) or weighs each sample
    (``F.binary_cross_entropy(..., weight=w)``). Under DDP a transformed input is fine (nothing is gathered).
    """

    CODE = Rewrite("MGP103")
    PHASE = WRAPS
    USES = ("losses", "models")
    REVIEW_CODES = (FUNCTIONAL_LOSS_KEPT,)
    DESCRIPTION = "functional loss on a wrapped model's outputs computed per device by the runtime's criterion"
    EXAMPLES = (
        Example(
            """
            import torch.nn.functional as F
            from torch import nn
            model = nn.DataParallel(model)
            logits = model(x)
            loss = F.cross_entropy(logits, y, None, ignore_index=0)
            """,
            """
            from torch import nn
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model)
            logits = model(x)
            loss = mgpu_runtime.DataParallelCriterion(nn.CrossEntropyLoss(weight=None, ignore_index=0))(logits, y)
            """,
            BALANCED,
            ("MGP101", "MGP103"),
        ),
        Example(
            """
            import torch
            model = torch.nn.DataParallel(model)
            loss = torch.nn.functional.mse_loss(model(x)[0], y, reduction='sum')
            """,
            """
            import torch
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model)
            loss = mgpu_runtime.DataParallelCriterion(torch.nn.MSELoss(reduction='sum'))(model(x)[0], y)
            """,
            BALANCED,
            ("MGP101", "MGP103"),
        ),
        Example(
            """
            import torch.nn.functional as F
            from torch.nn import DataParallel
            model = DataParallel(model)
            out = model(x)
            loss = F.nll_loss(F.log_softmax(out, dim=1), y)
            """,
            """
            import torch.nn.functional as F
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model)
            out = model(x)
            loss = F.nll_loss(F.log_softmax(out, dim=1), y)
            """,
            BALANCED,
            ("MGP101", "MGP212"),
        ),
        Example(
            """
            import torch.nn.functional as F
            from torch.nn import DataParallel
            model = DataParallel(model)
            loss = F.mse_loss(model(x), y, weight=w)
            """,
            """
            import torch.nn.functional as F
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model)
            loss = F.mse_loss(model(x), y, weight=w)
            """,
            BALANCED,
            ("MGP101", "MGP212"),
        ),
        Example(
            """
            import torch.nn.functional as F
            from torch import nn
            model = nn.DataParallel(model)
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, v), y.view(-1)) + F.mse_loss(logits, z)
            loss.backward()
            """,
            """
            import torch.nn.functional as F
            from torch import nn
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            logits = model(x)
            loss = mgpu_runtime.DistributedCriterion(nn.CrossEntropyLoss())(logits.view(-1, v), y.view(-1)) + F.mse_loss(logits, z)
            loss.backward()
            """,
            DDP,
            ("MGP101", "MGP103"),
        ),
    )

    def apply(self) -> None:
        if not self.analysis.models.sites:
            return
        for call in self.analysis.losses.calls:
            if call.functional is None:
                continue
            if self.target == BALANCED:
                self._for_balanced(call)
            else:
                self._for_ddp(call)

    def _for_balanced(self, loss: LossCall) -> None:
        function = _function_name(loss)
        if not loss.direct:
            code = shorten(self.analysis.code_of(loss.prediction))
            self.left(
                loss.call,
                FUNCTIONAL_LOSS_KEPT,
                f"`{function}` gets `{code}`, computed from the model's outputs, so they are gathered first",
            )
            return
        plan = _plan(loss.call, function, per_sample_weight_allowed=False)
        if isinstance(plan, str):
            self.left(loss.call, FUNCTIONAL_LOSS_KEPT, f"`{function}` not rewritten: {plan}; it is computed on the gathered output")
            return
        self._rewrite(loss, plan, "DataParallelCriterion", "beside each piece of the output")

    def _for_ddp(self, loss: LossCall) -> None:
        if not becomes_ddp(loss.direct | loss.transformed):
            return
        function = _function_name(loss)
        class_name = FUNCTIONAL_LOSSES[loss.functional]
        reduction = reduction_of(loss.call.args[2:], LOSS_PARAMETERS[function])
        if exact_under_ddp_without_wrapper(class_name, reduction):
            return
        if reduction == "sum" and scaled_by_row_count(self.analysis, loss.call, cst.Divide):
            return  # `F.kl_div(..., reduction="sum") / x.size(0)`: a mean over the process's rows, exact as it is
        plan = _plan(loss.call, function, per_sample_weight_allowed=True)
        if isinstance(plan, str):
            self.left(
                loss.call,
                FUNCTIONAL_LOSS_KEPT,
                f"`{function}` not rewritten: {plan}; its gradient over uneven shares of the batch is not exact",
            )
            return
        self._rewrite(loss, plan, "DistributedCriterion", "exact over the global batch")

    def _rewrite(self, loss: LossCall, plan, wrapper: str, how: str) -> None:
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
            criterion = cst.Call(func=runtime_attr(wrapper), args=[cst.Arg(cst.Call(func=loss_class, args=constructor_args))])
            return updated.with_changes(func=criterion, args=call_args)

        self.edits.replace(loss.call, rewrite)
        self.edits.need_import(RUNTIME)
        self.rewrote(loss.call, f"`{function}` computed by {RUNTIME}.{wrapper}({nn_spelling}.{class_name}(...)): {how}")


def _function_name(loss: LossCall) -> str:
    return loss.functional[len(names.TORCH_FUNCTIONAL) + 1 :]


def _plan(
    call: cst.Call, function: str, per_sample_weight_allowed: bool
) -> Union[str, tuple[list[int], list[tuple[int, Optional[str]]]]]:
    """Which arguments are the loss's (input, target) and which become the class's options (with the
    keyword a positional option takes), or why the call cannot be rewritten."""
    parameters = LOSS_PARAMETERS[function]
    per_sample_weight = (
        not per_sample_weight_allowed and FUNCTIONAL_LOSSES[f"{names.TORCH_FUNCTIONAL}.{function}"] in PER_SAMPLE_WEIGHT
    )
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
        if keyword == "weight" and per_sample_weight:
            return "`weight` weighs each sample of the batch"
        options.append((index, rename))
    if len(inputs) < 2:
        return "its input or target is given by keyword"
    return inputs, options


def _as_keyword(arg: cst.Arg, keyword: Optional[str]) -> cst.Arg:
    if keyword is None:
        return arg
    no_space = cst.SimpleWhitespace("")
    return arg.with_changes(keyword=cst.Name(keyword), equal=cst.AssignEqual(no_space, no_space))
