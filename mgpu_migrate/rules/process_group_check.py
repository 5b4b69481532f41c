"""MGP142: ``dist.is_initialized()`` asks for the script's own process group, not the runtime's (``--to ddp``)."""

from __future__ import annotations

from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, runtime_call

# ``torch.distributed.is_initialized``, as a script calls it.
_IS_INITIALIZED = frozenset({"torch.distributed.is_initialized", "torch.distributed.distributed_c10d.is_initialized"})


class ProcessGroupCheck(Rule):
    """
    ## What it does
    In a file that becomes a distributed program, replaces ``torch.distributed.is_initialized()`` with
    ``mgpu_runtime.is_initialized()``: whether a process group of the script's own making exists. The runtime's
    group does not count; on a distributed path of the script's own that it starts itself beside its migrated
    fallback (MGP120), the script's group does, and that path's calls are not rewritten.

    ## Why is this bad?
    Under DataParallel the script ran in one process with no process group, so its helpers that serve both
    DataParallel and a distributed path of their own took their one-process branch: ``get_world_size()``
    returned 1, ``reduce_tensor(t)`` returned ``t``. Migrated, every process joins the runtime's group, and those
    helpers would take their other branch: an all-reduce of a loss the runtime already made the global batch's
    prints W times the value, a batch divided by the world size shrinks W-fold, a loss averaged over the group
    again costs a collective per step. The runtime promises that the script's view of the world stays the
    original's; this keeps that promise for this check.

    ## Example
    ```python
    import torch.distributed as dist

    def reduced(value):
        if dist.is_initialized():
            dist.all_reduce(value)
        return value
    ```

    ## Use instead
    ```python
    import torch.distributed as dist
    import mgpu_runtime

    def reduced(value):
        if mgpu_runtime.is_initialized():
            dist.all_reduce(value)
        return value
    ```

    ## Fix safety
    Safe: in the migrated program the answer is the original's (False, unless the script starts a process group
    of its own); ``--style torch``, whose processes are torch's group and nothing else, leaves such a file
    (MGP295).
    """

    CODE = Rewrite("MGP142")
    PHASE = PROGRAM
    DESCRIPTION = "dist.is_initialized() asks for the script's own process group, not the runtime's"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.distributed as dist
            import torch.nn as nn

            model = nn.DataParallel(model)
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(loss_value)
            """,
            """
            import torch.distributed as dist
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            if dist.is_available() and mgpu_runtime.is_initialized():
                dist.all_reduce(loss_value)
            """,
            DDP,
            ("MGP101", "MGP142"),
        ),
    )

    def apply(self) -> None:
        if not self.program.runs_distributed:
            return
        for call in self.analysis.calls:
            if self.analysis.resolve(call.func) not in _IS_INITIALIZED or call.args or not self.rewrite_allowed(call):
                continue
            code = shorten(self.analysis.code_of(call), 36)
            self.edits.replace(call, lambda _: runtime_call("is_initialized"))
            self.edits.need_import(RUNTIME)
            self.rewrote(call, f"`{code}` is {RUNTIME}.is_initialized(): the script's own group, never the runtime's (DataParallel had none)")
