"""MGP142: ``dist.is_initialized()`` asks for the script's own process group, not the runtime's (``--to ddp``)."""

from __future__ import annotations

import ast
from typing import Iterator, Optional

import libcst as cst

from mgpu_migrate.analysis.project import Found, ProjectModule, project_of
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, runtime_call

# ``torch.distributed.is_initialized``, as a script calls it.
_IS_INITIALIZED = frozenset({"torch.distributed.is_initialized", "torch.distributed.distributed_c10d.is_initialized"})
# How deep a helper's calls of its own module's functions are followed (``reduce_tensor`` -> ``get_world_size``).
_DEPTH = 2

HELPER_ASKS_PROCESS_GROUP = Review(
    "MGP328",
    name="helper-asks-process-group",
    summary="a project helper the file calls asks dist.is_initialized(): in the migrated program the runtime's group exists",
    why=(
        "Under DataParallel the script ran in one process with no process group, so a helper of another module "
        "that serves both DataParallel and a distributed path of its own (`get_world_size()`, `reduce_tensor()`) "
        "took its one-process branch. In the migrated program every process is in the runtime's group, so "
        "`dist.is_initialized()` there is True and the helper takes its other branch: an all-reduce of a value the "
        "runtime already made the global batch's counts it W times, a batch divided by the world size shrinks. "
        "The tool rewrites this check in the files it migrates (MGP142), not in a module it does not migrate."
    ),
    todo=(
        "In the helper the message names, ask `mgpu_runtime.is_initialized()` instead (the script's own process "
        "group: the same answer as torch's wherever the runtime does not run), then mark the call `# noqa: MGP328`."
    ),
)


class ProcessGroupCheck(Rule):
    """
    ## What it does
    In a file that becomes a distributed program, replaces ``torch.distributed.is_initialized()`` with
    ``mgpu_runtime.is_initialized()``: whether a process group of the script's own making exists. The runtime's
    group does not count; on a distributed path of the script's own that it starts itself beside its migrated
    fallback (MGP120), the script's group does, and that path's calls are not rewritten. A function of another
    module of the project that the file calls and that asks it (itself, or through a function of its module it
    calls: ``reduce_tensor`` -> ``get_world_size``) is not migrated with the file: the call is named (MGP328).

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
    REVIEW_CODES = (HELPER_ASKS_PROCESS_GROUP,)
    DESCRIPTION = "dist.is_initialized() asks for the script's own process group, not the runtime's"
    TARGETS = (DDP,)
    USES = ("values",)
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
        self._helpers_that_ask()
        for call in self.analysis.calls:
            if self.analysis.resolve(call.func) not in _IS_INITIALIZED or call.args or not self.rewrite_allowed(call):
                continue
            code = shorten(self.analysis.code_of(call), 36)
            self.edits.replace(call, lambda _: runtime_call("is_initialized"))
            self.edits.need_import(RUNTIME)
            self.rewrote(call, f"`{code}` is {RUNTIME}.is_initialized(): the script's own group, never the runtime's (DataParallel had none)")

    def _helpers_that_ask(self) -> None:
        """MGP328 at each call of a function of another module of the project that asks ``dist.is_initialized()``
        (itself, or through a function of its module it calls)."""
        project = project_of(self.analysis.path)
        if project is None:
            return
        for call in self.analysis.calls:
            asked = ((found, _asks(found.module, found.node, _DEPTH)) for found in self._helpers(project, call))
            found, line = next(((found, line) for found, line in asked if line is not None), (None, None))
            if found is None or line is None or not self.rewrite_allowed(call, HELPER_ASKS_PROCESS_GROUP):
                continue  # (a call on the own path that the file starts or joins beside its fallback is its own)
            where = f"{found.where.rsplit(':', 1)[0]}:{line}"
            self.left(
                call,
                HELPER_ASKS_PROCESS_GROUP,
                f"`{shorten(self.analysis.code_of(call.func), 30)}` asks `dist.is_initialized()` ({where}): True in the "
                f"migrated program (the runtime's group); ask {RUNTIME}.is_initialized() there",
            )


    def _helpers(self, project, call: cst.Call) -> Iterator[Found]:
        """The functions of other modules of the project that ``call`` calls: by the name it imports, or through a
        variable its function assigns them to (mobilenetv2's ``get_train_loader = get_pytorch_train_loader`` in
        one branch of a backend option, the call after)."""
        for func in [call.func, *self._aliased(call)]:
            qualified = self.analysis.resolve(func)
            if not qualified or "." not in qualified or qualified.startswith(("torch.", RUNTIME)):
                continue
            found = project.find(qualified)
            if found is not None and found.module.path != self.analysis.path:
                yield found

    def _aliased(self, call: cst.Call) -> list[cst.BaseExpression]:
        """The names assigned to the variable ``call`` calls (``name = other``), where whole assignments are all
        that binds it."""
        if type(call.func) is not cst.Name:
            return []
        values = self.analysis.values.assigned_only(call.func, self.analysis.values.scope_of(call)) or []
        return [value for value, _ in values if type(value) in (cst.Name, cst.Attribute)]


def _asks(module: ProjectModule, node: ast.AST, depth: int) -> Optional[int]:
    """The line where the function ``node`` of ``module`` (or one of that module's functions it calls, ``depth``
    calls deep) calls ``torch.distributed.is_initialized()``; None when it does not."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    for inner in ast.walk(node):
        if not isinstance(inner, ast.Call):
            continue
        qualified = module.qualified(inner.func)
        if qualified in _IS_INITIALIZED:
            return inner.lineno
        if depth > 0 and qualified and qualified.startswith(".") and qualified[1:] in module.definitions:
            line = _asks(module, module.definitions[qualified[1:]], depth - 1)
            if line is not None:
                return line
    return None
