"""MGP260: random numbers drawn per row in a split training loop that the runtime cannot slice (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.batch import rows_of_a_tensor, split_training_loops
from mgpu_migrate.analysis.draws import names_a_size
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Review, Rule

# Draws from torch's global generator whose size is given as an argument (reported when it is the batch's).
_SIZED_DRAWS = frozenset(f"torch.{name}" for name in ("randn", "rand", "randint", "normal", "empty"))
# Draws shaped like a tensor of the batch.
_LIKE_DRAWS = frozenset(f"torch.{name}" for name in ("randn_like", "rand_like", "randint_like", "bernoulli", "poisson"))
# Draws the runtime makes for the global batch and slices per process when sized by the batch's rows.
_SLICED_BY_RUNTIME = frozenset({"torch.randn", "torch.rand", "torch.randn_like", "torch.rand_like", "torch.randint"})
# In-place fills of a tensor (``z.normal_()``), by method name.
_FILLS = frozenset({"normal_", "uniform_", "bernoulli_", "exponential_", "geometric_", "cauchy_", "log_normal_", "random_"})


# The file is left as it is when this is reported (rules.settle).
PER_ROW_RANDOMNESS = Review(
    "MGP260",
    name="per-row-randomness",
    summary=(
        "random numbers drawn per row in a split training loop, not sliced by the runtime: processes draw the same ones"
    ),
    why=(
        "The training loop draws random numbers for each row of the batch in a way the runtime does not draw "
        "for the global batch (an in-place `normal_()` fill, `torch.bernoulli`, a size that is the batch's but "
        "not its rows first). The runtime keeps every process's torch generator where the original's was, "
        "seeded or not, so every process would draw the first rows' numbers for its own rows. The file is left "
        "as it is."
    ),
    todo=(
        "Draw with `torch.randn`/`rand(x.size(0), ...)`, `randn_like`/`rand_like(x)` or "
        "`torch.randint(low, high, (x.size(0), ...))`, which the runtime draws for the global batch and slices, "
        "then migrate; or use `--to balanced`."
    ),
    veto=True,
)


class ProcessRandomness(Rule):
    """
    ## What it does
    Reports random numbers drawn for each row of the batch inside a training loop whose data is split
    across processes that the runtime does not draw for the global batch: in-place fills of a tensor with the
    batch's rows (``torch.empty(b, nz).normal_()``), ``torch.bernoulli``/``randint_like``/``poisson`` of one,
    draws sized by the batch that do not start with its rows (``torch.randn(args.batch_size, nz)``,
    ``torch.normal(0, 1, (b, nz))``). The file is then left as it is.

    ## Why is this bad?
    The runtime keeps every process's torch generator where the original process's was (the loader hands
    rank 0's state to the others), seeded or not. A process that draws for its own rows then gets the numbers
    the original drew for the first rows, as every other process does: a GAN trained on 8 GPUs would see 8
    copies of one share's latent vectors each step, where the original drew one vector per row. Seeding each
    process differently does not help: the next batch brings rank 0's state again. Not reported:
    ``torch.randn``/``rand`` sized by a tensor's rows (``real.size(0)``, ``len(x)``, a name assigned only
    those), ``randint`` whose size starts so (``torch.randint(0, n, (x.shape[0],))``) and
    ``randn_like``/``rand_like``, which the runtime draws for the global batch and slices per process,
    exactly as the original drew them.

    ## Example
    ```python
    for real, _ in loader:
        noise = torch.empty(real.size(0), nz).normal_()
    ```

    ## Use instead
    ```python
    for real, _ in loader:
        noise = torch.randn(real.size(0), nz)   # drawn for the global batch, this process's rows kept
    ```

    ## Fix safety
    Nothing is rewritten, in the whole file: ``--to ddp`` migrates a file entirely or not at all.
    """

    CODE = PER_ROW_RANDOMNESS
    PHASE = PROGRAM
    USES = ("values",)
    REVIEW_CODES = (PER_ROW_RANDOMNESS,)
    DESCRIPTION = "per-row random draws the runtime cannot slice keep the file off DDP"
    TARGETS = (DDP,)
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
                        f"`{shorten(code)}` draws per row, which the runtime does not slice: every process would draw "
                        "the first rows' numbers; file left as it is",
                    )
                    return

    def _draws_per_row(self, call: cst.Call) -> bool:
        qualified = self.analysis.resolve(call.func)
        if qualified in _SLICED_BY_RUNTIME and self._sized_by_the_loops_rows(qualified, call):
            return False
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

    def _sized_by_the_loops_rows(self, qualified: str, call: cst.Call) -> bool:
        """A draw the runtime makes for the global batch and slices (mgpu_runtime/randomness.py): shaped like a
        tensor, or sized by a tensor's rows (``x.size(0)``, ``len(x)``, a name assigned only such values)."""
        if qualified.endswith("_like"):
            return True
        if qualified == "torch.randint":
            first = _randint_rows(call)
        else:
            first = call.args[0].value if call.args and call.args[0].keyword is None else None
        if first is None:
            return False
        if rows_of_a_tensor(first):
            return True
        values = self.analysis.values
        assigned = values.of(first, values.scope_of(call)) if type(first) is cst.Name else []
        return bool(assigned) and all(rows_of_a_tensor(value) for value in assigned)

    def _filled_per_row(self, tensor: cst.BaseExpression, fill: cst.Call) -> bool:
        # `torch.empty(b, nz).normal_()`, `z.normal_()` where z was made with the batch's size.
        if type(tensor) is cst.Call:
            return any(mentions_batch_size(arg.value) for arg in tensor.args)
        values = self.analysis.values
        return any(
            type(value) is cst.Call and any(mentions_batch_size(arg.value) for arg in value.args)
            for value in values.of(tensor, values.scope_of(fill))
        )


def _randint_rows(call: cst.Call) -> cst.BaseExpression | None:
    """The first extent of ``torch.randint([low,] high, (rows, ...))``'s size (also ``size=``)."""
    sizes = [arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "size"]
    positional = [arg.value for arg in call.args if arg.keyword is None]
    size = sizes[0] if sizes else (positional[-1] if len(positional) in (2, 3) else None)
    if type(size) in (cst.Tuple, cst.List) and size.elements:
        return size.elements[0].value
    return None


def mentions_batch_size(expr: cst.BaseExpression) -> bool:
    """``x.size(0)``, ``x.shape[0]``, ``len(x)``, ``batch_size`` ...: an argument that names a batch's size."""
    nodes = contains(expr, lambda n: type(n) in (cst.Name, cst.Attribute))
    return names_a_size([node.value if type(node) is cst.Name else node.attr.value for node in nodes])
