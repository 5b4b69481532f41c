"""MGP160: ``--style torch``: the DataParallel wrapper becomes torch's own ``DistributedDataParallel``."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.rules.base import DDP, TORCH_STYLE, Example, Rewrite
from mgpu_migrate.rules.syntax import parse, with_keyword
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS
from mgpu_migrate.rules.wrapper_swap import WrapperSwap

# The process's own GPU once the set-up bound it (`torch.cuda.set_device`), whatever scope the wrap is in.
_DEVICE_IDS = "[torch.cuda.current_device()] if torch.cuda.is_available() else None"


class TorchWrapperSwap(WrapperSwap):
    """
    ## What it does
    Under ``--to ddp --style torch``, replaces ``nn.DataParallel(model, ...)`` with
    ``torch.nn.parallel.DistributedDataParallel(model, device_ids=...)``: the process's own GPU on CUDA
    (the one the set-up bound with ``torch.cuda.set_device(local_rank)``), none on CPU. The sites the default
    style leaves (``dim != 0``, part of a model, ``*args`` ...) are left the same way.

    ## Why is this bad?
    ``nn.DataParallel`` gathers every output on the first device and replays the module to every device on
    every step; one process per GPU with torch's ``DistributedDataParallel`` does neither, and needs no
    dependency beyond PyTorch.

    ## Example
    ```python
    model = nn.DataParallel(model, device_ids=[0, 1])
    ```

    ## Use instead
    ```python
    model = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None
    )
    ```

    ## Fix safety
    The wrap is the textbook one: gradients are averaged over the processes, which equals the original
    gradient only for a mean loss over the rows of equal shares of each batch (see MGP297, MGP299); a mean
    over tokens or valid targets computed inside the model's ``forward``, and dropout masks (each process
    draws its own), are not the original's, where the default style's runtime makes them so. ``device_ids`` and
    ``output_device`` of the original are dropped: each process owns one device. The model must be on that
    device before the wrap, as DataParallel needed it on the first one (``.cuda()`` goes there once the
    set-up ran).
    """

    CODE = Rewrite("MGP160")
    STYLES = (TORCH_STYLE,)
    TARGETS = (DDP,)
    REVIEW_CODES = ()
    DESCRIPTION = "DataParallel wrapper replaced with torch's DistributedDataParallel (--style torch)"
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model, device_ids=[0, 1])
            """,
            """
            import torch
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None)
            """,
            DDP,
            ("MGP160",),
            TORCH_OPTIONS,
        ),
    )

    def _announce(self, call: cst.Call) -> None:
        self.edits.need_import("torch")
        self.rewrote(call, "torch's DistributedDataParallel: gradients averaged over processes, the original's for a mean over rows only")

    def _ddp_wrapper(self, call: cst.Call, args: list[cst.Arg]) -> cst.Call:
        wrapped = call.with_changes(func=parse("torch.nn.parallel.DistributedDataParallel"), args=args)
        return with_keyword(wrapped, "device_ids", parse(_DEVICE_IDS))
