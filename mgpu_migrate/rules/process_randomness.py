"""MGP260: random numbers drawn per batch in the training loop of a seeded script (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.draws import names_a_size
from mgpu_migrate.analysis.loaders import DISTRIBUTED
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import CHECKS, DDP, Example, Rule
from mgpu_migrate.rules.syntax import RUNTIME

# Seeding the global generators the same way in every process.
_SEEDS = frozenset(
    {
        "torch.manual_seed",
        "torch.random.manual_seed",
        "torch.cuda.manual_seed",
        "torch.cuda.manual_seed_all",
        "pytorch_lightning.seed_everything",
        "lightning.seed_everything",
        "lightning.pytorch.seed_everything",
        "lightning_fabric.seed_everything",
        "transformers.set_seed",
        "accelerate.utils.set_seed",
    }
)
# Draws from torch's global generator whose size is given as an argument (reported when it is the batch's).
_SIZED_DRAWS = frozenset(f"torch.{name}" for name in ("randn", "rand", "randint", "normal", "empty"))
# Draws shaped like a tensor of the batch.
_LIKE_DRAWS = frozenset(f"torch.{name}" for name in ("randn_like", "rand_like", "randint_like", "bernoulli", "poisson"))
# Draws the runtime makes for the global batch and slices per process when sized by the batch's rows.
_SLICED_BY_RUNTIME = frozenset({"torch.randn", "torch.rand", "torch.randn_like", "torch.rand_like", "torch.randint"})
# In-place fills of a tensor (``z.normal_()``), by method name.
_FILLS = frozenset({"normal_", "uniform_", "bernoulli_", "exponential_", "geometric_", "cauchy_", "log_normal_", "random_"})


# The codes this rule reports for review (their pages: mgpu_migrate/codes.py).
PER_ROW_RANDOMNESS = "MGP260"


class ProcessRandomness(Rule):
    """
    ## What it does
    Reports random numbers drawn for each row of the batch inside a training loop whose data is split
    across processes (``torch.randn(x.size(0), nz)``, ``torch.rand_like(x)``, ``z.normal_()``), in a script
    that seeds torch's generator (``torch.manual_seed``, ``seed_everything``, ``set_seed``). It rewrites
    nothing.

    ## Why is this bad?
    After the migration each process draws these numbers for its own rows of the batch, from its own
    generator. Seeded alike, the generators give every process the same numbers, so rows on different
    processes share them: a GAN trained on 8 GPUs sees 8 copies of one process's latent vectors each
    step, where the original drew one vector per row. (Unseeded processes draw different numbers, as
    the original's rows did.) Not reported: ``torch.randn``/``rand`` sized by a tensor's rows
    (``real.size(0)``, ``len(x)``, a name assigned only those), ``randint`` whose size starts so
    (``torch.randint(0, n, (x.shape[0],))``) and ``randn_like``/``rand_like``, which the runtime draws for the
    global batch and slices per process, exactly as the original drew them.

    ## Example
    ```python
    torch.manual_seed(args.seed)
    ...
    for real, _ in loader:
        noise = torch.randn(real.size(0), nz, 1, 1, device=device)
    ```

    ## Use instead
    ```python
    torch.manual_seed(args.seed + mgpu_runtime.rank())   # a generator of its own for each process
    ```

    ## Fix safety
    Nothing is rewritten: where the seed may differ per process depends on what else draws from the
    generator. ``distribute_loader`` draws the batches on rank 0 alone, so seeding the other processes
    differently does not change the data; code that must draw the same numbers everywhere (a random
    choice that decides whether to step) must keep one seed.
    """

    CODE = PER_ROW_RANDOMNESS
    PHASE = CHECKS
    REVIEW_CODES = {
        PER_ROW_RANDOMNESS: "random numbers drawn per row in the training loop of a seeded script: processes draw the same ones",
    }
    DESCRIPTION = "per-row random draws in the training loop of a seeded script reported"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader

            torch.manual_seed(0)
            netG = nn.DataParallel(netG)
            for real in DataLoader(images, batch_size=64, shuffle=True):
                noise = torch.randn(args.batch_size, 100)
                loss = (netD(netG(noise)) - 1).pow(2).mean()
                loss.backward()
            """,
            """
            import torch
            from torch.utils.data import DataLoader
            import mgpu_runtime

            mgpu_runtime.setup()

            torch.manual_seed(0)
            netG = mgpu_runtime.DistributedDataParallel(netG)
            for real in mgpu_runtime.distribute_loader(DataLoader(images, batch_size=64, shuffle=True)):
                noise = torch.randn(args.batch_size, 100)
                loss = (netD(netG(noise)) - 1).pow(2).mean()
                loss.backward()
            """,
            DDP,
            ("MGP101", "MGP120", "MGP122", "MGP260"),
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        seeds = [call for call in self.analysis.calls if self.analysis.resolve(call.func) in _SEEDS]
        if not seeds:
            return
        seed_line, _ = self.analysis.position(seeds[0])
        reported: set[int] = set()
        for loop in self._distributed_loops():
            for call in contains(loop.body, lambda node: isinstance(node, cst.Call)):
                if id(call) in reported or not self._draws_per_row(call):
                    continue
                reported.add(id(call))
                code = self.analysis.module.code_for_node(call)
                self.left(
                    call,
                    PER_ROW_RANDOMNESS,
                    f"`{shorten(code)}` draws per row; processes seeded alike (line {seed_line}) draw the same ones: "
                    f"seed with seed + {RUNTIME}.rank()",
                )

    def _distributed_loops(self) -> list[cst.For]:
        """Training loops whose data is split across processes (by hand, or by MGP122 in the program phase).
        A loop left on whole batches draws the same numbers for the same rows everywhere, as it should."""
        distributed = []
        for trace in self.analysis.loaders.traces:
            split = trace.kind == DISTRIBUTED or any(step in self.rewritten for step in trace.path)
            if trace.training and split and trace.loop not in distributed:
                distributed.append(trace.loop)
        return distributed

    def _draws_per_row(self, call: cst.Call) -> bool:
        qualified = self.analysis.resolve(call.func)
        if qualified in _SLICED_BY_RUNTIME and self._sized_by_the_loops_rows(qualified, call):
            return False
        if qualified in _LIKE_DRAWS:
            return True
        if qualified in _SIZED_DRAWS:
            return qualified != "torch.empty" and any(mentions_batch_size(arg.value) for arg in call.args)
        return (
            isinstance(call.func, cst.Attribute)
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
        assigned = values.of(first, values.scope_of(call)) if isinstance(first, cst.Name) else []
        return bool(assigned) and all(rows_of_a_tensor(value) for value in assigned)

    def _filled_per_row(self, tensor: cst.BaseExpression, fill: cst.Call) -> bool:
        # `torch.empty(b, nz).normal_()`, `z.normal_()` where z was made with the batch's size.
        if isinstance(tensor, cst.Call):
            return any(mentions_batch_size(arg.value) for arg in tensor.args)
        values = self.analysis.values
        return any(
            isinstance(value, cst.Call) and any(mentions_batch_size(arg.value) for arg in value.args)
            for value in values.of(tensor, values.scope_of(fill))
        )


def _randint_rows(call: cst.Call) -> cst.BaseExpression | None:
    """The first extent of ``torch.randint([low,] high, (rows, ...))``'s size (also ``size=``)."""
    sizes = [arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "size"]
    positional = [arg.value for arg in call.args if arg.keyword is None]
    size = sizes[0] if sizes else (positional[-1] if len(positional) in (2, 3) else None)
    if isinstance(size, (cst.Tuple, cst.List)) and size.elements:
        return size.elements[0].value
    return None


def rows_of_a_tensor(expr: cst.BaseExpression) -> bool:
    """``x.size(0)``, ``x.shape[0]``, ``x.size()[0]`` or ``len(x)``."""
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "len":
        return True
    if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Call) and not expr.value.args:
        expr = cst.Subscript(value=cst.Attribute(value=expr.value.func, attr=cst.Name("shape")), slice=expr.slice)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "size":
        return len(expr.args) == 1 and isinstance(expr.args[0].value, cst.Integer) and expr.args[0].value.value == "0"
    return (
        isinstance(expr, cst.Subscript)
        and isinstance(expr.value, cst.Attribute)
        and expr.value.attr.value == "shape"
        and len(expr.slice) == 1
        and isinstance(expr.slice[0].slice, cst.Index)
        and isinstance(expr.slice[0].slice.value, cst.Integer)
        and expr.slice[0].slice.value.value == "0"
    )


def mentions_batch_size(expr: cst.BaseExpression) -> bool:
    """``x.size(0)``, ``x.shape[0]``, ``len(x)``, ``batch_size`` ...: an argument that names a batch's size."""
    nodes = contains(expr, lambda n: isinstance(n, (cst.Name, cst.Attribute)))
    return names_a_size([node.value if isinstance(node, cst.Name) else node.attr.value for node in nodes])
