"""MGP360, MGP361: under ``--style torch`` a loss normalised by a count of the batch, or parameters trained
outside the wrap, keep the file off plain DDP."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, TORCH_STYLE, Example, Review, Rule
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS

BATCH_NORMALISER = Review(
    "MGP360",
    name="torch-style-batch-normaliser",
    summary="--style torch: the loss is divided by a count taken from the batch: each process would take its own",
    why=(
        "The loss that reaches `backward` is normalised by a count that depends on what the batch holds (tokens "
        "that are not padding, `(y != pad).sum()`; positive anchors, `num_pos`; a mean over the rows a mask "
        "keeps). Under plain DDP each process divides by its own share's count and DDP averages the gradients: "
        "the mean of the processes' ratios, not the ratio of the batch's sums, whenever the shares hold different "
        "counts. The file is left as it is."
    ),
    todo=(
        "Use the default style (`--to ddp`), whose runtime divides by the global batch's count, exactly as the "
        "original, or sum the count over the processes (`dist.all_reduce`) and scale by the world size by hand."
    ),
    veto=True,
)
TRAINED_OUTSIDE_WRAP = Review(
    "MGP361",
    name="torch-style-trained-outside-wrap",
    summary="--style torch: the optimizer steps parameters outside the wrap: plain DDP averages only the wrap's",
    why=(
        "An optimizer steps parameters that no wrapped model holds (a margin head sharing the backbone's "
        "optimizer, a learnable temperature). Plain DDP averages the wrapped model's gradients only: each process "
        "would step these with the gradient of its own rows, and their copies drift apart. The file is left as it "
        "is."
    ),
    todo=(
        "Use the default style (`--to ddp`), whose runtime sums those gradients at the step, or wrap the module "
        "with the model (one `nn.Module` holding both) and run the tool again."
    ),
    veto=True,
)
# Reductions whose value depends on what the rows hold, not only on how many there are.
_COUNTS = frozenset({"sum", "count_nonzero", "nonzero"})
_TORCH_COUNTS = frozenset({"torch.sum", "torch.count_nonzero", "torch.nonzero"})
_DEPTH = 4


class TorchPerProcess(Rule):
    """
    ## What it does
    Under ``--to ddp --style torch``, leaves a file whose training computes something plain DDP would compute
    per process, with no textbook form to make it the batch's:

    - a loss normalised by a count of the batch's contents: ``criterion(out, y) / (y != pad).sum()``,
      ``loss.sum() / num_pos`` with ``num_pos = (labels > 0).sum()``, ``loss[mask].mean()``,
      ``torch.masked_select(loss, mask).mean()`` (MGP360);
    - parameters an optimizer steps that no wrapped model holds: ``SGD([{"params": model.parameters()},
      {"params": head.parameters()}])`` with ``head`` unwrapped, a learnable ``nn.Parameter`` (MGP361).

    ## Why is this bad?
    Each process holds its own rows and DDP averages the wrapped model's gradients. A count that depends on
    the rows' contents differs from process to process, so the average of the processes' normalised losses
    is not the batch's; and the gradients of parameters outside the wrap are never averaged at all.

    ## Example
    ```python
    loss = F.cross_entropy(logits, targets, ignore_index=PAD, reduction="sum") / (targets != PAD).sum()
    ```

    ## Use instead
    Migrate the file with the default style (``--to ddp``): its runtime computes the loss of the global batch,
    and sums the gradients of every parameter an optimizer steps.

    ## Fix safety
    Nothing is rewritten, in the whole file: ``--to ddp`` migrates a file entirely or not at all.
    """

    CODE = BATCH_NORMALISER
    PHASE = PROGRAM
    USES = ("flow", "loaders", "models", "values")
    REVIEW_CODES = (BATCH_NORMALISER, TRAINED_OUTSIDE_WRAP)
    DESCRIPTION = "--style torch: losses normalised by the batch's counts and parameters outside the wrap keep the file off DDP"
    TARGETS = (DDP,)
    STYLES = (TORCH_STYLE,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            import torch.nn.functional as F

            model = nn.DataParallel(model)
            for x, y in loader:
                loss = F.cross_entropy(model(x), y, reduction="sum") / (y != 0).sum()
                loss.backward()
            """,
            None,
            DDP,
            (BATCH_NORMALISER,),
            TORCH_OPTIONS,
            message="`(y != 0).sum()` is a count of this batch",
            line=6,
        ),
        Example(
            """
            import torch
            import torch.nn as nn

            model = nn.DataParallel(backbone)
            optimizer = torch.optim.SGD([{"params": model.parameters()}, {"params": head.parameters()}], lr=0.1)
            """,
            None,
            DDP,
            (TRAINED_OUTSIDE_WRAP,),
            TORCH_OPTIONS,
            message="`head.parameters()` are stepped by the optimizer",
            line=5,
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        for call in self.analysis.calls:
            if self.analysis.loaders.is_backward(call):
                found = self._normaliser(call)
                if found is not None:
                    node, what = found
                    self.left(
                        node,
                        BATCH_NORMALISER,
                        f"`{shorten(self.analysis.code_of(node))}` {what}: each process would take its own share's; "
                        "file left as it is (the default style is exact here)",
                    )
                    return
        for call in self.analysis.calls:
            outside = self._outside_wrap(call)
            if outside is not None:
                self.left(
                    outside,
                    TRAINED_OUTSIDE_WRAP,
                    f"`{shorten(self.analysis.code_of(outside))}` are stepped by the optimizer but held by no wrapped "
                    "model: plain DDP would not average their gradients; file left as it is",
                )
                return

    # -- a loss normalised by the batch -----------------------------------------------------------
    def _normaliser(self, backward: cst.Call) -> Optional[tuple[cst.CSTNode, str]]:
        """The first count of the batch's contents that the value ``backward`` starts from is divided by, or a
        mean over a mask's rows in it."""
        start = backward.func.value if type(backward.func) is cst.Attribute else backward.args[0].value
        for expression in self._computed_from(start):
            for node in contains(expression, lambda n: type(n) in (cst.BinaryOperation, cst.Call)):
                if type(node) is cst.BinaryOperation and type(node.operator) is cst.Divide:
                    count = self._count(node.right)
                    if count is not None:
                        return count, "is a count of this batch"
                elif type(node) is cst.Call and self._masked_mean(node):
                    return node, "is a mean over the rows a mask keeps"
        return None

    def _computed_from(self, start: cst.BaseExpression) -> list[cst.BaseExpression]:
        """``start``, the values stored in the names it reads (``_DEPTH`` assignments back), and what the file's
        own functions they call return."""
        values = self.analysis.values
        index = self.analysis.flow
        scope = _scope_of(self.analysis, start)
        found, pending, seen = [], [(start, scope, 0)], set()
        while pending:
            expression, scope, depth = pending.pop()
            if expression in seen:
                continue
            seen.add(expression)
            found.append(expression)
            if depth >= _DEPTH:
                continue
            for name in contains(expression, lambda n: type(n) in (cst.Name, cst.Attribute)):
                for value in values.of(name, scope, depth=1):
                    if value is not name:
                        pending.append((value, _scope_of(self.analysis, value), depth + 1))
            for call in contains(expression, lambda n: type(n) is cst.Call):
                callee = index.callee(call, values.scope_of(call))
                if callee is not None:
                    for returned, returned_scope in values.returns.get(callee[0], []):
                        pending.append((returned, returned_scope, depth + 1))
        return found

    def _count(self, denominator: cst.BaseExpression) -> Optional[cst.CSTNode]:
        """A reduction in ``denominator`` of the batch or the outputs whose value depends on the rows' contents
        (``.sum()``, ``count_nonzero``, ``nonzero``), also through a name bound to one."""
        for expression in self._computed_from(denominator):
            for call in contains(expression, lambda n: type(n) is cst.Call):
                func = call.func
                counts = (type(func) is cst.Attribute and func.attr.value in _COUNTS) or self.analysis.resolve(func) in _TORCH_COUNTS
                if counts and self._of_the_batch(call):
                    return expression if expression is not denominator else call
        return None

    def _of_the_batch(self, node: cst.BaseExpression) -> bool:
        """``node`` is computed from the model's outputs or from what a training loop draws (its target's names)."""
        drawn = {
            name.value
            for trace in self.analysis.loaders.traces
            if trace.training
            for name in contains(trace.loop.target, lambda n: type(n) is cst.Name)
        }
        models = self.analysis.models
        for expression in self._computed_from(node):
            scope = _scope_of(self.analysis, expression)
            if isinstance(expression, cst.BaseExpression) and models.derived_sites(expression, scope):
                return True
            if any(name.value in drawn for name in contains(expression, lambda n: type(n) is cst.Name)):
                return True
        return False

    def _masked_mean(self, call: cst.Call) -> bool:
        """``x[mask].mean()`` or ``torch.masked_select(x, mask).mean()``: a mean over as many rows as the mask
        keeps."""
        func = call.func
        if type(func) is not cst.Attribute or func.attr.value != "mean" or call.args:
            return False
        owner = func.value
        if type(owner) is cst.Call:
            return self.analysis.resolve(owner.func) == "torch.masked_select" or (
                type(owner.func) is cst.Attribute and owner.func.attr.value == "masked_select"
            )
        if type(owner) is not cst.Subscript or len(owner.slice) != 1 or type(owner.slice[0].slice) is not cst.Index:
            return False
        index = owner.slice[0].slice.value
        return type(index) in (cst.Comparison, cst.Name, cst.Call, cst.Attribute) and self._of_the_batch(index)

    # -- parameters outside the wrap ---------------------------------------------------------------
    def _outside_wrap(self, call: cst.Call) -> Optional[cst.CSTNode]:
        """The first ``X.parameters()`` in an optimizer's arguments whose ``X`` no wrap holds."""
        qualified = self.analysis.resolve(call.func) or ""
        if not qualified.startswith("torch.optim.") or qualified.startswith("torch.optim.lr_scheduler") or not call.args:
            return None
        wrapped = self._wrapped_modules()
        scope = self.analysis.values.scope_of(call)
        for arg in call.args:
            for inner in contains(arg.value, lambda n: type(n) is cst.Call, into_functions=True):
                func = inner.func
                if type(func) is not cst.Attribute or func.attr.value not in ("parameters", "named_parameters"):
                    continue
                owner = func.value
                if type(owner) is cst.Attribute and owner.attr.value == "module":
                    owner = owner.value
                if self.analysis.models.model_sites(owner, scope) or self._holds(wrapped, owner, scope):
                    continue
                return inner
        return None

    def _wrapped_modules(self) -> set[str]:
        """The code of every module a wrap site wraps (``backbone`` of ``nn.DataParallel(backbone)``)."""
        return {
            self.analysis.code_of(site.module)
            for site in self.analysis.models.sites
            if site.module is not None
        }

    def _holds(self, wrapped: set[str], owner: cst.BaseExpression, scope) -> bool:
        """``owner`` is a wrapped module, or a part of one (``backbone.layer4`` of a wrapped ``backbone``)."""
        code = self.analysis.code_of(owner)
        if any(code == module or code.startswith(f"{module}.") for module in wrapped):
            return True
        return any(
            self.analysis.code_of(value) in wrapped for value in self.analysis.values.of(owner, scope) if value is not owner
        )


def _scope_of(analysis, node: cst.CSTNode):
    function = analysis.tree.function(node)
    index = analysis.flow
    return index.scopes.get(function, index.module_scope) if function is not None else index.module_scope
