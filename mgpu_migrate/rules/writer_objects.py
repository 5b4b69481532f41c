"""MGP135, MGP332: TensorBoard writers built and used on the main process only (``--to ddp``)."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.guards import under_main_process_block
from mgpu_migrate.analysis.stand_ins import LOGDIR, blocker
from mgpu_migrate.analysis.writers import WRITER_OBJECTS
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, Example, Review, Rule
from mgpu_migrate.rules.syntax import MAIN_PROCESS_OBJECT, RUNTIME, through_runtime

# The library objects that write once built, and what each process would write: TensorBoard's writers (torch's,
# tensorboardX's, tensorboard_logger's ``Logger``, whose event file is named by the second and the host, so two
# processes starting in one second write one file), visdom's client (every process would send each point, and a
# plot updated with ``update="append"`` would get it once per process), and ignite's ``ModelCheckpoint``, a handler
# an engine calls to save (every process would save the same files, and remove the oldest past ``n_saved`` once each).
_EVENTS = ("an event file each", "each value logged once")
_CHECKPOINTS = ("each saving the same files", "its files saved once")
_PLOTS = ("its points sent to the server once each", "each point plotted once")
_WRITER_OBJECTS = {
    name: _PLOTS if name.startswith("visdom.") else _CHECKPOINTS if name.startswith("ignite.") else _EVENTS
    for name in WRITER_OBJECTS
}

# The objects whose stand-in returns the main process's results of its method calls on every process: a visdom
# client's are the ids of the windows it drew, which a script keeps and hands back (``win=window``).
_RESULTS_SHARED = frozenset({"visdom.Visdom"})
# ... and those whose log directory is (``writer.get_logdir()``, ``writer.file_writer.get_logdir()``: where
# pytorch-semseg saves its best model): the runtime's TensorBoard writers (torch's and tensorboardX's).
_LOGDIR_SHARED = frozenset(
    {"torch.utils.tensorboard.SummaryWriter", "torch.utils.tensorboard.writer.SummaryWriter", "tensorboardX.SummaryWriter"}
)

WRITER_ON_EVERY_PROCESS = Review(
    "MGP332",
    name="writer-on-every-process",
    summary="a writer object (a TensorBoard writer, a visdom client, a checkpoint handler) built by every process: it writes once per process",
    why=(
        "A TensorBoard `SummaryWriter` (torch's, tensorboardX's, or tensorboard_logger's `Logger`) is built by every "
        "process of the distributed run: each writes an event file of its own into the log directory, so "
        "TensorBoard shows every scalar, image and histogram once per process (the values are the same where they "
        "are global, such as the runtime's losses and metrics); tensorboard_logger names its file by the second "
        "and the host, so two processes starting in one second write one file. A visdom client (`visdom.Visdom`) "
        "sends every point from every process, so a plot updated with `update='append'` gets each once per "
        "process. An ignite `ModelCheckpoint` "
        "attached to an engine saves the same files from every process, and each removes the oldest past "
        "`n_saved`, so a slower process fails on a file another removed. The tool builds such an object on the "
        "main process only (MGP135) where the script only calls its methods for their effect or attaches it to "
        "an engine (`add_event_handler`), also in the functions it is handed to (a visdom client's method results "
        "may be used: every process gets the main process's); this one is read otherwise (an "
        "attribute, a result), handed to a function that is not read, or the file is migrated with `--style torch`."
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
    tensorboardX's, or tensorboard_logger's ``Logger``), a visdom client (``visdom.Visdom``) or an ignite
    ``ModelCheckpoint`` handler on the main process only: ``writer = SummaryWriter(log_dir)`` becomes ``writer =
    mgpu_runtime.main_process_only(SummaryWriter, log_dir)``. Every process gets a stand-in and goes on using it
    as before (``writer.add_scalar("loss", loss, step)``, ``log(writer, ...)``): its method calls run on the
    main process only, given the whole values. The tool first reads every use of the writer, in the file and in
    the functions of the file or the project that it is handed to: each must call a method for its effect, test
    it against None, hand it on to such a function, or attach it to an engine (``trainer.add_event_handler(event,
    checkpointer, {...})``, which calls it for its effect). A visdom client's method results may be used too:
    its stand-in returns the main process's on every process (``window = viz.line(...)``, then ``win=window``).
    Else the writer is reported (MGP332).

    ## Why is this bad?
    Each process would write an event file of its own into the log directory, and TensorBoard would show every
    value once per process; a visdom plot appended to by every process gets every point once per process. A
    checkpoint handler attached on every process saves the same files once per process, and each process removes
    the oldest past ``n_saved``: the slower one fails on a file already removed.

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
    is used (but a visdom client's, and a TensorBoard writer's `get_logdir()`, also through `file_writer`: the main
    process's result, sent to the others through the job's store), an
    attribute read (``writer.log_dir``), a writer handed to a function the tool cannot read, or
    ``--style torch`` (no runtime) leaves the writer as it is, reported (MGP332).
    """

    CODE = MAIN_PROCESS_OBJECT
    PHASE = PROGRAM
    REVIEW_CODES = (WRITER_ON_EVERY_PROCESS,)
    DESCRIPTION = "TensorBoard writers and checkpoint handlers built and used on the main process only, behind a stand-in"
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
        Example(
            """
            import torch.nn as nn
            import tensorboard_logger as tb_logger

            model = nn.DataParallel(model)
            logger = tb_logger.Logger(logdir="runs", flush_secs=2)
            logger.log_value("loss", loss, epoch)
            """,
            """
            import tensorboard_logger as tb_logger
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            logger = mgpu_runtime.main_process_only(tb_logger.Logger, logdir="runs", flush_secs=2)
            logger.log_value("loss", loss, epoch)
            """,
            DDP,
            ("MGP101", "MGP135"),
            name="tensorboard_logger's Logger is a TensorBoard writer",
        ),
        Example(
            """
            import torch.nn as nn
            import visdom

            model = nn.DataParallel(model)
            viz = visdom.Visdom(env="train")
            viz.line(X=[step], Y=[loss.item()], win="loss", update="append")
            """,
            """
            import visdom
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            viz = mgpu_runtime.main_process_only(visdom.Visdom, env="train")
            viz.line(X=[step], Y=[loss.item()], win="loss", update="append")
            """,
            DDP,
            ("MGP101", "MGP135"),
            message="`visdom.Visdom(...)`: built on the main process only, a stand-in elsewhere (mgpu_runtime.main_process_only): each point plotted once",
            name="a visdom client: every process would append each point to the plot",
        ),
        Example(
            """
            import torch.nn as nn
            import visdom

            model = nn.DataParallel(model)
            viz = visdom.Visdom()
            window = None
            for step, loss in enumerate(losses):
                if window is None:
                    window = viz.line(X=[step], Y=[loss])
                else:
                    viz.line(X=[step], Y=[loss], win=window, update="append")
            """,
            """
            import visdom
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            viz = mgpu_runtime.main_process_only(visdom.Visdom)
            window = None
            for step, loss in enumerate(losses):
                if window is None:
                    window = viz.line(X=[step], Y=[loss])
                else:
                    viz.line(X=[step], Y=[loss], win=window, update="append")
            """,
            DDP,
            ("MGP101", "MGP135"),
            name="a visdom window's id kept and handed back: every process gets the main process's",
        ),
        Example(
            """
            import torch.nn as nn
            import visdom

            model = nn.DataParallel(model)
            viz = visdom.Visdom()
            print(viz.env)
            """,
            """
            import visdom
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            viz = visdom.Visdom()
            print(viz.env)
            """,
            DDP,
            ("MGP101", WRITER_ON_EVERY_PROCESS),
            message="`viz.env` is read at line 6",
            name="a visdom client's attribute read: left, said",
        ),
        Example(
            """
            import torch.nn as nn
            from ignite.engine import Engine, Events
            from ignite.handlers import ModelCheckpoint

            model = nn.DataParallel(model)
            trainer = Engine(update)
            checkpointer = ModelCheckpoint("out", "net", 1, n_saved=10, require_empty=False)
            trainer.add_event_handler(Events.EPOCH_COMPLETED, checkpointer, {"model": model})
            """,
            """
            from ignite.engine import Engine, Events
            from ignite.handlers import ModelCheckpoint
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            trainer = Engine(update)
            checkpointer = mgpu_runtime.main_process_only(ModelCheckpoint, "out", "net", 1, n_saved=10, require_empty=False)
            trainer.add_event_handler(Events.EPOCH_COMPLETED, checkpointer, {"model": model})
            """,
            DDP,
            ("MGP101", "MGP135"),
            message="`ModelCheckpoint(...)`: built on the main process only",
            line=7,
        ),
        Example(
            """
            import torch.nn as nn
            from ignite.handlers import ModelCheckpoint

            model = nn.DataParallel(model)
            checkpointer = ModelCheckpoint("out", "net", 1, n_saved=10, require_empty=False)
            on_epoch(checkpointer)
            """,
            """
            from ignite.handlers import ModelCheckpoint
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            checkpointer = ModelCheckpoint("out", "net", 1, n_saved=10, require_empty=False)
            on_epoch(checkpointer)
            """,
            DDP,
            ("MGP101", WRITER_ON_EVERY_PROCESS),
            message="`ModelCheckpoint(...)` built by every process, each saving the same files: not moved, handed to `on_epoch`",
        ),
    )

    def apply(self) -> None:
        if not self.program.runs_distributed:
            return
        for call in self.analysis.calls:
            kind = _WRITER_OBJECTS.get(self.analysis.resolve(call.func) or "")
            if kind is None or under_main_process_block(self.analysis, call):
                continue
            writes, once = kind
            reason = self._blocker(call)
            if reason is None:
                if self.rewrite_allowed(call):
                    self.edits.replace(call, through_runtime("main_process_only"))
                    self.edits.need_import(RUNTIME)
                    self.rewrote(
                        call,
                        f"`{shorten(self.analysis.code_of(call.func), 40)}(...)`: built on the main process only, a "
                        f"stand-in elsewhere ({RUNTIME}.main_process_only): {once}",
                    )
                continue
            self.left(
                call,
                WRITER_ON_EVERY_PROCESS,
                f"`{shorten(self.analysis.code_of(call.func), 40)}(...)` built by every process, {writes}: not moved, {reason}",
            )

    def _blocker(self, call: cst.Call) -> Optional[str]:
        if self.options.style != RUNTIME_STYLE:
            return "as --style torch has no runtime (build it under `if dist.get_rank() == 0:`)"
        tree = self.analysis.tree
        line = tree.parent(call)
        if type(line) is not cst.Assign or len(line.targets) != 1 or line.value is not call:
            return "as it is not assigned to a name"
        made = self.analysis.resolve(call.func)
        results: bool | str = True if made in _RESULTS_SHARED else LOGDIR if made in _LOGDIR_SHARED else False
        return blocker(self.analysis, line.targets[0].target, call, results)
