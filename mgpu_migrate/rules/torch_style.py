"""What the ``--style torch`` rules share: the plain-PyTorch code they write and the codes they report.

The torch style writes the textbook scaffold (``init_process_group``, ``DistributedSampler``, torch's
``DistributedDataParallel``, saves on rank 0) with no runtime import. A rewrite only the runtime can make leaves
the whole file as it is (``NEEDS_RUNTIME``, reported by the pipeline), and so does a site the torch rules find
no plain form for (``NO_TORCH_FORM``, a veto): the file is never half in one style.
"""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis import FileAnalysis
from mgpu_migrate.diagnostics import Review
from mgpu_migrate.options import TORCH_STYLE, Options

TORCH_OPTIONS = Options(style=TORCH_STYLE)

# `import torch.distributed as dist`, the name every torch-style call goes through.
DIST_IMPORT = "torch.distributed as dist"
DIST = "dist"
DIST_MODULE = "torch.distributed"

NEEDS_RUNTIME = Review(
    "MGP295",
    name="torch-style-needs-runtime",
    summary="--style torch: a rewrite here has no plain-PyTorch form; the file is left as it is",
    why=(
        "A rewrite this file needs (named in the message by its code) is made only through `mgpu_runtime` (an "
        "explicit device, a loss computed per device, a count summed over processes ...). `--style torch` writes "
        "no runtime call, and a file half migrated would train differently, so the file is left as it is."
    ),
    todo="Migrate it with the default style (`--to ddp`), or make that part plain first and run again.",
)
NO_TORCH_FORM = Review(
    "MGP296",
    name="no-torch-form",
    summary="--style torch: a site has no textbook form (a loader, a save, a loss, the name dist); file left",
    why=(
        "The site has no textbook form the tool can write exactly: a loader without `batch_size`, with its own "
        "sampler or shared with evaluation, a shuffled loader with no `for epoch in range(...)` around its "
        "training loop for `set_epoch`, a loss weighted by its targets (`weight=`, `ignore_index=`), a save "
        "inside an expression, or the name `dist` already taken. The file is left as it is."
    ),
    todo="Migrate it with the default style, whose runtime handles these, or write that part by hand.",
    veto=True,
    accounts_for_data=True,
)
LOSS_SCALE = Review(
    "MGP297",
    name="ddp-loss-scale",
    summary="--style torch: DDP averages the processes' gradients; this loss's scale or mean then differs",
    why=(
        "DDP averages the processes' gradients. For a mean over rows on equal shares that is the original's "
        "gradient; a `reduction='sum'` loss then steps 1/world_size as far, and a cross-entropy or NLL mean is "
        "over the targets not ignored in each process, which differs when some targets are `ignore_index`."
    ),
    todo=(
        "For a sum, multiply the learning rate (or the loss) by `dist.get_world_size()`; for ignored targets, "
        "sum the loss and the count of kept targets over processes (`dist.all_reduce`) or use the default style."
    ),
    void_if_left=True,
)
DATA_ORDER = Review(
    "MGP298",
    name="distributed-sampler-order",
    summary="--style torch: DistributedSampler shuffles in an order of its own, not the original's",
    why=(
        "`DistributedSampler(shuffle=True)` permutes the dataset with its own generator (`seed` + epoch) and "
        "deals it out to the processes in turn: the batches are not the ones the original's loader drew."
    ),
    todo=(
        "Nothing, if a different shuffle is fine (it usually is). For the original's exact batches use the "
        "default style, whose loader keeps the original sampler's order."
    ),
    void_if_left=True,
)
GLOBAL_BATCH = Review(
    "MGP299",
    name="global-batch-divides",
    summary="--style torch: the global batch and an epoch equal the original's only for sizes that divide",
    why=(
        "Each process reads `batch_size // world_size` rows a step: the global batch is the original's only when "
        "the batch size divides by the number of processes. `DistributedSampler` gives every process the same "
        "number of samples by repeating some when `len(dataset)` does not divide, so such an epoch sees a few "
        "samples twice (and the last, smaller batch is split the same way)."
    ),
    todo=(
        "Pick a batch size and process count that divide, or pass `drop_last=True` to the sampler to drop the "
        "tail instead of repeating it; the default style is exact for any sizes."
    ),
    void_if_left=True,
)


def statement(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code)


def dist_taken(analysis: FileAnalysis) -> bool:
    """Whether ``dist`` may mean anything but ``torch.distributed`` where the scaffold uses it: the file binds
    it otherwise, uses a ``dist`` a star import may bind, or star-imports after the place of the new import."""
    bound = analysis.bindings
    if DIST in bound.local or bound.imported.get(DIST, {DIST_MODULE}) != {DIST_MODULE}:
        return True
    if not bound.star_modules:
        return False
    if DIST not in bound.imported and any(name.value == DIST for name in analysis.tree.nodes(cst.Name)):
        return True
    first_imports = _first_import_run(analysis.module)
    stars = [node for node in analysis.tree.nodes(cst.ImportFrom) if type(node.names) is cst.ImportStar]
    return any(analysis.tree.statement(star) not in first_imports for star in stars)


def _first_import_run(module: cst.Module) -> set[cst.CSTNode]:
    """The top-level import lines the new imports go after (``imports.add_import``)."""
    run = set()
    for line in module.body:
        is_import = type(line) is cst.SimpleStatementLine and all(
            type(small) in (cst.Import, cst.ImportFrom) for small in line.body
        )
        docstring = type(line) is cst.SimpleStatementLine and type(getattr(line.body[0], "value", None)) in (cst.SimpleString, cst.ConcatenatedString)
        if is_import:
            run.add(line)
        elif not (docstring and not run):
            break
    return run
