"""MGP264: under ``--style torch`` a loss that compares the rows of a batch with each other keeps the file off DDP."""

from __future__ import annotations

from typing import Optional

import libcst as cst

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
    ``emb @ emb.t()``, ``torch.mm(a, b.T)``), as batch-hard triplet, contrastive and InfoNCE losses build. The
    file is then left as it is. The default style migrates it: its runtime's outputs are the global batch's,
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
    USES = ("flow", "models")
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


def _scope_of(analysis, node: cst.CSTNode):
    """The scope of the function holding ``node`` (the module's at top level)."""
    function = analysis.tree.function(node)
    index = analysis.flow
    return index.scopes.get(function, index.module_scope) if function is not None else index.module_scope


def _transposed(expr: cst.BaseExpression) -> bool:
    if type(expr) is cst.Attribute:
        return expr.attr.value in _TRANSPOSES
    return type(expr) is cst.Call and type(expr.func) is cst.Attribute and expr.func.attr.value in _TRANSPOSES
