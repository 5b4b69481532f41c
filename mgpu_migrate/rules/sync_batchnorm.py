"""MGP129: BatchNorm statistics over the whole global batch, with ``--sync-bn`` (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.options import Options
from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Rewrite, Rule
from mgpu_migrate.rules.syntax import argument, parse, torch_nn_spelling

CONVERT = "SyncBatchNorm.convert_sync_batchnorm"


class SyncBatchNorm(Rule):
    """
    ## What it does
    With ``--sync-bn``, converts the model's BatchNorm layers to ``SyncBatchNorm`` where it is wrapped:
    ``mgpu_runtime.DistributedDataParallel(nn.SyncBatchNorm.convert_sync_batchnorm(model))``. Without it,
    BatchNorm layers stay as they are, which is the DataParallel original's behaviour.

    ## Why is this bad?
    Under DDP each process normalizes over its own chunk of the batch, exactly as each GPU did under
    DataParallel (device 0's running statistics kept, as replica 0's were), but not as a single device did
    over the whole batch. ``SyncBatchNorm`` computes the statistics over the global batch, at the cost of a
    collective in every BatchNorm layer.

    ## Example
    ```python
    model = nn.DataParallel(resnet50())
    ```

    ## Use instead
    ```python
    model = mgpu_runtime.DistributedDataParallel(nn.SyncBatchNorm.convert_sync_batchnorm(resnet50()))
    ```

    ## Fix safety
    Opt-in, because it changes what the model computes compared with the DataParallel original (per-GPU
    statistics) while matching a single-device run; in a single process it is plain BatchNorm. On the CPU,
    where torch's ``SyncBatchNorm`` refuses to run, the runtime's wrapper runs its own.
    """

    CODE = Rewrite("MGP129")
    PHASE = PROGRAM
    DESCRIPTION = "BatchNorm converted to SyncBatchNorm (--sync-bn)"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
            """,
            """
            import torch.nn as nn
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))))
            """,
            DDP,
            ("MGP101", "MGP129"),
            Options(sync_bn=True),
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
            """,
            """
            import torch.nn as nn
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
            """,
            DDP,
            ("MGP101",),
            name="without-sync-bn-batchnorm-is-per-process-as-per-gpu",
        ),
    )

    def apply(self) -> None:
        program = self.program
        if not program.migrates:
            return
        if not self.options.sync_bn:
            return  # each process normalises over its chunk, as each GPU did under DataParallel
        nn, needs_torch = torch_nn_spelling(self.analysis)
        for wrap in program.wraps:
            module = argument(wrap, "module", 0)
            if (
                module is None
                or CONVERT in self.analysis.code_of(module.value)
                or not self.rewrite_allowed(wrap)
            ):
                continue
            convert = parse(f"{nn}.{CONVERT}")
            self.edits.replace(module.value, lambda value, convert=convert: cst.Call(convert, [cst.Arg(value)]))
            if needs_torch:
                self.edits.need_import("torch")
            self.rewrote(wrap, "BatchNorm layers converted to SyncBatchNorm: statistics over the whole global batch")
