"""MGP135, MGP332: TensorBoard writers built and used on the main process only (``--to ddp``)."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.guards import under_main_process_block
from mgpu_migrate.analysis.stand_ins import blocker
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, Example, Review, Rule
from mgpu_migrate.rules.syntax import MAIN_PROCESS_OBJECT, RUNTIME, through_runtime

_SUMMARY_WRITERS = frozenset(
    {"torch.utils.tensorboard.SummaryWriter", "torch.utils.tensorboard.writer.SummaryWriter", "tensorboardX.SummaryWriter"}
)

WRITER_ON_EVERY_PROCESS = Review(
    "MGP332",
    name="writer-on-every-process",
    summary="a TensorBoard SummaryWriter built by every process: each value is logged once per process",
    why=(
        "A TensorBoard `SummaryWriter` is built by every process of the distributed run: each writes an event "
        "file of its own into the log directory, so TensorBoard shows every scalar, image and histogram once per "
        "process (the values are the same where they are global, such as the runtime's losses and metrics). The "
        "tool builds a writer on the main process only (MGP135) where the script only calls its methods for their "
        "effect, also in the functions it is handed to; this one is read otherwise (an attribute, a result), "
        "handed to a function that is not read, or the file is migrated with `--style torch`."
    ),
    todo=(
        "Build it on the main process only (`writer = SummaryWriter(...) if mgpu_runtime.is_main_process() else "
        "None`) and log under `if writer is not None:`, or give each process a directory of its own."
    ),
)


class WriterObjects(Rule):
    """
    ## What it does
    In a file that becomes a distributed program, builds a TensorBoard ``SummaryWriter`` (torch's or
    tensorboardX's) on the main process only: ``writer = SummaryWriter(log_dir)`` becomes ``writer =
    mgpu_runtime.main_process_only(SummaryWriter, log_dir)``. Every process gets a stand-in and goes on using it
    as before (``writer.add_scalar("loss", loss, step)``, ``log(writer, ...)``): its method calls run on the
    main process only, given the whole values. The tool first reads every use of the writer, in the file and in
    the functions of the file or the project that it is handed to: each must call a method for its effect, test
    it against None, or hand it on to such a function. Else the writer is reported (MGP332).

    ## Why is this bad?
    Each process would write an event file of its own into the log directory, and TensorBoard would show every
    value once per process.

    ## Example
    ```python
    writer = SummaryWriter(log_dir)
    for step, (x, y) in enumerate(loader):
        ...
        writer.add_scalar("loss", loss.item(), step)
    ```

    ## Use instead
    ```python
    writer = mgpu_runtime.main_process_only(SummaryWriter, log_dir)
    for step, (x, y) in enumerate(loader):
        ...
        writer.add_scalar("loss", loss.item(), step)
    ```

    ## Fix safety
    What is logged is computed where it was, by every process (the runtime's losses and metrics are the global
    batch's, and every process must join in reducing them); the stand-in makes the global values among a
    method's arguments whole on every process before the main process writes them. A method call whose result
    is used, an attribute read (``writer.log_dir``), a writer handed to a function the tool cannot read, or
    ``--style torch`` (no runtime) leaves the writer as it is, reported (MGP332).
    """

    CODE = MAIN_PROCESS_OBJECT
    PHASE = PROGRAM
    REVIEW_CODES = (WRITER_ON_EVERY_PROCESS,)
    DESCRIPTION = "TensorBoard writers built and used on the main process only, behind a stand-in"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            from torch.utils.tensorboard import SummaryWriter

            model = nn.DataParallel(model)
            writer = SummaryWriter("runs")  # one event file
            writer.add_scalar("loss", loss.item(), step)
            """,
            """
            from torch.utils.tensorboard import SummaryWriter
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            writer = mgpu_runtime.main_process_only(SummaryWriter, "runs")  # one event file
            writer.add_scalar("loss", loss.item(), step)
            """,
            DDP,
            ("MGP101", "MGP135"),
            message="`SummaryWriter(...)`: built on the main process only",
            line=5,
        ),
        Example(
            """
            import torch.nn as nn
            from torch.utils.tensorboard import SummaryWriter

            model = nn.DataParallel(model)
            writer = SummaryWriter("runs")
            print(writer.log_dir)
            """,
            """
            from torch.utils.tensorboard import SummaryWriter
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            writer = SummaryWriter("runs")
            print(writer.log_dir)
            """,
            DDP,
            ("MGP101", WRITER_ON_EVERY_PROCESS),
            message="`writer.log_dir` is read at line 6",
        ),
    )

    def apply(self) -> None:
        if not self.program.runs_distributed:
            return
        for call in self.analysis.calls:
            if self.analysis.resolve(call.func) not in _SUMMARY_WRITERS or under_main_process_block(self.analysis, call):
                continue
            reason = self._blocker(call)
            if reason is None:
                if self.rewrite_allowed(call):
                    self.edits.replace(call, through_runtime("main_process_only"))
                    self.edits.need_import(RUNTIME)
                    self.rewrote(
                        call,
                        f"`{shorten(self.analysis.code_of(call.func), 40)}(...)`: built on the main process only, a "
                        f"stand-in elsewhere ({RUNTIME}.main_process_only): each value logged once",
                    )
                continue
            self.left(
                call,
                WRITER_ON_EVERY_PROCESS,
                f"`{shorten(self.analysis.code_of(call.func), 40)}(...)` built by every process, an event file each: not "
                f"moved, {reason}",
            )

    def _blocker(self, call: cst.Call) -> Optional[str]:
        if self.options.style != RUNTIME_STYLE:
            return "as --style torch has no runtime (build it under `if dist.get_rank() == 0:`)"
        tree = self.analysis.tree
        line = tree.parent(call)
        if type(line) is not cst.Assign or len(line.targets) != 1 or line.value is not call:
            return "as it is not assigned to a name"
        return blocker(self.analysis, line.targets[0].target, call)
