"""MGP249: a collective or a DDP forward that only the main process runs waits forever (``--to ddp``)."""

from __future__ import annotations

import builtins
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.guards import (
    is_other_processes_condition,
    main_process_blocks,
    only_shows,
    under_main_process_block,
)
from mgpu_migrate.analysis.models import MODULE_METHODS_RETURNING_SELF
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Review, Rule
from mgpu_migrate.rules.syntax import RUNTIME

_COLLECTIVES = {
    f"torch.distributed.{name}"
    for name in (
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_to_all",
        "barrier",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "gather_object",
        "monitored_barrier",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "scatter",
        "scatter_object_list",
    )
} | {f"{RUNTIME}.{name}" for name in ("barrier", "reduce_sum", "reduce_mean", "save", "distribute_loader", "distribute_loaders")}
_BARRIERS = {"torch.distributed.barrier", "torch.distributed.monitored_barrier", f"{RUNTIME}.barrier"}
# What a helper may do with the model without running it (a checkpoint saver reading its weights).
_READS_ONLY = frozenset({"state_dict", "module", "parameters", "named_parameters", "buffers", "named_buffers"})
_BUILTINS = frozenset(dir(builtins))
# Wrappers whose forward takes part in collectives (buffer broadcast, gradient bookkeeping), and the
# DataParallel spellings this migration turns into one.
_DDP_WRAPPERS = {names.TORCH_DDP, names.APEX_DDP, names.RUNTIME_DDP, names.DATA_PARALLEL, names.ENCODING_MODEL}


COLLECTIVE_IN_MAIN_PROCESS_BLOCK = Review(
    "MGP249",
    name="collective-in-main-process-block",
    summary="a collective or a DDP forward inside a main-process-only block: the other processes never join",
    why=(
        "A collective, or a forward of the DDP model (which synchronizes), runs inside a block only the main "
        "process runs: the other processes never join it and the run hangs."
    ),
    todo="Move it out of the block, or give that code the bare model (`model.module`).",
)


class MainProcessCollective(Rule):
    """
    ## What it does
    Reports a collective (``dist.all_reduce``, ``dist.barrier``, ``mgpu_runtime.save``, ``reduce_sum`` ...,
    and a loss on the model's outputs in the training loop, which the runtime makes global with one),
    a forward pass of the DDP-wrapped model, or a call that is handed that model, inside a block that only
    the main process runs (``if args.local_rank in [-1, 0]:``, ``if dist.get_rank() == 0:``,
    ``if mgpu_runtime.is_main_process():``). It rewrites nothing.

    ## Why is this bad?
    A collective completes only when every process joins it. Inside a main-process-only block the other
    processes never arrive, and the run hangs (until a timeout, if there is one). A DDP forward may
    broadcast buffers, and an evaluation there usually runs the DDP model.

    ## Example
    ```python
    if args.local_rank in [-1, 0]:
        results = evaluate(args, model, tokenizer)
    ```

    ## Use instead
    ```python
    results = evaluate(args, model.module, tokenizer)   # the bare model: no collectives
    # or evaluate on every process: its metrics are the global batch's
    ```

    ## Fix safety
    Nothing is rewritten: which fix is right (the bare model, evaluating everywhere, moving the collective
    out) depends on what the block does. Not reported: the paired barrier of
    ``if local_rank not in [-1, 0]: barrier()`` ... ``if local_rank == 0: barrier()`` (the first process
    prepares something while the others wait, then joins them), the model handed to ``print`` or a logger,
    and to a function of this file that only reads its weights (``model.state_dict()``). A function of this
    file that calls a collective is reported at its call (``def sync(...)`` with a ``dist.all_reduce``); its
    ``torch.save`` is not one: called there, it becomes ``mgpu_runtime.save(..., wait=False)`` (MGP123).
    """

    CODE = COLLECTIVE_IN_MAIN_PROCESS_BLOCK
    PHASE = PROGRAM
    USES = ("bindings", "loaders", "losses", "models", "values")
    REVIEW_CODES = (COLLECTIVE_IN_MAIN_PROCESS_BLOCK,)
    DESCRIPTION = "collectives and DDP forwards inside main-process-only blocks reported"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.distributed as dist
            import torch.nn as nn
            model = nn.DataParallel(model)
            if dist.get_rank() == 0:
                dist.barrier()
                evaluate(model)
            """,
            """
            import torch.distributed as dist
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            if dist.get_rank() == 0:
                dist.barrier()
                evaluate(model)
            """,
            DDP,
            ("MGP101", "MGP249"),
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            if args.local_rank in [-1, 0]:
                evaluate(model.module)
            """,
            """
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            if args.local_rank in [-1, 0]:
                evaluate(model.module)
            """,
            DDP,
            ("MGP101",),
        ),
        Example(
            """
            import torch.nn as nn
            import torch.nn.functional as F
            from torch.utils.data import DataLoader
            model = nn.DataParallel(model)
            for x, y in DataLoader(data, batch_size=8):
                out = model(x)
                if args.local_rank in [-1, 0]:
                    print(F.l1_loss(out, y).item())
                F.mse_loss(out, y).backward()
            """,
            """
            import torch.nn.functional as F
            from torch.utils.data import DataLoader
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            for x, y in DataLoader(data, batch_size=8):
                out = model(x)
                if args.local_rank in [-1, 0]:
                    print(F.l1_loss(out, y).item())
                F.mse_loss(out, y).backward()
            """,
            DDP,
            ("MGP101", "MGP249"),
        ),
    )

    def apply(self) -> None:
        if not self.program.wraps:
            return
        # A loss on the outputs in a training loop: a reduction of the runtime's global values, a collective.
        loss_calls = {loss.call for loss in self.analysis.losses.calls}
        loops = set(self.analysis.loaders.training_loops)
        for block in main_process_blocks(self.analysis):
            condition = self.analysis.code_of(block.test)
            for call in contains(block.body, lambda node: type(node) is cst.Call):
                found = self._waits_for_others(call)
                if found is None and call in loss_calls and any(node in loops for node in self.analysis.tree.ancestors(call)):
                    found = "a loss of the batch (a collective, made global)", "compute it on every process"
                if found is not None:
                    what, fix = found
                    self.left(
                        call,
                        COLLECTIVE_IN_MAIN_PROCESS_BLOCK,
                        f"{what} under `if {shorten(condition, 30)}:` (main process only): it hangs; {fix}",
                    )

    def _waits_for_others(self, call: cst.Call) -> Optional[tuple[str, str]]:
        """What in ``call`` needs the other processes, and how to fix it."""
        qualified = self.analysis.resolve(call.func)
        if qualified in _BARRIERS and self._paired_barrier(call):
            return None
        if qualified in _COLLECTIVES and not _waits_not(call):
            return f"the collective `{qualified}`", "move it out of the block"
        if self._holds_ddp_model(call.func, call):
            return "a forward pass of the DDP model", "call the bare model (`.module`) here"
        if (qualified or "").startswith("torch.") or self._is_builtin(call.func) or only_shows(call):
            return None  # torch.save(model), hasattr(model, ...), logger.info(model): nothing runs the model
        callee = self._callee(call)
        inner = self._collective_in(callee) if callee is not None else None
        if inner is not None:
            name = callee.name.value
            return f"`{name}` (line {self.analysis.position(callee)[0]}), which calls `{inner}`,", "call it on every process"
        for position, arg in enumerate(call.args):
            if self._holds_ddp_model(arg.value, call) and not (callee and self._only_reads(callee, position, arg)):
                callee = self.analysis.code_of(call.func)
                return f"the DDP model handed to `{callee}`, which may run it", "give it the bare model"
        return None

    def _paired_barrier(self, barrier: cst.Call) -> bool:
        """Whether the function also has a barrier that the other processes run (``if local_rank not in
        [-1, 0]: barrier()``): the two meet, and nobody waits forever."""
        tree = self.analysis.tree
        function = tree.function(barrier)
        for call in self.analysis.calls:
            if call is barrier or tree.function(call) is not function:
                continue
            if self.analysis.resolve(call.func) in _BARRIERS and any(
                type(guard) is cst.If and not in_else and is_other_processes_condition(guard.test)
                for guard, in_else in tree.enclosing_ifs(call)
            ):
                return True
        return False

    def _callee(self, call: cst.Call) -> Optional[cst.FunctionDef]:
        """The function of this file that ``call`` calls by its name, when there is exactly one."""
        if type(call.func) is not cst.Name:
            return None
        defined = [f for f in self.analysis.tree.nodes(cst.FunctionDef) if f.name.value == call.func.value]
        return defined[0] if len(defined) == 1 else None

    def _collective_in(self, function: cst.FunctionDef) -> Optional[str]:
        """A collective that ``function`` calls, unless a main-process-only block of its own holds it. Its
        ``torch.save`` is none: called here, it becomes ``mgpu_runtime.save(..., wait=False)`` (MGP123)."""
        for call in contains(function.body, lambda n: type(n) is cst.Call):
            qualified = self.analysis.resolve(call.func)
            if qualified in _COLLECTIVES and not _waits_not(call) and not under_main_process_block(self.analysis, call):
                return qualified
        return None

    def _only_reads(self, function: cst.FunctionDef, position: int, arg: cst.Arg) -> bool:
        """Whether ``function`` only reads the model it gets as argument ``position`` (its ``state_dict()``,
        ``.module``, ``parameters()``)."""
        if arg.keyword is not None or arg.star or position >= len(function.params.params):
            return False
        parameter = function.params.params[position].name.value
        uses = contains(function.body, lambda n: type(n) is cst.Name and n.value == parameter)
        return bool(uses) and all(self._read_only_use(use) for use in uses)

    def _read_only_use(self, use: cst.Name) -> bool:
        parent = self.analysis.tree.parent(use)
        return type(parent) is cst.Attribute and parent.value is use and parent.attr.value in _READS_ONLY

    def _is_builtin(self, func: cst.BaseExpression) -> bool:
        bindings = self.analysis.bindings
        return (
            type(func) is cst.Name
            and func.value in _BUILTINS
            and func.value not in bindings.local
            and func.value not in bindings.imported
        )

    def _holds_ddp_model(self, expr: cst.BaseExpression, call: cst.Call) -> bool:
        if type(expr) not in (cst.Name, cst.Attribute, cst.Subscript):
            return False
        values = self.analysis.values
        scope = values.scope_of(call)
        if self.analysis.models.model_sites(expr, scope):
            return True
        for value in values.of(expr, scope):
            while (
                type(value) is cst.Call
                and type(value.func) is cst.Attribute
                and value.func.attr.value in MODULE_METHODS_RETURNING_SELF
            ):
                value = value.func.value
            if type(value) is cst.Call and self.analysis.resolve(value.func) in _DDP_WRAPPERS:
                return True
        return False


def _waits_not(call: cst.Call) -> bool:
    """``mgpu_runtime.save(..., wait=False)``: written by the main process, waited for by nobody."""
    return any(
        arg.keyword is not None and arg.keyword.value == "wait" and type(arg.value) is cst.Name and arg.value.value == "False"
        for arg in call.args
    )
