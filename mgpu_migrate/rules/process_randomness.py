"""MGP260: under ``--style torch`` random numbers drawn per row in a split training loop keep the file off DDP."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.batch import split_training_loops
from mgpu_migrate.analysis.draws import names_a_size
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, TORCH_STYLE, Example, Review, Rule
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS

# Draws from torch's global generator whose size is given as an argument (reported when it is the batch's).
_SIZED_DRAWS = frozenset(f"torch.{name}" for name in ("randn", "rand", "randint", "normal", "empty"))
# Draws shaped like a tensor of the batch.
_LIKE_DRAWS = frozenset(f"torch.{name}" for name in ("randn_like", "rand_like", "randint_like", "bernoulli", "poisson"))
# In-place fills of a tensor (``z.normal_()``), by method name.
_FILLS = frozenset({"normal_", "uniform_", "bernoulli_", "exponential_", "geometric_", "cauchy_", "log_normal_", "random_"})


# The file is left as it is when this is reported (rules.settle).
PER_ROW_RANDOMNESS = Review(
    "MGP260",
    name="per-row-randomness",
    summary="--style torch: random numbers drawn per row in a split training loop: processes draw the same ones",
    why=(
        "The training loop draws random numbers for each row of the batch (`torch.randn(x.size(0), nz)`, "
        "`randn_like(x)`, an in-place `normal_()` fill, `torch.bernoulli`). Under `--style torch` every process "
        "seeds its torch generator as the original did, so each would draw the first rows' numbers for its own "
        "rows. The file is left as it is."
    ),
    todo=(
        "Use the default style (`--to ddp`), whose loop draws for the global batch on every process, as the "
        "original did, or `--to balanced`."
    ),
    veto=True,
)


class ProcessRandomness(Rule):
    """
    ## What it does
    Under ``--to ddp --style torch``, reports random numbers drawn for each row of the batch inside a training
    loop whose data is split across processes: draws sized by the batch (``torch.randn(real.size(0), nz)``,
    ``torch.randn(args.batch_size, nz)``, ``torch.normal(0, 1, (b, nz))``), draws shaped like a tensor of it
    (``randn_like``, ``torch.bernoulli``, ``poisson``), in-place fills of a tensor with the batch's rows
    (``torch.empty(b, nz).normal_()``). The file is then left as it is. The default style migrates such a
    file: its runtime keeps every process's generators in step and the loop draws for the global batch, which
    the wrapped model then takes in chunks, as DataParallel did.

    ## Why is this bad?
    Every process seeds its generator as the original process did, so a process that draws for its own rows
    gets the numbers the original drew for the first rows, as every other process does: a GAN trained on 8
    GPUs would see 8 copies of one share's latent vectors each step, where the original drew one vector per
    row. Seeding each process differently makes the draws different, not the original's.

    ## Example
    ```python
    for real, _ in loader:
        noise = torch.randn(real.size(0), nz)
    ```

    ## Use instead
    The default style (``--to ddp``), which leaves the draw as it is.

    ## Fix safety
    Nothing is rewritten, in the whole file: ``--to ddp`` migrates a file entirely or not at all.
    """

    CODE = PER_ROW_RANDOMNESS
    PHASE = PROGRAM
    USES = ("values",)
    REVIEW_CODES = (PER_ROW_RANDOMNESS,)
    DESCRIPTION = "--style torch: per-row random draws keep the file off DDP"
    TARGETS = (DDP,)
    STYLES = (TORCH_STYLE,)
    EXAMPLES = (
        Example(
            """
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader

            netG = nn.DataParallel(netG)
            for real in DataLoader(images, batch_size=64, shuffle=True):
                noise = torch.empty(real.size(0), 100).normal_()
                loss = (netD(netG(noise)) - 1).pow(2).mean()
                loss.backward()
            """,
            None,
            DDP,
            ("MGP260",),
            TORCH_OPTIONS,
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        for loop in split_training_loops(self.analysis):
            for call in contains(loop.body, lambda node: type(node) is cst.Call):
                if self._draws_per_row(call):
                    code = self.analysis.code_of(call)
                    self.left(
                        call,
                        PER_ROW_RANDOMNESS,
                        f"`{shorten(code)}` draws per row: under plain DDP every process would draw the first rows' "
                        "numbers; file left as it is",
                    )
                    return

    def _draws_per_row(self, call: cst.Call) -> bool:
        qualified = self.analysis.resolve(call.func)
        if qualified in _LIKE_DRAWS:
            return True
        if qualified in _SIZED_DRAWS:
            return qualified != "torch.empty" and any(mentions_batch_size(arg.value) for arg in call.args)
        return (
            type(call.func) is cst.Attribute
            and call.func.attr.value in _FILLS
            and qualified is None  # a tensor's method, not a module function of the same name
            and self._filled_per_row(call.func.value, call)
        )

    def _filled_per_row(self, tensor: cst.BaseExpression, fill: cst.Call) -> bool:
        # `torch.empty(b, nz).normal_()`, `z.normal_()` where z was made with the batch's size.
        if type(tensor) is cst.Call:
            return any(mentions_batch_size(arg.value) for arg in tensor.args)
        values = self.analysis.values
        return any(
            type(value) is cst.Call and any(mentions_batch_size(arg.value) for arg in value.args)
            for value in values.of(tensor, values.scope_of(fill))
        )


def mentions_batch_size(expr: cst.BaseExpression) -> bool:
    """``x.size(0)``, ``x.shape[0]``, ``len(x)``, ``batch_size`` ...: an argument that names a batch's size."""
    nodes = contains(expr, lambda n: type(n) in (cst.Name, cst.Attribute))
    return names_a_size([node.value if type(node) is cst.Name else node.attr.value for node in nodes])
