"""MGP266: the Synchronized-BatchNorm package's replication callbacks keep the file off DDP (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Review, Rule

# The file is left as it is when this is reported (rules.settle).
REPLICATION_CALLBACK = Review(
    "MGP266",
    name="replication-callback",
    summary="synchronized BatchNorm called back by DataParallel's replicate: DDP never calls it",
    why=(
        "The file uses the Synchronized-BatchNorm package's replication callbacks (`patch_replication_callback`, "
        "`DataParallelWithCallback`, `__data_parallel_replicate__`): they synchronise BatchNorm statistics across "
        "the replicas DataParallel makes. DDP makes no replicas, so the callback would never run (BatchNorm per "
        "process) or fail an assertion at start-up. The file is left as it is."
    ),
    todo=(
        "Use `--to balanced` (its replicate calls `__data_parallel_replicate__`), or replace the package's "
        "BatchNorm with `nn.BatchNorm2d` and migrate with `--to ddp --sync-bn`."
    ),
    veto=True,
)
_CALLBACK_NAMES = frozenset({"patch_replication_callback", "DataParallelWithCallback"})
_CALLBACK_METHOD = "__data_parallel_replicate__"


class ReplicationCallback(Rule):
    """
    ## What it does
    Reports the replication callbacks of the Synchronized-BatchNorm package common in segmentation code
    (``patch_replication_callback(model)``, ``DataParallelWithCallback(model)``, a module defining
    ``__data_parallel_replicate__``). The file is then left as it is.

    ## Why is this bad?
    Those layers synchronise their statistics across the replicas of one ``nn.DataParallel`` forward, which
    calls them back when it replicates the model. Under DDP there are no replicas: ``patch_replication_callback``
    fails its ``isinstance(model, DataParallel)`` assertion at start-up, and the layers, never called back,
    silently normalise over each process's rows only. ``--to balanced`` replicates the model and calls
    ``__data_parallel_replicate__`` as DataParallel did.

    ## Example
    ```python
    model = nn.DataParallel(model)
    patch_replication_callback(model)
    ```

    ## Use instead
    Migrate the file with ``--to balanced``, or replace the package's layers with ``nn.BatchNorm2d`` and
    migrate with ``--to ddp --sync-bn`` (``SyncBatchNorm`` over the global batch).

    ## Fix safety
    Nothing is rewritten, in the whole file: ``--to ddp`` migrates a file entirely or not at all.
    """

    CODE = REPLICATION_CALLBACK
    PHASE = PROGRAM
    REVIEW_CODES = (REPLICATION_CALLBACK,)
    DESCRIPTION = "the Synchronized-BatchNorm package's replication callbacks keep the file off DDP"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            from sync_batchnorm import patch_replication_callback

            model = nn.DataParallel(model)
            patch_replication_callback(model)
            """,
            None,
            DDP,
            ("MGP266",),
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        sites: list[tuple[cst.CSTNode, str]] = []
        for call in self.analysis.calls:
            name = _last_name(call.func)
            if name in _CALLBACK_NAMES:
                sites.append((call, f"`{name}(...)`"))
        for function in self.analysis.tree.nodes(cst.FunctionDef):
            if function.name.value == _CALLBACK_METHOD:
                sites.append((function.name, f"`{_CALLBACK_METHOD}`"))
        for node, what in sites:
            self.left(
                node,
                REPLICATION_CALLBACK,
                f"{what} synchronises BatchNorm across DataParallel's replicas, which DDP never makes: file left as it is",
            )


def _last_name(func: cst.BaseExpression) -> str | None:
    if type(func) is cst.Name:
        return func.value
    if type(func) is cst.Attribute:
        return func.attr.value
    return None
