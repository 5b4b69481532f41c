"""MGP132, MGP322: files the project's own helpers write, and evaluations they run with a DataParallel of their
own, once under DDP as in the original (``--to ddp``)."""

from __future__ import annotations

import ast
import os
import re
from typing import Optional, cast

import libcst as cst

from mgpu_migrate.analysis.guards import main_process_caller, under_main_process_block
from mgpu_migrate.analysis.handed import migrates_with
from mgpu_migrate.analysis.loaders import stored_once
from mgpu_migrate.analysis.models import MODULE_METHODS_RETURNING_SELF
from mgpu_migrate.analysis.project import Found, Project, Write, changes_a_directory, importers, project_download, project_of
from mgpu_migrate.analysis.stand_ins import blocker, uses_of
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.analysis.writers import LOGGING_METHODS, TEXT_METHODS, WRITER_OBJECTS
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import MAIN_PROCESS_OBJECT, RUNTIME, gives_download, on_the_main_process, runtime_call, through_runtime

WRITTEN_BY_EVERY_PROCESS = Review(
    "MGP322",
    name="project-writes-on-every-process",
    summary="a helper of the project writes files, and every process would run it",
    why=(
        "The call builds or runs a class or function of the project's own modules that writes files (a `Logger` "
        "that opens `log.txt` with `'w'`, a `SummaryWriter`, `save_pred` writing images): every process would "
        "write them, where the original wrote them once. The tool moves a call of a function or method that "
        "writes onto the main process when its result is unused (MGP132), and builds an object whose construction "
        "writes on the main process only, behind a stand-in, when the script only calls its methods for their effect "
        "(MGP135), and one whose construction only makes directories and keeps plain values on the main process, "
        "every process given its copy (MGP132), and runs a function whose every write is a cache it reads back on the "
        "main process first (MGP132); this one is another shape: a result that every process uses, an "
        "object read otherwise whose construction does more (writes a file, holds one open, or runs other code), a function that runs the wrapped model it is given in train mode, a method "
        "that also changes the object's state, a function only the main process calls, a call made before "
        "`mgpu_runtime.setup()` in the method that chooses the GPUs (asking which process is the main one there "
        "would set up first, on every visible GPU), or `--style torch`."
    ),
    todo=(
        "Build the object on the main process only and use it under `if mgpu_runtime.is_main_process():` "
        "(values computed before the block, on every process), or let it write a file of each process's own."
    ),
)


_MESSAGE = 160  # the most characters of a message (one short line)
_TRAINS = "as it trains"  # why a function that trains is not moved to the main process


class ProjectSideEffects(Rule):
    """
    ## What it does
    Follows the calls of a file that becomes a distributed program into the project's own modules (project
    reading), and finds the functions and classes there that write files: ``open(path, "w")`` or ``"a"``,
    ``torch.save``, numpy's, OpenCV's and torchvision's writers, a TensorBoard ``SummaryWriter``, a copy of a
    file, ``savefig``; and those that make or delete directories (``os.makedirs`` without ``exist_ok=True``,
    ``shutil.rmtree``), themselves or through the project's functions they call (audioset_tagging_cnn's
    ``create_logging`` calling ``create_folder``). A call of such a function, or of such a method of an object of
    a project class (audioset_tagging_cnn's ``statistics_container.dump()``), as a statement of its own, goes
    under ``if mgpu_runtime.is_main_process():``, then every process waits for it (``mgpu_runtime.barrier()``),
    as ``mgpu_runtime.save`` does; given values of the batch or the model's outputs, it becomes
    ``mgpu_runtime.on_main_process(helper, ...)``, which makes them whole on every process before the main process
    writes. A project class whose construction writes (a ``Logger`` opening ``log.txt``) is built on the main
    process only, behind a stand-in (``mgpu_runtime.main_process_only(Logger, path)``, MGP135), when the script
    only calls its methods for their effect; so is one a ``with`` statement enters (first-order-model's ``with
    Logger(log_dir=...) as logger:``: every process enters and leaves the stand-in, the main process the logger). One that the script sets as ``sys.stdout`` or ``sys.stderr``
    (open-reid's ``sys.stdout = Logger(path)``, which mirrors what is printed into a file it opens with ``"w"``) is
    set on the main process only, under ``if mgpu_runtime.is_main_process():``; the other processes' stdout goes
    nowhere already (the runtime's ``MGPU_LOG=rank0``), so the file holds what the original printed. One whose
    construction only makes directories and keeps plain values (text, numbers, paths, the clock), whose other
    methods write nothing and which every process reads (mean-teacher's ``main(RunContext(__file__, 0))``, its
    run's directories named by the clock) is built on the main process, and every process is given its copy
    (``mgpu_runtime.main_process_value(RunContext, __file__, 0)``). An object that a project method makes and
    returns (``context.create_train_log("training")``, a ``TrainLog``), one of whose methods writes, is built on the
    main process only, behind a stand-in (MGP135), when the script only calls its methods for their effect; the
    object the method belongs to is known from the calls of the file's function that holds it as a parameter
    (``def main(context)``). A function whose result is used and whose every write is a cache it looks for first
    (faster-rcnn's ``combined_roidb``: ``if os.path.exists(cache_file):`` load it, else compute it and pickle it to
    ``open(cache_file, 'wb')``, itself or in the project functions it calls) runs on every process, the main process
    first (``mgpu_runtime.main_process_first(combined_roidb, name)``): the main process writes the caches, the
    others read them. Any other (a result that is used, an object read otherwise, a method that also changes its
    object) is reported (MGP322).
    A call of a project function that evaluates a model with a DataParallel of its own and trains nothing
    (Towards-Realtime-MOT's ``test.test(cfg, weights=latest)``, which loads the weights just saved) goes under
    ``if mgpu_runtime.is_main_process():`` the same way when nothing reads what it returns (a statement of its
    own, or ``mAP, R, P = test.test(...)`` whose names are never read), and the others wait for it with
    ``mgpu_runtime.wait_for_main_process()``, which has no time limit (an evaluation may outlast a barrier's
    ``MGPU_TIMEOUT``): every process would otherwise run that evaluation over every GPU. One whose result is
    read is reported (MGP322). A call of a project function that runs the wrapped model it is given and writes
    (Face_Pytorch's ``getFeatureFromTorch(path, net, device, lfwdataset, lfwloader)``, which writes the test features
    with ``scipy.io.savemat`` for ``evaluation_10_fold`` to read back), with the model set to eval mode before it
    (``net.eval()`` earlier in its block or a block around it, no ``net.train()`` between) and no backward pass or
    optimizer step in the function, goes under ``if mgpu_runtime.is_main_process():`` given the model unwrapped
    (``mgpu_runtime.unwrap(net)``), and the others wait for it with ``mgpu_runtime.wait_for_main_process()``: in eval
    mode DataParallel's forward was the plain module's, row by row. In train mode (its batch norms took each device's
    rows) it is reported (MGP322): the forward of the wrapped model is every process's.

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
    mgpu_runtime.on_main_process(save_pred, outputs, "pred.npy")   # given the model's outputs
    logger = mgpu_runtime.main_process_only(Logger, "log.txt")   # its construction writes
    main(mgpu_runtime.main_process_value(RunContext, __file__, 0))   # makes the run's directories; read by all
    training_log = mgpu_runtime.main_process_only(context.create_train_log, "training")   # its record() writes
    if mgpu_runtime.is_main_process():
        sys.stdout = Logger("log.txt")   # mirrors what is printed into its file
    ```

    ## Fix safety
    The call is moved only when it is a statement of its own (its result unused): every process computes its
    arguments as before, and the global values among them are made whole on every process (a collective) before
    the main process alone writes. A method that also changes its object's state (``self.history.append(...)``)
    stays on every process, reported. An object built on the main process and copied reaches the others pickled:
    its ``__init__`` may only keep plain values, make directories and log, so what the others skip is only what the
    main process did for all (its class derives from none, and defines no pickling of its own). A stream set on
    the main process only keeps what the main process prints;
    with ``MGPU_LOG=all`` the others print to the terminal, not into the file. A call under a main-process block,
    or in a function only the main process calls, stays as it is.
    """

    CODE = Rewrite("MGP132")
    PHASE = PROGRAM
    USES = ("bindings", "flow", "handed", "loaders", "models", "values")
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
        self._stand_ins: set[cst.Call] = set()  # the objects this rule builds on the main process only (MGP135)
        self._calls_by_name: Optional[dict[str, list[cst.Call]]] = None  # the file's calls of a name, read once
        if not self.program.runs_distributed:
            return
        project = project_of(self.analysis.path)
        if project is None:
            return
        # The modules this script starts as distributed programs make their own writes once, in their migration
        # (decision-transformer's trainer saves from its train()), and their training runs on every process.
        started = {os.path.abspath(module) for module in self.program.starts}
        # So do the modules whose training code this script is handed the model to and that migrate with it
        # (Conv-TasNet's solver.py, whose Solver saves its checkpoints: Program.handed there).
        handed = {
            os.path.abspath(handover.trainer.module.path)
            for handover in self.analysis.handed.migrating
            if migrates_with(handover.trainer.module.path, self.analysis.path)
        }
        started |= handed
        for call in self.analysis.calls:
            if under_main_process_block(self.analysis, call) or gives_download(call):
                continue  # a build given download= is MGP137's: the main process first, then the others
            found = self._project_writer(project, call)
            if found is not None and os.path.abspath(found[0].module.path) in started:
                continue
            if found is not None and project.trains_through(found[0]) is not None and migrates_with(found[0].module.path, self.analysis.path):
                continue  # a training function whose module migrates (Teacher-free KD's train_kd.py): its writes are made once there
            # An evaluation that also writes (first-order-model's reconstruction(), its videos) is an evaluation:
            # the others wait for it without a time limit.
            evaluated = self._evaluation(project, call)
            if evaluated is not None:
                self._evaluated_once(call, *evaluated)
                continue
            if found is not None:
                definition, written = found
                if not isinstance(definition.node, _FUNCTIONS) and (
                    project_download(project, definition, self.analysis.code_of(call)) or project.made_when_missing(definition)
                ):
                    continue  # a dataset that downloads itself when built (open-reid's), or caches: MGP137's too
                if isinstance(definition.node, _FUNCTIONS):
                    self._call_once(call, definition, written, f"`{shorten(self.analysis.code_of(call.func))}(...)`")
                else:
                    self._object_once(project, call, definition)
                continue
            method = self._writing_method(project, call)
            if method is not None and os.path.abspath(method[0].module.path) not in started:
                self._call_once(call, *method, f"`{shorten(self.analysis.code_of(call.func))}(...)`")
                continue
            if method is None and self._unknown_writer(project, call):
                continue
            made = self._made_by_a_method(project, call) if method is None else None
            if made is not None and os.path.abspath(made[0].module.path) not in started:
                self._made_object_once(call, *made)

    def _unknown_writer(self, project: Project, call: cst.Call) -> bool:
        """MGP322 for ``param.method(...)`` on a parameter of this file's function whose class is not known here,
        when a class of the project has a method of that name that writes files (HRNet's ``validate(config,
        val_loader, val_dataset, ...)`` calls ``val_dataset.evaluate(...)``, which writes the predictions of
        every process to the same ``pred.mat``; the dataset was built by ``eval('dataset.' + name)``). Said, not
        moved: what the object is, and so whether it writes, is not known. Whether it was said."""
        func = call.func
        if type(func) is not cst.Attribute or type(func.value) is not cst.Name or func.attr.value.startswith("_"):
            return False
        function = self.analysis.tree.function(call)
        receiver = func.value.value
        if function is None or receiver in ("self", "cls") or receiver not in {param.name.value for param in function.params.params}:
            return False
        if main_process_caller(self.analysis, call) is not None or under_main_process_block(self.analysis, call):
            return False
        if self._stand_ins_given(function, receiver):
            return False  # mean-teacher's train(..., log): every call here gives it an object built on the main process only
        for method in project.methods_named(func.attr.value):
            written = project.writes(method)
            if written is not None:
                where = f"{os.path.relpath(method.module.path, os.path.dirname(self.analysis.path))}:{written.line}"
                self.left(
                    call,
                    WRITTEN_BY_EVERY_PROCESS,
                    f"`{shorten(self.analysis.code_of(func), 30)}(...)` may write on every process (as {where} "
                    f"`{shorten(written.call, 20)}` does): not moved, as the class of `{receiver}` is not known here",
                )
                return True
        return False

    def _stand_ins_given(self, function: cst.FunctionDef, parameter: str) -> bool:
        """Whether this file calls ``function`` and every call gives ``parameter`` an object this rule builds on the
        main process only, behind a stand-in (MGP135: mean-teacher's ``training_log``)."""
        flow, values = self.analysis.flow, self.analysis.values
        names = flow.parameters(function)
        sites = flow.call_sites(function)
        if not sites or parameter not in names:
            return False
        for site, scope, implicit in sites:
            given = next((arg.value for arg in site.args if arg.keyword is not None and arg.keyword.value == parameter), None)
            position = names.index(parameter) - implicit
            if given is None and 0 <= position < len(site.args) and site.args[position].keyword is None and not site.args[position].star:
                given = site.args[position].value
            given_values = values.of(given, scope) if given is not None else []
            if not given_values or not all(value in self._stand_ins or _is_none(value) for value in given_values):
                return False  # (None is given too, where the function tests it: yolact's `log if args.log else None`)
        return True

    def _evaluation(self, project: Project, call: cst.Call) -> Optional[tuple[Found, Write]]:
        """A call of a project function that evaluates a model with a DataParallel of its own (MOT's
        ``test.test(cfg, weights=latest, ...)``)."""
        qualified = self.analysis.resolve(call.func)
        if not qualified or qualified.startswith(("torch.", "builtins.")):
            return None
        found = project.find(qualified)
        wrapped = project.evaluates_in_parallel(found) if found is not None else None
        return (found, wrapped) if found is not None and wrapped is not None else None

    def _evaluated_once(self, call: cst.Call, definition: Found, wrapped: Write) -> None:
        """An evaluation with a DataParallel of the project's own, made once: every process would otherwise run
        it over every GPU. Under ``if mgpu_runtime.is_main_process():``, then a wait, when nothing reads what it
        returns (a statement of its own, or names assigned and never read); otherwise said (MGP322)."""
        what = f"`{shorten(self.analysis.code_of(call.func))}(...)` evaluates with a {wrapped.call} of its own ({definition.where.rpartition(':')[0]}:{wrapped.line})"
        statement = self._own_statement(call) or self._unread_assignment(call)
        why = None if statement is not None else "as what it returns is read"
        caller = main_process_caller(self.analysis, call)
        if self.options.style != RUNTIME_STYLE:
            why = "as --style torch has no runtime"
        elif caller is not None:
            return  # its function runs on the main process only: once already
        if why is not None:
            self.left(call, WRITTEN_BY_EVERY_PROCESS, f"{what}, which every process would run: not moved, {why}")
            return
        if not self.rewrite_allowed(call):
            return
        assert statement is not None
        self.edits.need_import(RUNTIME)
        self.edits.replace(statement, _evaluated_on_the_main_process)
        self.rewrote(call, f"{what}: called on the main process only, the others waiting for it")

    def _unread_assignment(self, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
        """``mAP, R, P = evaluate(...)`` alone on its line, none of the names it binds read anywhere else in its
        function (or module)."""
        assigned = self._assigned(call)
        return assigned[0] if assigned is not None and not assigned[1] else None

    def _only_printed(self, call: cst.Call) -> bool:
        """``stats = hungarian_evaluate(...)`` alone on its line, the names it binds read only inside
        ``print(...)`` (SCAN's ``print(clustering_stats)``), which the other processes' output drops."""
        assigned = self._assigned(call)
        if assigned is None or not assigned[1]:
            return False
        tree = self.analysis.tree
        return all(
            any(type(a) is cst.Call and type(a.func) is cst.Name and a.func.value == "print" for a in tree.ancestors(read))
            for read in assigned[1]
        )

    def _assigned(self, call: cst.Call) -> Optional[tuple[cst.SimpleStatementLine, list[cst.Name]]]:
        """For ``names = call(...)`` alone on its line (names, or a tuple or list of them): the line, and every
        read of those names elsewhere in its function (or module)."""
        tree = self.analysis.tree
        assign = tree.parent(call)
        if type(assign) is not cst.Assign or assign.value is not call:
            return None
        line = tree.parent(assign)
        if type(line) is not cst.SimpleStatementLine or len(line.body) != 1:
            return None
        bound: list[cst.Name] = []
        for target in assign.targets:
            value = target.target
            elements = [element.value for element in value.elements] if type(value) is cst.Tuple or type(value) is cst.List else [value]
            for element in elements:
                if type(element) is not cst.Name:
                    return None
                bound.append(element)
        names = {name.value for name in bound}
        scope = tree.function(call)
        reads = [
            node
            for node in tree.nodes(cst.Name)
            if node.value in names
            and not any(node is own for own in bound)
            and not _stored(tree, node)
            and (scope is None or any(ancestor is scope for ancestor in tree.ancestors(node)))
        ]
        return line, reads

    def _where(self, definition: Found, written: Write) -> str:
        if written.call.startswith("visdom."):
            return f"plots to a visdom server ({definition.where.rpartition(':')[0]}:{written.line})"
        writes = "makes or deletes directories" if written.directory else "writes files"
        return f"{writes} ({definition.where.rpartition(':')[0]}:{written.line}: `{written.call}`)"

    def _every_write(self, definition: Found, written: Write) -> str:
        """What a function left on every process writes, each write by its line (self-critical's ``eval_split``:
        a directory made, a ``torch.save``, and ``language_eval(...)``, whose json it reads back), so that the
        person moving it knows them all; ``_where`` when it writes once."""
        project = project_of(self.analysis.path)
        listed = project.function_writes(definition) if project is not None else []
        if len(listed) < 2:
            return self._where(definition, written)
        shown = ", ".join(f"{write.line} `{shorten(write.call, 24)}`" for write in listed[:3])
        more = f" and {len(listed) - 3} more" if len(listed) > 3 else ""
        return f"writes at {definition.where.rpartition(':')[0]}:{shown}{more}"

    def _call_once(self, call: cst.Call, definition: Found, written: Write, what: str) -> None:
        """A call of a project function (or of a writing method of a project object) made once: under ``if
        mgpu_runtime.is_main_process():`` then a wait, or, given the batch's values, through
        ``mgpu_runtime.on_main_process``, which makes them whole on every process first."""
        where = self._where(definition, written)
        loaded = _loads_into_its_arguments(definition.node) if type(call.func) is not cst.Attribute else None
        if loaded is not None and self._first_on_the_main_process(call, definition, written, loaded):
            return
        statement = self._own_statement(call)
        why = self._why_not(call, statement, definition)
        forward = self._runs_the_model(call, definition)
        if forward is not None:
            # Face_Pytorch's getFeatureFromTorch(path, net, ...): its forward of the wrapped model is a collective of
            # every process, so it cannot run on the main process alone (nor through on_main_process) with it; a
            # forward in eval mode only can, given the model unwrapped.
            evaluated = self._evaluates_only(call, definition) if why is None and statement is not None else None
            if evaluated is not None and self.options.style == RUNTIME_STYLE:
                if self.rewrite_allowed(call):
                    assert statement is not None
                    self._evaluated_unwrapped(call, statement, what, where, *evaluated)
                return
            # (running the wrapped model says more than that it trains, when it does both)
            reason = why if why is not None and not why.startswith(_TRAINS) else f"as it runs the wrapped model ({forward})"
            self.left(call, WRITTEN_BY_EVERY_PROCESS, f"{what} {self._every_write(definition, written)}: not moved, {reason}")
            return
        assigned = self._assigned(call) if why is not None and statement is None and self._only_printed(call) else None
        if assigned is not None and self._why_not(call, assigned[0], definition) is None:
            if self.rewrite_allowed(call):
                self.edits.need_import(RUNTIME)
                self.edits.replace(call, through_runtime("on_main_process"))
                self.rewrote(
                    call,
                    f"{what} {where}: on the main process only ({RUNTIME}.on_main_process), its result only printed",
                )
            return
        if statement is None and why == "as what it returns is used" and self._caches_first(call, definition, what, where):
            return
        if statement is None and why == "as what it returns is used" and self._writer_made_once(call, definition, what):
            return
        if why is not None:
            self.left(call, WRITTEN_BY_EVERY_PROCESS, f"{what} {self._every_write(definition, written)}: not moved, {why}")
            return
        if not self.rewrite_allowed(call):
            return
        self.edits.need_import(RUNTIME)
        if self._given_the_batch(call):
            self.edits.replace(call, through_runtime("on_main_process"))
            done = f"called on the main process only, given the whole values ({RUNTIME}.on_main_process)"
            if len(f"{what} {where}: {done}") > _MESSAGE:
                where = where.partition(": `")[0] + ")"  # the file and line, without the writing call
            self.rewrote(call, f"{what} {where}: {done}")
            return
        assert statement is not None
        loop = self._only_statement_of_a_loop(statement)
        self.edits.replace(loop or statement, _on_the_main_process)
        self.rewrote(call, f"{what} {where}: called on the main process only, then every process waits")

    def _writer_made_once(self, call: cst.Call, definition: Found, what: str) -> bool:
        """A project function or method whose only writes are the library writer objects it returns (deeplab's
        ``TensorboardSummary.create_summary``: ``writer = SummaryWriter(log_dir=...)``, ``return writer``), its
        result kept in a name used only through its methods: made on the main process only, a stand-in elsewhere
        (``mgpu_runtime.main_process_only(self.summary.create_summary)``), as a ``SummaryWriter`` built in the
        file is (MGP135). Whether it handled the call (made once, or said why not)."""
        project = project_of(self.analysis.path)
        node = definition.node
        if project is None or not isinstance(node, _FUNCTIONS):
            return False
        writes = project.function_writes(definition)
        made = [write for write in writes if write.call in WRITER_OBJECTS]
        if not made or len(made) != len(writes) or not _returns_what_it_builds(node, {write.line for write in made}):
            return False
        line = self.analysis.tree.parent(call)
        if type(line) is not cst.Assign or len(line.targets) != 1 or line.value is not call:
            return False
        found = blocker(self.analysis, line.targets[0].target, call)
        early = self._before_setup(call)
        reason = f"as {found}" if found is not None else f"as it runs before {RUNTIME}.setup() (line {early})" if early is not None else None
        if main_process_caller(self.analysis, call) is None:
            writer = made[0].call.rpartition(".")[2]
            said = f"{what} makes a `{writer}` ({definition.where.rpartition(':')[0]}:{made[0].line})"
            self._stand_in_or_said(call, reason, said, "made on the main process only")
        return True

    def _caches_first(self, call: cst.Call, definition: Found, what: str, where: str) -> bool:
        """A project function whose result is used and whose every write is a cache it reads when present
        (faster-rcnn's ``combined_roidb``, whose helpers pickle the image sizes and the roidb unless the pickles
        exist, ``Project.made_when_missing``): run on the main process first (``mgpu_runtime.main_process_first``),
        it writes the caches once and the other processes read them. Whether it was rewritten."""
        project = project_of(self.analysis.path)
        if (
            project is None
            or self.options.style != RUNTIME_STYLE
            or type(call.func) is cst.Attribute
            or main_process_caller(self.analysis, call) is not None
            or self._before_setup(call) is not None
            or project.made_when_missing(definition) is None
        ):
            return False
        if not self.rewrite_allowed(call):
            return True
        self.edits.need_import(RUNTIME)
        self.edits.replace(call, through_runtime("main_process_first"))
        self.rewrote(
            call,
            f"{what} {where.replace('writes files', 'writes caches', 1)}: main process first, the others find them "
            f"({RUNTIME}.main_process_first)",
        )
        return True

    def _first_on_the_main_process(self, call: cst.Call, definition: Found, written: Write, loaded: str) -> bool:
        """A project function that writes files and loads state into the objects it is given (WaveRNN's
        ``restore_checkpoint(..., model, optimizer, create_if_missing=True)``: the weights and the optimizer's state
        loaded when the checkpoint exists, else the checkpoint written): every process needs what it loads, so it
        runs on every process, the main process first (``mgpu_runtime.main_process_first``): the main process
        writes what is missing, the others then find it and load it. Whether it was rewritten."""
        if self.options.style != RUNTIME_STYLE or main_process_caller(self.analysis, call) is not None:
            return False
        if not self.rewrite_allowed(call):
            return True
        self.edits.need_import(RUNTIME)
        self.edits.replace(call, through_runtime("main_process_first"))
        place = f"{definition.where.rpartition(':')[0]}:{written.line}"
        self.rewrote(
            call,
            f"`{shorten(self.analysis.code_of(call.func), 24)}(...)` writes ({place}) and loads state (`{shorten(loaded, 24)}`): "
            f"main process first ({RUNTIME}.main_process_first)",
        )
        return True

    def _why_not(self, call: cst.Call, statement: Optional[cst.SimpleStatementLine], definition: Found) -> Optional[str]:
        if self.options.style != RUNTIME_STYLE:
            return "as --style torch has no runtime"
        if statement is None:
            return "as what it returns is used"
        caller = main_process_caller(self.analysis, call)
        if caller is not None:
            return f"as its function is called on the main process only (line {self.analysis.position(caller)[0]})"
        if not isinstance(definition.node, _FUNCTIONS):
            return "as it is a class"
        project = project_of(self.analysis.path)
        trained = project.trains_through(definition) if project is not None else None
        if trained is not None:
            # On the main process alone its training would wait for the others' gradient sums (Teacher-free KD's
            # train_and_evaluate_kd, which also writes its TensorBoard logs and checkpoints).
            where = f"{os.path.relpath(trained.path, os.path.dirname(self.analysis.path))}:{trained.line}"
            return f"{_TRAINS} (`{shorten(trained.call, 20)}`, {where})"
        early = self._before_setup(call)
        if early is not None:
            return f"as it runs before {RUNTIME}.setup() (line {early})"
        kept = _read_elsewhere(definition, self.analysis.source) if type(call.func) is cst.Attribute else None
        changed = _changes_its_object(definition.node, kept) if type(call.func) is cst.Attribute else None
        if changed is not None:
            return f"as `{definition.name}` also changes its object (`{shorten(changed, 30)}`)"
        return None

    def _before_setup(self, call: cst.Call) -> Optional[str]:
        """The line next to which ``mgpu_runtime.setup(...)`` goes, when the migration inserts it after ``call`` in
        ``call``'s own function (st-gcn's ``init_environment()``, where the GPUs are chosen: ``save_arg`` runs
        first); else None. Asking there which process is the main one would set up, on every visible GPU, before the
        GPUs are chosen."""
        placed = self.program.setup_statement(self.analysis)
        function = self.analysis.tree.function(call)
        if placed is None or function is None or self.analysis.tree.function(placed[0]) is not function:
            return None
        line = self.analysis.position(placed[0])[0]
        here = self.analysis.position(call)[0]
        return str(line) if here < line or (here == line and placed[1] == "inserted after") else None

    def _object_once(self, project: Project, call: cst.Call, definition: Found) -> None:
        """A project class whose construction writes (a ``Logger`` opening its file): built on the main process only,
        behind a stand-in, when the script only calls its methods for their effect. A class whose construction
        writes nothing is left to be built by every process: its writing methods are moved at their calls."""
        init = project.method(definition, "__init__")
        written = project.writes(init) if init is not None else None
        if init is None or written is None:
            return
        where = self._where(init, written)
        what = f"`{shorten(self.analysis.code_of(call.func))}(...)`"
        line = self.analysis.tree.parent(call)
        entered = _entered_as(line, call)  # `with Logger(...) as logger:` (first-order-model's)
        if self.options.style != RUNTIME_STYLE:
            reason: Optional[str] = "as --style torch has no runtime"
        elif entered is not None:
            found = blocker(self.analysis, entered, call)
            reason = f"as {found}" if found is not None else None
        elif type(line) is not cst.Assign or len(line.targets) != 1 or line.value is not call:
            reason = "as it is not assigned to a name"
        elif type(line.targets[0].target) is cst.Attribute and self.analysis.resolve(line.targets[0].target) in _STANDARD_STREAMS:
            self._stream_once(call, line, f"{what} {where}")
            return
        else:
            found = blocker(self.analysis, line.targets[0].target, call)
            reason = f"as {found}" if found is not None else None
        if reason is not None and self.options.style == RUNTIME_STYLE and entered is None and written.directory:
            target = line.targets[0].target if type(line) is cst.Assign and len(line.targets) == 1 else None
            moved = self._writing_calls_moved(project, definition, target, call) if target is not None else frozenset()
            copied = _why_not_copied(project, definition, init, moved)
            early = self._before_setup(call)
            if copied is None and early is None:
                self._built_once_and_copied(call, f"{what} makes directories ({init.where.rpartition(':')[0]}:{written.line})")
                return
            reason = f"{reason}, and {copied}" if copied is not None else f"as it runs before {RUNTIME}.setup() (line {early})"
        self._stand_in_or_said(call, reason, f"{what} {where}", "built on the main process only, a stand-in elsewhere")

    def _writing_calls_moved(self, project: Project, cls: Found, target: cst.BaseExpression, built: cst.Call) -> frozenset[str]:
        """The methods of the project class ``cls`` that write and that this file calls, on the object ``built`` and
        kept in ``target`` (deeplab's ``self.saver``), only as calls of their own that move to the main process
        (MGP132: ``self.saver.save_checkpoint(...)``), so that the object may be built on the main process and
        copied; none where the object goes anywhere else than its attributes and method calls (given to a
        function, kept under another name), or where another module of the project imports the class that holds it
        (or this module, for an object at its top level): there it may be reached (``trainer.saver.save_checkpoint``)."""
        tree = self.analysis.tree
        holder = next((node for node in tree.ancestors(built) if type(node) is cst.ClassDef), None)
        uses = uses_of(self.analysis, target, built)
        if isinstance(uses, str) or importers(self.analysis.path, holder.name.value if holder is not None else self.analysis.code_of(target)):
            return frozenset()
        moved: set[str] = set()
        kept: set[str] = set()
        for node in uses:
            parent = tree.parent(node)
            if type(parent) is not cst.Attribute or parent.value is not node:
                return frozenset()  # the object itself handed on (or read in a way not followed)
            outer = tree.parent(parent)
            if type(outer) is not cst.Call or outer.func is not parent:
                continue  # an attribute read (`self.saver.experiment_dir`)
            method = project.method(cls, parent.attr.value)
            if method is None or project.writes(method) is None:
                continue
            statement = self._own_statement(outer)
            if statement is None or self._why_not(outer, statement, method) is not None:
                kept.add(parent.attr.value)
            else:
                moved.add(parent.attr.value)
        return frozenset(moved - kept)

    def _stand_in_or_said(self, call: cst.Call, reason: Optional[str], what: str, done: str) -> None:
        """The object ``call`` builds, left on every process for ``reason`` (MGP322), or, with no reason, built on
        the main process only, behind a stand-in (``mgpu_runtime.main_process_only``, MGP135)."""
        if reason is not None:
            self.left(call, WRITTEN_BY_EVERY_PROCESS, f"{what}: not moved, {reason}")
            return
        if not self.rewrite_allowed(call, MAIN_PROCESS_OBJECT):
            return
        self.edits.replace(call, through_runtime("main_process_only"))
        self._stand_ins.add(call)
        self.edits.need_import(RUNTIME)
        self.rewrote(call, f"{what}: {done} ({RUNTIME}.main_process_only)", MAIN_PROCESS_OBJECT)

    def _built_once_and_copied(self, call: cst.Call, said: str) -> None:
        """An object of a project class whose construction only makes directories and keeps plain values (mean-
        teacher's ``RunContext(__file__, 0)``, the run's directories named by the clock), which every process reads:
        built on the main process, every process given its copy (``mgpu_runtime.main_process_value``)."""
        if main_process_caller(self.analysis, call) is not None or not self.rewrite_allowed(call):
            return
        self.edits.need_import(RUNTIME)
        self.edits.replace(call, through_runtime("main_process_value"))
        self.rewrote(call, f"{said}: built on the main process, copied to every process ({RUNTIME}.main_process_value)")

    def _stream_once(self, call: cst.Call, line: cst.Assign, said: str) -> None:
        """``sys.stdout = Logger(path)`` (open-reid's), an object that mirrors what is printed into a file it opens:
        set on the main process only, ``if mgpu_runtime.is_main_process(): sys.stdout = Logger(path)``, no process
        waiting for it. The other processes' stdout goes nowhere already (the runtime's ``MGPU_LOG=rank0``), so the
        file holds what the main process prints, as the original's held what its one process printed."""
        stream = self.analysis.code_of(line.targets[0].target)
        statement = self.analysis.tree.parent(line)
        if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1:
            self.left(call, WRITTEN_BY_EVERY_PROCESS, f"{said}: not moved, as `{stream}` is not set on a line of its own")
            return
        if main_process_caller(self.analysis, call) is not None or not self.rewrite_allowed(call):
            return  # only the main process sets it (once already), or a noqa comment keeps it
        self.edits.need_import(RUNTIME)
        self.edits.replace(statement, _on_the_main_process_alone)
        self.rewrote(call, f"{said}: `{stream}` set on the main process only")

    def _writing_method(self, project: Project, call: cst.Call) -> Optional[tuple[Found, Write]]:
        """``container.dump()`` where ``container`` holds an object of a project class whose ``dump`` writes."""
        if type(call.func) is not cst.Attribute or type(call.func.value) not in (cst.Name, cst.Attribute):
            return None
        values = self.analysis.values
        scope = values.scope_of(call)
        place = self.analysis.flow.place_of(call.func.value, scope)
        entered = self.analysis.loaders.with_items.get(place, []) if place is not None else []
        for value in [*values.of(call.func.value, scope), *(item for item, _ in entered)]:
            if value in self._stand_ins:
                return None  # built on the main process only, behind a stand-in (MGP135): its calls are once already
            made = self._class_of(value, call)
            if made is None:
                continue
            qualified = self.analysis.resolve(made)
            cls = project.find(qualified) if qualified and not qualified.startswith(("torch.", "builtins.")) else None
            if cls is None or not isinstance(cls.node, ast.ClassDef):
                continue
            if any(value is item for item, _ in entered) and not _enters_itself(project, cls):
                continue  # `with Timer(...) as block`: `block` is what its __enter__ returns, here not the object
            method = project.method(cls, call.func.attr.value)
            written = project.writes(method) if method is not None else None
            if method is not None and written is not None:
                return method, written
        return self._inherited_writer(project, call)

    def _made_by_a_method(self, project: Project, call: cst.Call) -> Optional[tuple[Found, Found, Write]]:
        """``context.create_train_log("training")`` (mean-teacher's), a method of an object of a project class
        that returns a new object of another (``return TrainLog(self.result_dir, name)``), one of whose methods
        writes (``TrainLog.save``: ``df.to_msgpack(path)``): the class it makes, that method, and its write. The
        object's class is read where the file's own function that holds it as a parameter is called
        (``main(RunContext(__file__, 0))``)."""
        if type(call.func) is not cst.Attribute or type(call.func.value) is not cst.Name:
            return None
        owner = self._parameter_class(call, call.func.value)
        method = project.method(owner, call.func.attr.value) if owner is not None else None
        if method is None or not isinstance(method.node, _FUNCTIONS):
            return None
        returned = [node.value for node in ast.walk(method.node) if isinstance(node, ast.Return)]
        made = None
        for value in returned:
            cls = project.resolve_in(method, value.func)[1] if isinstance(value, ast.Call) else None
            if cls is None or not isinstance(cls.node, ast.ClassDef) or (made is not None and made.node is not cls.node):
                return None
            made = cls
        if made is None:
            return None
        for statement in made.node.body:
            if isinstance(statement, _FUNCTIONS) and statement.name != "__init__":
                writing = Found(made.module, statement, made.seen_from)
                written = project.writes(writing)
                if written is not None:
                    return made, writing, written
        return None

    def _parameter_class(self, call: cst.Call, name: cst.Name) -> Optional[Found]:
        """The project class of the objects that every call in this file of ``call``'s function gives its
        parameter ``name`` (``def main(context)``, called as ``main(RunContext(__file__, 0))``), else None."""
        function = self.analysis.tree.function(call)
        if function is None:
            return None
        params = function.params
        positional = [*params.posonly_params, *params.params]
        index = next((i for i, param in enumerate(positional) if param.name.value == name.value), None)
        if index is None or type(self.analysis.tree.parent(function)) is not cst.Module:
            return None
        project = project_of(self.analysis.path)
        if self._calls_by_name is None:
            self._calls_by_name = {}
            for other in self.analysis.calls:
                if type(other.func) is cst.Name:
                    self._calls_by_name.setdefault(other.func.value, []).append(other)
        calls = self._calls_by_name.get(function.name.value, [])
        found = None
        for other in calls:
            given = next((arg.value for arg in other.args if arg.keyword is not None and arg.keyword.value == name.value), None)
            if given is None and len(other.args) > index and all(arg.keyword is None and not arg.star for arg in other.args[: index + 1]):
                given = other.args[index].value
            qualified = self.analysis.resolve(given.func) if type(given) is cst.Call else None
            cls = project.find(qualified) if project is not None and qualified and not qualified.startswith(("torch.", "builtins.")) else None
            if cls is None or not isinstance(cls.node, ast.ClassDef) or (found is not None and found.node is not cls.node):
                return None
            found = cls
        return found

    def _made_object_once(self, call: cst.Call, made: Found, writing: Found, written: Write) -> None:
        """The object a project method makes, one of whose methods writes, built on the main process only, behind
        a stand-in (``mgpu_runtime.main_process_only(context.create_train_log, "training")``), when the script
        only calls its methods for their effect; else said (MGP322)."""
        what = f"`{shorten(self.analysis.code_of(call.func), 32)}(...)` makes a `{made.name}` that writes ({writing.where.rpartition(':')[0]}:{written.line})"
        line = self.analysis.tree.parent(call)
        if self.options.style != RUNTIME_STYLE:
            reason: Optional[str] = "as --style torch has no runtime"
        elif type(line) is not cst.Assign or len(line.targets) != 1 or line.value is not call or type(line.targets[0].target) is not cst.Name:
            reason = "as it is not assigned to a name"
        else:
            found = blocker(self.analysis, line.targets[0].target, call)
            early = self._before_setup(call)
            reason = f"as {found}" if found is not None else f"as it runs before {RUNTIME}.setup() (line {early})" if early is not None else None
        if main_process_caller(self.analysis, call) is None:
            self._stand_in_or_said(call, reason, what, "made on the main process only")

    def _inherited_writer(self, project: Project, call: cst.Call) -> Optional[tuple[Found, Write]]:
        """``self.io.print_log(...)`` in a module that trains a model a project class holds (``Program.holds``),
        where ``self.io`` is an object of a project class that the holding class builds (st-gcn's
        ``self.io = torchlight.IO(...)`` in ``IO.init_environment()``) and this file never stores."""
        if type(call.func) is not cst.Attribute:
            return None
        method_name = call.func.attr.value
        owner = call.func.value
        if (
            not self.program.holds
            or type(owner) is not cst.Attribute
            or type(owner.value) is not cst.Name
            or owner.value.value != "self"
            or any(
                type(node.target) is cst.Attribute and node.target.attr.value == owner.attr.value
                for node in self.analysis.tree.nodes(cst.AssignTarget)
            )
        ):
            return None
        for holder in self.program.holds:
            cls = project.kept_on_self(holder, owner.attr.value)
            method = project.method(cls, method_name) if cls is not None else None
            written = project.writes(method) if method is not None else None
            if method is not None and written is not None:
                return method, written
        return None

    def _class_of(self, value: cst.BaseExpression, call: cst.Call) -> Optional[cst.BaseExpression]:
        """The class an object is made of: ``Container(...)``, also through the module methods that return the
        module (``WaveRNN(...).to(device)``), or the annotation of the parameter of ``call``'s function that holds it
        (WaveRNN's ``def voc_train_loop(paths, model: WaveRNN, ...)``); None when it does not show."""
        while (
            type(value) is cst.Call
            and type(value.func) is cst.Attribute
            and value.func.attr.value in MODULE_METHODS_RETURNING_SELF
            and type(value.func.value) is cst.Call
        ):
            value = value.func.value
        if type(value) is cst.Call:
            return value.func
        function = self.analysis.tree.function(call)
        if type(value) is not cst.Name or function is None:
            return None
        for param in (*function.params.posonly_params, *function.params.params, *function.params.kwonly_params):
            if param.name.value == value.value and param.annotation is not None:
                return param.annotation.annotation
        return None

    def _project_writer(self, project: Project, call: cst.Call) -> Optional[tuple[Found, Write]]:
        qualified = self.analysis.resolve(call.func)
        if not qualified or qualified.startswith(("torch.", "builtins.")):
            return None
        found = project.find(qualified)
        if found is None and "." in qualified:
            # A static or class method called through its class (yolact's ``SavePath.remove_interrupt(folder)``).
            owner, _, name = qualified.rpartition(".")
            cls = project.find(owner)
            if cls is None:
                # A method of an object a project module makes at module level (pytorch-playground's
                # ``misc.logger.init(logdir, 'train_log')``, its ``logger = Logger()``).
                cls = project.object_class(owner)
            found = project.method(cls, name) if cls is not None and isinstance(cls.node, ast.ClassDef) else None
        if found is None:
            return None
        written = project.writes(found)
        if written is not None and isinstance(found.node, _FUNCTIONS):
            # What it writes only under ``if compute_confusion_matrix:`` it does not write when this call gives
            # that parameter False (SCAN's ``hungarian_evaluate(..., compute_confusion_matrix=False)``).
            written = project.writes_unless(found, _switched_off(found.node, call))
        return (found, written) if written is not None else None

    def _own_statement(self, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
        """The line that is this call alone (``save_checkpoint(state, is_best)``), its result unused."""
        tree = self.analysis.tree
        expression = tree.parent(call)
        line = tree.parent(expression) if type(expression) is cst.Expr else None
        if type(line) is cst.SimpleStatementLine and len(line.body) == 1:
            return line
        return None

    def _only_statement_of_a_loop(self, statement: cst.SimpleStatementLine) -> Optional[cst.For]:
        """The ``for`` loop whose whole body is ``statement`` (flownet2's ``for argument, value in
        sorted(vars(args).items()): block.log2file(...)``), when the loop can run on the main process alone: its
        iterable only reads (names, attributes, literals, Python's own readers) and its names are read nowhere
        else. The loop is then made once, with one wait after it, not one for each line it writes."""
        tree = self.analysis.tree
        block = tree.parent(statement)
        loop = tree.parent(block) if type(block) is cst.IndentedBlock else None
        if type(loop) is not cst.For or loop.orelse is not None or loop.asynchronous is not None or len(loop.body.body) != 1:
            return None
        for node in contains(loop.iter, lambda n: type(n) is cst.Call):
            func = node.func
            if not (
                (type(func) is cst.Name and func.value in _READERS and self.analysis.resolve(func) in (None, f"builtins.{func.value}")
                 and func.value not in self.analysis.bindings.local)
                or (type(func) is cst.Attribute and func.attr.value in ("items", "keys", "values") and not node.args)
            ):
                return None
        if contains(loop.iter, lambda n: type(n) in (cst.Lambda, cst.NamedExpr, cst.Yield, cst.Await)):
            return None
        flow = self.analysis.flow
        line = self.analysis.position(loop)[0]
        for name in contains(loop.target, lambda n: type(n) is cst.Name):
            place = flow.place_of(name, flow.stores[name]) if name in flow.stores else None
            if place is None:
                return None
            for read, _, _ in flow.references(place):
                # read after the loop: the others would not have its last values
                if self.analysis.position(read)[0] > line and not any(ancestor is loop for ancestor in tree.ancestors(read)):
                    return None
        return loop

    def _runs_the_model(self, call: cst.Call, definition: Found) -> Optional[str]:
        """``path:line`` where a project function calls the wrapped model this call hands it (its parameter called,
        ``net(d)``), else None."""
        handed = self._handed_models(call, definition)
        for inner in ast.walk(definition.node):
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id in handed:
                return f"{definition.where.rpartition(':')[0]}:{inner.lineno}"
        return None

    def _handed_models(self, call: cst.Call, definition: Found) -> dict[str, int]:
        """The parameters of the project function ``definition`` that ``call`` gives the wrapped model, each with
        the index of its argument in ``call``."""
        node = definition.node
        if not isinstance(node, _FUNCTIONS):
            return {}
        models = self.analysis.models
        scope = self.analysis.values.scope_of(call)
        positional = [arg.arg for arg in [*node.args.posonlyargs, *node.args.args]]
        if positional and positional[0] in ("self", "cls") and type(call.func) is cst.Attribute:
            positional = positional[1:]
        handed = {}
        for index, arg in enumerate(call.args):
            if arg.star or not models.model_sites(arg.value, scope):
                continue
            if arg.keyword is not None:
                handed[arg.keyword.value] = index
            elif index < len(positional):
                handed[positional[index]] = index
        return handed

    def _evaluates_only(self, call: cst.Call, definition: Found) -> Optional[tuple[list[int], int]]:
        """For a project function that runs the wrapped model it is given, writes and trains nothing (no backward
        pass, no optimizer step): the indices of the model's arguments in ``call`` and the line that set the model
        in eval mode before it (``net.eval()`` before Face_Pytorch's ``getFeatureFromTorch(path, net, ...)``, in
        the caller's block or one around it), when it is in eval mode there; else None. In eval mode its forward
        is the plain module's row by row, whatever the devices DataParallel split the rows over."""
        handed = self._handed_models(call, definition)
        node = definition.node
        if not handed or not isinstance(node, _FUNCTIONS):
            return None
        if any(isinstance(inner, ast.Attribute) and inner.attr in _TRAINING_METHODS for inner in ast.walk(node)):
            return None
        codes = {self.analysis.code_of(call.args[index].value) for index in handed.values()}
        line = self._set_to_eval(call, codes)
        return (sorted(handed.values()), line) if line is not None else None

    def _set_to_eval(self, call: cst.Call, models: set[str]) -> Optional[int]:
        """The line of the last ``model.eval()`` (or ``model.train(False)``) of a model of ``models`` that runs
        before ``call``: in a statement before it in its block, or in a block around it; None when a
        ``model.train()`` comes after it, or none comes first."""
        tree = self.analysis.tree

        def switches(statement: cst.CSTNode) -> list[cst.Call]:
            return [
                switch
                for switch in contains(statement, lambda n: type(n) is cst.Call and type(n.func) is cst.Attribute)
                if switch.func.attr.value in ("eval", "train") and self.analysis.code_of(switch.func.value) in models
            ]

        node: cst.CSTNode = call
        for ancestor in tree.ancestors(call):
            if type(ancestor) in (cst.FunctionDef, cst.ClassDef):
                return None
            if type(ancestor) is not cst.IndentedBlock and type(ancestor) is not cst.Module:
                node = ancestor
                continue
            body: list[cst.CSTNode] = list(ancestor.body)
            place = body.index(node) if node in body else 0
            for statement in reversed(body[:place]):
                found = switches(statement)
                if found:
                    last = max(found, key=self.analysis.position)
                    assert type(last.func) is cst.Attribute  # (switches)
                    off = last.func.attr.value == "eval" or (
                        len(last.args) == 1 and type(last.args[0].value) is cst.Name and last.args[0].value.value == "False"
                    )
                    return self.analysis.position(last)[0] if off else None
            # Set before a loop around the call: a switch later in the loop's body holds from the next pass on.
            if type(tree.parent(ancestor)) in (cst.For, cst.While) and any(switches(later) for later in body[place + 1 :]):
                return None
            node = ancestor
        return None

    def _evaluated_unwrapped(
        self, call: cst.Call, statement: cst.SimpleStatementLine, what: str, where: str, indices: list[int], line: int
    ) -> None:
        """The evaluation on the main process only, given the model unwrapped (``mgpu_runtime.unwrap(net)``), the
        others waiting for it with no time limit; what it writes is written once, and is there for every process
        that reads it next."""

        def unwrapped(updated: cst.CSTNode) -> cst.FlattenSentinel:
            assert type(updated) is cst.SimpleStatementLine and type(updated.body[0]) is cst.Expr
            inner = updated.body[0].value
            assert type(inner) is cst.Call
            args = [
                arg.with_changes(value=runtime_call("unwrap", arg.value)) if index in indices else arg
                for index, arg in enumerate(inner.args)
            ]
            return _evaluated_on_the_main_process(updated.with_changes(body=[cst.Expr(inner.with_changes(args=args))]))

        self.edits.need_import(RUNTIME)
        self.edits.replace(statement, unwrapped)
        self.rewrote(
            call,
            f"{what} {where}, in eval mode (line {line}): on the main process only, the model unwrapped",
        )

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
# What a function that trains calls, or one that sets a model to train mode (an evaluation calls none of them).
_TRAINING_METHODS = frozenset({"backward", "step", "zero_grad", "train"})
# The streams a project object that writes may replace (``sys.stdout = Logger(path)``).
_STANDARD_STREAMS = frozenset({"sys.stdout", "sys.stderr"})
_MUTATORS = frozenset({"append", "extend", "update", "insert", "pop", "clear", "add", "remove", "setdefault"})


# Methods that load state into the object they are called on (``model.load_state_dict(...)``, a model's own
# ``load(path)``).
_LOADERS = frozenset({"load_state_dict", "load"})


# What a class whose objects are built on the main process and copied to the others may compute in its
# ``__init__`` (``_why_not_copied``): text, numbers and paths, the clock, the environment; nothing held open.
_PLAIN_CALLS = frozenset(
    {"str", "int", "float", "bool", "len", "round", "min", "max", "abs", "sorted", "list", "tuple", "dict",
     "datetime.datetime.now", "datetime.datetime.today", "datetime.date.today", "time.strftime", "time.time",
     "time.localtime", "os.getcwd", "os.getpid", "os.environ.get", "os.getenv", "socket.gethostname", "glob.glob",
     "os.listdir"}
)
_PLAIN_METHODS = TEXT_METHODS | {"get"}
# Methods that would make a copy of the object other than its attributes, or act when it is dropped.
_OWN_COPYING = frozenset({"__getstate__", "__setstate__", "__reduce__", "__reduce_ex__", "__copy__", "__deepcopy__", "__del__"})


def _why_not_copied(project: Project, cls: Found, init: Found, moved: frozenset[str] = frozenset()) -> Optional[str]:
    """Why an object of the project class ``cls`` cannot be built on the main process alone and copied, pickled,
    to the others (``mgpu_runtime.main_process_value``), or None when it can: the class derives from none, its
    construction makes directories (and no file), keeps plain values (text, numbers, paths, the clock, the
    directories ``glob`` finds), and otherwise only logs; no other method of it writes but those ``moved`` (every
    call of them goes to the main process), and none changes how it is copied."""
    assert isinstance(cls.node, ast.ClassDef)
    # `class Saver(object):`, Python 2's spelling of a class that derives from none
    bases = [base for base in cls.node.bases if not (isinstance(base, ast.Name) and base.id == "object")]
    if bases or cls.node.keywords:
        return f"`{cls.name}` derives from another class"
    if cls.node.decorator_list:
        return f"`{cls.name}` is decorated"
    for statement in cls.node.body:
        if not isinstance(statement, _FUNCTIONS) or statement.name == "__init__":
            continue
        if statement.name in _OWN_COPYING:
            return f"`{cls.name}` defines `{statement.name}`"
        written = project.writes(Found(cls.module, statement, cls.seen_from))
        if written is not None and statement.name not in moved:
            return f"its method `{statement.name}` writes too ({cls.where.rpartition(':')[0]}:{written.line})"
    if any(not written.directory for written in project.function_writes(init)):
        return "its construction writes files"
    assert isinstance(init.node, _FUNCTIONS)
    other = _more_than_plain(init.node.body, init.module)
    if other is not None:
        return f"its construction does more than make directories and keep values ({init.where.rpartition(':')[0]}:{other})"
    return None


def _returns_what_it_builds(function: ast.FunctionDef | ast.AsyncFunctionDef, lines: set[int]) -> bool:
    """Whether every ``return`` of ``function`` gives what a call on one of ``lines`` builds: the call itself, or a
    name the function assigns it to once."""
    returns = [node.value for node in ast.walk(function) if isinstance(node, ast.Return)]
    if not returns:
        return False
    for value in returns:
        if isinstance(value, ast.Name):
            value = stored_once(function, value.id)
        if not isinstance(value, ast.Call) or value.lineno not in lines:
            return False
    return True


def _more_than_plain(body: list[ast.stmt], module) -> Optional[int]:
    """The line of the first statement of a constructor's ``body`` that does more than keep a plain value, make a
    directory or log (``_why_not_copied``), or None."""
    for statement in body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # a docstring
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            call = statement.value
            qualified = module.qualified(call.func)
            if (
                changes_a_directory(call, qualified)
                or qualified in ("os.makedirs", "os.mkdir")
                or (isinstance(call.func, ast.Name) and call.func.id == "print" and "print" not in module.definitions)
                or (qualified or "").startswith("logging.")
                or (isinstance(call.func, ast.Attribute) and call.func.attr in LOGGING_METHODS)
            ) and _plain(call.args + [keyword.value for keyword in call.keywords], module):
                continue
            return statement.lineno
        if isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            if all(_plain_target(target) for target in targets) and statement.value is not None and _plain([statement.value], module):
                continue
            return statement.lineno
        if isinstance(statement, ast.If) and _plain([statement.test], module):
            inner = _more_than_plain(statement.body, module) or _more_than_plain(statement.orelse, module)
            if inner is None:
                continue
            return inner
        if isinstance(statement, ast.Pass):
            continue
        return statement.lineno
    return None


def _plain_target(target: ast.expr) -> bool:
    """A local name, or an attribute of ``self``."""
    if isinstance(target, ast.Name):
        return True
    return isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"


def _plain(values: list[ast.expr], module) -> bool:
    """Every call in ``values`` computes text, a number, a path or the clock (``_PLAIN_CALLS``, ``os.path``'s,
    the methods of text); no lambda, comprehension or ``await`` in them."""
    for value in values:
        for node in ast.walk(value):
            if isinstance(node, (ast.Lambda, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)):
                return False
            if not isinstance(node, ast.Call):
                continue
            qualified = module.qualified(node.func)
            if qualified is None and isinstance(node.func, ast.Name) and node.func.id not in module.definitions:
                qualified = node.func.id  # a builtin (`str(...)`), which the module neither defines nor imports
            if qualified in _PLAIN_CALLS or (qualified or "").startswith("os.path."):
                continue
            if qualified is None and isinstance(node.func, ast.Attribute) and node.func.attr in _PLAIN_METHODS:
                continue
            return False
    return True


def _loads_into_its_arguments(function: ast.AST) -> Optional[str]:
    """The first call by which a function loads state into an object it is given (``optimizer.load_state_dict(...)``,
    ``model.load(path)`` on its parameters), else None."""
    if not isinstance(function, _FUNCTIONS):
        return None
    arguments = function.args
    given = {arg.arg for arg in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _LOADERS:
            owner = node.func.value
            while isinstance(owner, ast.Attribute):
                owner = owner.value
            if isinstance(owner, ast.Name) and owner.id in given:
                return ast.unparse(node)
    return None


def _read_elsewhere(method: Found, source: str) -> Optional[set[str]]:
    """The attributes of its object that the class of ``method`` reads in its other methods, and those the calling
    file reads of any object (``.name`` in its text); None when the class does not show."""
    for definition in method.module.definitions.values():
        if isinstance(definition, ast.ClassDef) and any(item is method.node for item in definition.body):
            read = {
                node.attr
                for item in definition.body
                if item is not method.node
                for node in ast.walk(item)
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
            }
            return read | set(re.findall(r"\.(\w+)", source))
    return None


def _changes_its_object(method: ast.FunctionDef | ast.AsyncFunctionDef, read: Optional[set[str]] = None) -> Optional[str]:
    """What a method assigns or changes in its own object (``self.history.append(...)``, ``self.step += 1``):
    moved onto the main process, it would leave the other processes' objects behind. An attribute it assigns
    that nothing else reads (``read``: what the class's other methods and the calling file read; torchlight's
    ``save_arg`` keeps ``self.session_file`` for itself) leaves nothing behind."""
    if not method.args.args:
        return None
    me = method.args.args[0].arg
    for node in ast.walk(method):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            while isinstance(target, (ast.Subscript, ast.Attribute)) and not (
                isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == me
            ):
                target = target.value
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == me:
                if isinstance(node, ast.Assign) and read is not None and target.attr not in read:
                    continue  # assigned, never read but by the method itself, on the main process
                return ast.unparse(node).splitlines()[0][:40]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MUTATORS
            and isinstance(node.func.value, ast.Attribute)
            and isinstance(node.func.value.value, ast.Name)
            and node.func.value.value.id == me
        ):
            return ast.unparse(node)[:40]
    return None


def _on_the_main_process(updated: cst.CSTNode) -> cst.FlattenSentinel:
    # the replaced node is a statement line (_own_statement), or the loop it is all of (_only_statement_of_a_loop)
    assert type(updated) is cst.SimpleStatementLine or type(updated) is cst.For
    return cst.FlattenSentinel(on_the_main_process([cast(cst.BaseStatement, updated)]))


def _evaluated_on_the_main_process(updated: cst.CSTNode) -> cst.FlattenSentinel:
    """The statement under ``if mgpu_runtime.is_main_process():``, then the others wait for it with no time
    limit (``mgpu_runtime.wait_for_main_process()``): an evaluation may outlast a barrier's MGPU_TIMEOUT."""
    assert type(updated) is cst.SimpleStatementLine  # the replaced node is a statement line (_evaluated_once)
    return cst.FlattenSentinel(on_the_main_process([updated], waiter="wait_for_main_process"))


def _on_the_main_process_alone(updated: cst.CSTNode) -> cst.FlattenSentinel:
    """The statement under ``if mgpu_runtime.is_main_process():``, no process waiting for it."""
    assert type(updated) is cst.SimpleStatementLine  # the replaced node is a statement line (_stream_once)
    return cst.FlattenSentinel(on_the_main_process([updated], wait=False))


def _stored(tree, name: cst.Name) -> bool:
    """A name an assignment binds (``x = ...``, ``x, y = ...``), not one it reads."""
    for ancestor in tree.ancestors(name):
        if type(ancestor) is cst.AssignTarget:
            return True
        if type(ancestor) not in (cst.Element, cst.Tuple, cst.List):
            return False
    return False


_FALSY = frozenset({"False", "None", "0"})


def _switched_off(function: ast.FunctionDef | ast.AsyncFunctionDef, call: cst.Call) -> frozenset[str]:
    """The parameters of ``function`` this call gives a false constant (``False``, ``None``, ``0``), by keyword,
    by position or by their default; nothing for a call that spreads ``*args`` or ``**kwargs``."""
    if any(arg.star for arg in call.args):
        return frozenset()
    parameters = [*function.args.posonlyargs, *function.args.args]
    defaults = dict(zip([p.arg for p in parameters[len(parameters) - len(function.args.defaults) :]], function.args.defaults))
    defaults.update((p.arg, d) for p, d in zip(function.args.kwonlyargs, function.args.kw_defaults) if d is not None)
    given: dict[str, str] = {}
    positional = [arg for arg in call.args if arg.keyword is None]
    for parameter, arg in zip(parameters, positional):
        given[parameter.arg] = _constant(arg.value)
    for arg in call.args:
        if arg.keyword is not None:
            given[arg.keyword.value] = _constant(arg.value)
    off = set()
    for name in [p.arg for p in parameters] + [p.arg for p in function.args.kwonlyargs]:
        if name in given:
            value = given[name]
        elif name in defaults:
            default = defaults[name]
            value = repr(default.value) if isinstance(default, ast.Constant) else ""
        else:
            continue
        if value in _FALSY:
            off.add(name)
    return frozenset(off)


def _constant(value: cst.BaseExpression) -> str:
    if type(value) is cst.Name and value.value in ("False", "None", "True"):
        return value.value
    if type(value) is cst.Integer:
        return value.value
    return ""


def _entered_as(parent: Optional[cst.CSTNode], call: cst.Call) -> Optional[cst.Name]:
    """The name a ``with`` statement binds to what ``call`` builds (``with Logger(path) as logger:``): the object's
    ``__enter__`` result, which the stand-in's ``with`` gives back on the main process (itself elsewhere)."""
    if type(parent) is not cst.WithItem or parent.item is not call or parent.asname is None:
        return None
    name = parent.asname.name
    return name if type(name) is cst.Name else None


def _is_none(node: cst.CSTNode) -> bool:
    return type(node) is cst.Name and node.value == "None"


# Python's own functions that only read what they are given (the iterable of a loop made once: no process misses
# anything the others did by skipping it).
_READERS = frozenset({"sorted", "list", "tuple", "vars", "enumerate", "range", "zip", "reversed", "len", "dict", "str"})


def _enters_itself(project: Project, cls: Found) -> bool:
    """Whether ``with cls(...) as name`` binds the object itself: every return of its ``__enter__`` is ``self``
    (flownet2's ``TimerBlock``)."""
    method = project.method(cls, "__enter__")
    if method is None or not isinstance(method.node, _FUNCTIONS) or not method.node.args.args:
        return False
    own = method.node.args.args[0].arg
    returned = [node.value for node in ast.walk(method.node) if isinstance(node, ast.Return)]
    return bool(returned) and all(isinstance(value, ast.Name) and value.id == own for value in returned)
