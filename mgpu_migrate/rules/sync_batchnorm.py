"""MGP129: BatchNorm statistics over the whole global batch, with ``--sync-bn`` (``--to ddp``)."""

from __future__ import annotations

import re

import libcst as cst

from mgpu_migrate.options import Options
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import argument, parse, torch_nn_spelling

_BATCH_NORMS = {f"torch.nn.BatchNorm{n}d" for n in (1, 2, 3)}
# torchvision models built with BatchNorm layers.
_TORCHVISION_WITH_BATCH_NORM = re.compile(
    r"torchvision\.models\.(\w+\.)?(resnet|resnext|wide_resnet|densenet|inception|googlenet|mobilenet|efficientnet"
    r"|regnet|shufflenet|mnasnet|vgg\d+_bn|deeplab|fcn_|lraspp)"
)
CONVERT = "SyncBatchNorm.convert_sync_batchnorm"


BATCHNORM_PER_PROCESS = Review(
    "MGP248",
    name="batchnorm-per-process",
    summary="BatchNorm statistics are computed per process (as per GPU under DataParallel); see --sync-bn",
    why=(
        "BatchNorm layers normalize over each process's slice of the batch, as they did over each GPU's under "
        "DataParallel: the same statistics as before, not the whole batch's."
    ),
    todo="Nothing, to keep the original's behaviour; rerun with `--sync-bn` for statistics over the whole batch.",
)


class SyncBatchNorm(Rule):
    """
    ## What it does
    With ``--sync-bn``, converts the model's BatchNorm layers to ``SyncBatchNorm`` where it is wrapped:
    ``mgpu_runtime.DistributedDataParallel(nn.SyncBatchNorm.convert_sync_batchnorm(model))``. Without it,
    a file that builds BatchNorm layers (or a torchvision model) is left with MGP248.

    ## Why is this bad?
    Under DDP each process normalizes over its own slice of the batch, as each GPU did under DataParallel,
    but not as a single device did over the whole batch. ``SyncBatchNorm`` computes the statistics over
    the global batch, at the cost of a collective in every BatchNorm layer.

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
    statistics) while matching a single-device run; in a single process it is plain BatchNorm.
    ``SyncBatchNorm`` needs GPUs when there are several processes.
    """

    CODE = Rewrite("MGP129")
    PHASE = PROGRAM
    REVIEW_CODES = (BATCHNORM_PER_PROCESS,)
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
            ("MGP101", "MGP248"),
        ),
    )

    def apply(self) -> None:
        program = self.program
        if not program.migrates:
            return
        if not self.options.sync_bn:
            layers = [call for call in self.analysis.calls if self._normalizes_batches(call)]
            if layers:
                line, _ = self.analysis.position(layers[0])
                what = self.analysis.code_of(layers[0].func)
                for wrap in program.wraps:
                    self.left(
                        wrap,
                        BATCHNORM_PER_PROCESS,
                        f"BatchNorm layers (`{shorten(what)}`, line {line}) normalize over each process's rows, as over "
                        "each GPU's before; see --sync-bn",
                    )
            return
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

    def _normalizes_batches(self, call: cst.Call) -> bool:
        qualified = self.analysis.resolve(call.func) or ""
        return qualified in _BATCH_NORMS or _TORCHVISION_WITH_BATCH_NORM.match(qualified) is not None
