"""MGP264: under ``--style torch`` a loss that compares the rows of a batch with each other keeps the file off DDP."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, TORCH_STYLE, Example, Review, Rule
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS

BATCH_COUPLED = Review(
    "MGP264",
    name="rows-compared",
    summary="--style torch: the rows of a batch are compared with each other: under plain DDP only within each process",
    why=(
        "The loss compares the rows of the batch with each other (`cdist`, a similarity matrix, batch-wide "
        "statistics): under `--style torch` each process would compare only its own rows, another loss than the "
        "original's. The file is left as it is."
    ),
    todo=(
        "Use the default style (`--to ddp`), whose runtime compares the rows of the global batch, exactly as "
        "before, or `--to balanced`."
    ),
    veto=True,
)
_PRODUCTS = frozenset({"torch.mm", "torch.matmul", "torch.bmm"})
_TRANSPOSES = frozenset({"t", "T", "transpose", "permute", "mT"})


class BatchCoupling(Rule):
    """
    ## What it does
    Under ``--to ddp --style torch``, reports a computation on the model's outputs that compares the rows of
    the batch with each other: a distance or similarity matrix between outputs (``torch.cdist(emb, emb)``,
    ``emb @ emb.t()``, ``torch.mm(a, b.T)``), as batch-hard triplet, contrastive and InfoNCE losses build, also
    in the ``forward`` of a loss object of this file's classes called on the outputs (``triplet = TripletLoss(0.3)``,
    ``triplet(features, ids)``). The file is then left as it is. The default style migrates it: its runtime's outputs are the global batch's,
    and such a product of them is computed over the whole batch, as the original computed it.

    ## Why is this bad?
    Under plain DDP each process holds its own rows of the batch, so such a loss compares each row only with
    the rows of its own process: fewer negatives, other hardest pairs, another loss than the original's, and
    no scaling of the gradients can make it exact.

    ## Example
    ```python
    distances = torch.cdist(embeddings, embeddings)
    ```

    ## Use instead
    Migrate the file with the default style (``--to ddp``), or gather the embeddings from every process
    (``torch.distributed.nn.all_gather``) before comparing them, then migrate it by hand.

    ## Fix safety
    Nothing is rewritten, in the whole file: ``--to ddp`` migrates a file entirely or not at all.
    """

    CODE = BATCH_COUPLED
    PHASE = PROGRAM
    USES = ("flow", "models", "values")
    REVIEW_CODES = (BATCH_COUPLED,)
    DESCRIPTION = "--style torch: losses that compare the rows of a batch with each other keep the file off DDP"
    TARGETS = (DDP,)
    STYLES = (TORCH_STYLE,)
    EXAMPLES = (
        Example(
            """
            import torch
            import torch.nn as nn

            model = nn.DataParallel(model)
            for x, y in loader:
                emb = model(x)
                loss = torch.cdist(emb, emb).mean()
                loss.backward()
            """,
            None,
            DDP,
            ("MGP264",),
            TORCH_OPTIONS,
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        products = [node for node in self.analysis.tree.nodes(cst.BinaryOperation) if type(node.operator) is cst.MatrixMultiply]
        for node in [*self.analysis.calls, *products]:
            pair = self._compared_rows(node)
            if pair is None:
                continue
            code = self.analysis.code_of(node)
            self.left(
                node,
                BATCH_COUPLED,
                f"`{shorten(code)}` compares the rows of the batch with each other: the file is left as it is "
                "(the default style is exact here)",
            )
        for call in self.analysis.calls:
            found = self._loss_object_comparing_rows(call)
            if found is not None:
                cls, compared = found
                self.left(
                    call,
                    BATCH_COUPLED,
                    f"`{shorten(self.analysis.code_of(call))}`: `{cls.name.value}.forward` compares the rows of the batch "
                    f"(line {self.analysis.position(compared)[0]}): the file is left as it is (the default style is exact here)",
                )

    def _loss_object_comparing_rows(self, call: cst.Call) -> Optional[tuple[cst.ClassDef, cst.CSTNode]]:
        """A call on the outputs of an object of this file's classes (``triplet(features, ids)`` with ``triplet =
        TripletLoss(0.3)``) whose ``forward`` compares its arguments' rows: a distance or a product of one with
        the transpose of one (``torch.cdist(x, x)``, ``x @ x.t()``)."""
        if type(call.func) is not cst.Name:
            return None
        values = self.analysis.values
        scope = values.scope_of(call)
        if not any(self._outputs(arg.value, scope) for arg in call.args):
            return None
        classes = {node.name.value: node for node in self.analysis.module.body if type(node) is cst.ClassDef}
        for value in values.of(call.func, scope):
            if type(value) is not cst.Call or type(value.func) is not cst.Name or value.func.value not in classes:
                continue
            cls = classes[value.func.value]
            forward = next((s for s in cls.body.body if type(s) is cst.FunctionDef and s.name.value == "forward"), None)
            if forward is None:
                continue
            parameters = {param.name.value for param in forward.params.params[1:]}
            for node in contains(forward, lambda n: type(n) in (cst.Call, cst.BinaryOperation)):
                pair = self._operands(node)
                if pair is not None and all(_mentions(side, parameters | _locals(forward)) for side in pair):
                    return cls, node
        return None

    def _operands(self, node: cst.CSTNode) -> Optional[tuple[cst.BaseExpression, cst.BaseExpression]]:
        """The two sides of a distance, or of a product with a transpose."""
        if type(node) is cst.BinaryOperation:
            if type(node.operator) is not cst.MatrixMultiply:
                return None
            left, right = node.left, node.right
            distance = False
        else:
            qualified = self.analysis.resolve(node.func)
            distance = qualified == "torch.cdist"
            if not (distance or qualified in _PRODUCTS) or len(node.args) < 2:
                return None
            left, right = node.args[0].value, node.args[1].value
        return (left, right) if distance or _transposed(left) or _transposed(right) else None

    def _compared_rows(self, node: cst.CSTNode) -> Optional[tuple[cst.BaseExpression, cst.BaseExpression]]:
        """The two operands when ``node`` is a distance or product of the model's outputs with their transpose."""
        if type(node) is cst.BinaryOperation:
            left, right = node.left, node.right  # the callers pass only `@`
            distance = False
        else:
            qualified = self.analysis.resolve(node.func)
            distance = qualified == "torch.cdist"
            if not (distance or qualified in _PRODUCTS) or len(node.args) < 2:
                return None
            left, right = node.args[0].value, node.args[1].value
        if not (distance or _transposed(left) or _transposed(right)):
            return None
        scope = _scope_of(self.analysis, node)
        return (left, right) if self._outputs(left, scope) and self._outputs(right, scope) else None

    def _outputs(self, expr: cst.BaseExpression, scope) -> bool:
        return bool(self.analysis.models.derived_sites(expr, scope))


def _mentions(expr: cst.BaseExpression, names: set[str]) -> bool:
    return any(node.value in names for node in contains(expr, lambda n: type(n) is cst.Name))


def _locals(function: cst.FunctionDef) -> set[str]:
    """The names a function assigns (``features = F.normalize(inputs)``): computed from its arguments."""
    return {
        target.target.value
        for assign in contains(function, lambda n: type(n) is cst.Assign)
        for target in assign.targets
        if type(target.target) is cst.Name
    }


def _scope_of(analysis, node: cst.CSTNode):
    """The scope of the function holding ``node`` (the module's at top level)."""
    function = analysis.tree.function(node)
    index = analysis.flow
    return index.scopes.get(function, index.module_scope) if function is not None else index.module_scope


def _transposed(expr: cst.BaseExpression) -> bool:
    if type(expr) is cst.Attribute:
        return expr.attr.value in _TRANSPOSES
    return type(expr) is cst.Call and type(expr.func) is cst.Attribute and expr.func.attr.value in _TRANSPOSES
