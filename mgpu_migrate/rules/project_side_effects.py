"""MGP132, MGP322: files the project's own helpers write, once under DDP as in the original (``--to ddp``)."""

from __future__ import annotations

import ast
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.guards import under_main_process_block
from mgpu_migrate.analysis.project import Found, Project, Write, project_of
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, on_the_main_process

WRITTEN_BY_EVERY_PROCESS = Review(
    "MGP322",
    name="project-writes-on-every-process",
    summary="a helper of the project writes files, and every process would run it",
    why=(
        "The call builds or runs a class or function of the project's own modules that writes files (a `Logger` "
        "that opens `log.txt` with `'w'`, a `SummaryWriter`, `save_pred` writing images): every process would "
        "write them, where the original wrote them once. The tool moves a call of a function that writes onto "
        "the main process when nothing it is given comes from the batch (MGP132); an object kept and used later, "
        "or a call given the batch's values, it leaves to you: its later uses (or the batch's values, which "
        "every process must take part in reducing) cannot be moved with it."
    ),
    todo=(
        "Build the object on the main process only and use it under `if mgpu_runtime.is_main_process():` "
        "(values computed before the block, on every process), or let it write a file of each process's own."
    ),
)


class ProjectSideEffects(Rule):
    """
    ## What it does
    Follows the calls of a file that becomes a distributed program into the project's own modules (project
    reading), and finds the functions and classes there that write files: ``open(path, "w")`` or ``"a"``,
    ``torch.save``, numpy's, OpenCV's and torchvision's writers, a TensorBoard ``SummaryWriter``, a copy of a
    file, ``savefig``; and those that make or delete directories (``os.makedirs`` without ``exist_ok=True``,
    ``shutil.rmtree``), themselves or through the project's functions they call (audioset_tagging_cnn's
    ``create_logging`` calling ``create_folder``). A call of such a function as a statement of its own, given
    nothing that comes from the batch or the model's outputs, goes under ``if mgpu_runtime.is_main_process():``,
    then every process waits for it (``mgpu_runtime.barrier()``), as ``mgpu_runtime.save`` does. Any other (an object built and
    used later, a call given the batch's values) is reported (MGP322).

    ## Why is this bad?
    Every process runs the script: a helper that writes a checkpoint, a log or images writes them once per
    process, the writers racing on the same files (``"w"``) or repeating each line (``"a"``), where the
    original wrote them once. A helper's check-then-create (``if not os.path.exists(d): os.makedirs(d)``)
    fails with FileExistsError on a process that another beat to it. Same-file saves are rewritten by MGP123,
    same-file directories by MGP133; these live in ``utils/``.

    ## Example
    ```python
    from utils import save_checkpoint   # torch.save(state, filename), then shutil.copyfile if is_best

    save_checkpoint({"state_dict": model.state_dict(), "epoch": epoch}, is_best)
    ```

    ## Use instead
    ```python
    if mgpu_runtime.is_main_process():
        save_checkpoint({"state_dict": model.state_dict(), "epoch": epoch}, is_best)
    mgpu_runtime.barrier()
    ```

    ## Fix safety
    The call is moved only when it is a statement of its own (its result unused) and none of its arguments
    comes from the batch or the outputs: then the main process computes alone what it writes, with no
    collective the others would have to join. A call under a main-process block already stays as it is.
    """

    CODE = Rewrite("MGP132")
    PHASE = PROGRAM
    USES = ("loaders", "models", "values")
    REVIEW_CODES = (WRITTEN_BY_EVERY_PROCESS,)
    DESCRIPTION = "calls of the project's helpers that write files run on the main process only"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            from utils import save_checkpoint

            model = nn.DataParallel(model)
            save_checkpoint(model.module.state_dict(), "model.pt")
            """,
            """
            from utils import save_checkpoint
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            save_checkpoint(model.module.state_dict(), "model.pt")
            """,
            DDP,
            ("MGP101",),
            name="text that is no file reads no project: its helpers are not known to write",
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        project = project_of(self.analysis.path)
        if project is None:
            return
        for call in self.analysis.calls:
            found = self._project_writer(project, call)
            if found is None or under_main_process_block(self.analysis, call):
                continue
            definition, written = found
            where = f"{definition.where.rpartition(':')[0]}:{written.line}: `{written.call}`"
            writes = "makes or deletes directories" if written.directory else "writes files"
            statement = self._own_statement(call)
            if statement is not None and not self._given_the_batch(call) and isinstance(definition.node, _FUNCTIONS):
                if not self.rewrite_allowed(call):
                    continue
                self.edits.replace(statement, _on_the_main_process)
                self.edits.need_import(RUNTIME)
                self.rewrote(
                    call,
                    f"`{shorten(self.analysis.code_of(call.func))}(...)` {writes} ({where}): called on the main "
                    "process only, then every process waits",
                )
                continue
            self.left(
                call,
                WRITTEN_BY_EVERY_PROCESS,
                f"`{shorten(self.analysis.code_of(call.func))}(...)` {writes} on every process ({where}): build or "
                f"call it under `if {RUNTIME}.is_main_process():`",
            )

    def _project_writer(self, project: Project, call: cst.Call) -> Optional[tuple[Found, Write]]:
        qualified = self.analysis.resolve(call.func)
        if not qualified or qualified.startswith(("torch.", "builtins.")):
            return None
        found = project.find(qualified)
        if found is None:
            return None
        written = project.writes(found)
        return (found, written) if written is not None else None

    def _own_statement(self, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
        """The line that is this call alone (``save_checkpoint(state, is_best)``), its result unused."""
        tree = self.analysis.tree
        expression = tree.parent(call)
        line = tree.parent(expression) if type(expression) is cst.Expr else None
        if type(line) is cst.SimpleStatementLine and len(line.body) == 1:
            return line
        return None

    def _given_the_batch(self, call: cst.Call) -> bool:
        """An argument computed from the model's outputs or from what a training loop draws."""
        models = self.analysis.models
        scope = self.analysis.values.scope_of(call)
        drawn = {
            name.value
            for trace in self.analysis.loaders.traces
            for name in contains(trace.loop.target, lambda n: type(n) is cst.Name)
        }
        for arg in call.args:
            if models.derived_sites(arg.value, scope):
                return True
            if any(name.value in drawn for name in contains(arg.value, lambda n: type(n) is cst.Name)):
                return True
        return False


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _on_the_main_process(updated: cst.CSTNode) -> cst.FlattenSentinel:
    assert type(updated) is cst.SimpleStatementLine  # the replaced node is a statement line (_own_statement)
    return cst.FlattenSentinel(on_the_main_process([updated]))
