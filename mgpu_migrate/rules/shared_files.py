"""MGP134, MGP261: files the script writes itself, written once under DDP as the original wrote them (``--to ddp``)."""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.guards import main_process_caller, under_main_process_block
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.analysis.writers import LIBRARY_WRITERS, LIBRARY_WRITING_METHODS, SHELL_COMMANDS
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.save_reading import CHECKPOINT_SAVE, TORCH_SAVE, save_reading
from mgpu_migrate.rules.syntax import RUNTIME, argument, opens_for_writing, through_runtime

_RACE = "all write the file at once"
# What a test around a write may ask of the disk, which the main process's write then changes.
_FILE_QUERIES = frozenset(f"os.path.{name}" for name in ("exists", "lexists", "isfile", "isdir", "getsize"))
# The library functions that write a file they are given the path of (a statement of its own: nothing returned).
_WRITERS = LIBRARY_WRITERS | SHELL_COMMANDS
# Methods that write a file: a figure's, a path's, a data frame's; ``.save(path)`` of a PIL image (below).
_WRITING_METHODS = LIBRARY_WRITING_METHODS
_PIL_MAKERS = ("PIL.Image.", "Image.")
_MEDIA_FILE = re.compile(r"\.(png|jpe?g|gif|bmp|tiff?|webp|wav|mp3|flac|mp4|avi)$", re.IGNORECASE)
# What a ``with open(...) as f:`` block may do with ``f`` so that a stand-in can take the file's place: call its
# methods for their effect, or hand it to a writer that only calls its ``write``.
_FILE_WRITERS = frozenset({"json.dump", "yaml.dump", "yaml.safe_dump", "pickle.dump", "print"})
# A csv writer of an opened file writes through the file's ``write`` only (the main process's stand-in takes it).
_CSV_WRITERS = frozenset({"csv.writer", "csv.DictWriter"})
# What a file object kept in a name may be used for, each a statement of its own, for its open to move.
_FILE_METHODS = frozenset({"write", "writelines", "flush", "close"})
_CSV_WRITING_METHODS = frozenset({"writerow", "writerows", "writeheader"})


FILE_WRITTEN_BY_EVERY_PROCESS = Review(
    "MGP261",
    name="file-written-by-every-process",
    summary="a file written by every process: duplicated lines, or writers racing",
    why=(
        "A file is written by every process: all write it at once, so one process's content wins, lines are "
        "duplicated, or it comes out garbled. The tool moves a writer's call that is a statement of its own, and a "
        "`with open(path, 'w')` block that only writes to the file (itself, or through a `csv.writer` of it), and a "
        "file kept in a name that is only written to and closed, onto the main process (MGP134); this one is "
        "another shape (the file object kept in a name, a result that is used, a function that only the main "
        "process calls, or `--style torch`, which has no runtime)."
    ),
    todo=(
        "Unless each process writes a file of its own, do it under `if mgpu_runtime.is_main_process():`, writing "
        "values computed before the block, on every process (the runtime's losses and metrics are the global "
        "batch's; computed inside the block, a reduction of the batch would wait for processes that never come)."
    ),
)


class SharedFiles(Rule):
    """
    ## What it does
    In a file that becomes a distributed program, makes the files the script writes itself be written once, by
    the main process, as the original's one process wrote them:

    - a call of a library writer that is a statement of its own (``np.save``, torchvision's ``save_image``,
      ``cv2.imwrite``, imageio's, ``plt.savefig``, a PIL image's ``.save(path)``, ``Path.write_text``, a
      ``shutil.copy`` of the run's config into its folder, an ``os.remove`` of an old checkpoint) becomes
      ``mgpu_runtime.on_main_process(writer, ...)``: every process computes the arguments as before, their global
      values (the batch's, the model's outputs) are made whole on every process, the main process writes, and
      the others wait for it; a file-system query in an ``if`` around it (``if not os.path.exists(dst):``) becomes
      the main process's reading (``mgpu_runtime.main_process_value(os.path.exists, dst)``), so every process
      takes the branch the main one takes, and none skips the wait for a file the main process just wrote;
    - ``with open(path, "w") as f:`` (``"a"``, ``"x"``, binary too) whose block only writes to ``f`` (its methods,
      ``json.dump(x, f)``, ``print(..., file=f)``) becomes ``with mgpu_runtime.main_process_only(open, path, "w") as
      f:``: the file is opened and written by the main process only, the block still runs on every process, and
      its end waits for the main one, so a process that reads the file next finds it complete.

    Any other write (a file object kept in a name, a result that is used) is reported (MGP261). Checkpoints
    written with ``torch.save`` are MGP123's.

    ## Why is this bad?
    Every process runs the script, so every process writes the file: appended logs get one copy of each
    line per process, and files written with ``"w"`` are written by all at once, so one process's content
    wins or the result is garbled.

    ## Example
    ```python
    with open("log.txt", "a") as log:
        log.write(f"{epoch} {loss.item()}\\n")
    save_image(grid, "samples.png")
    ```

    ## Use instead
    ```python
    with mgpu_runtime.main_process_only(open, "log.txt", "a") as log:
        log.write(f"{epoch} {loss.item()}\\n")
    mgpu_runtime.on_main_process(save_image, grid, "samples.png")
    ```

    ## Fix safety
    The values written are computed where they were, by every process (a loss, a metric of the batch: the
    runtime's global values, whose reductions every process must join); only the writing moves. A write under a
    main-process block stays as it is; one in a function that only the main process calls, under ``--style
    torch`` (no runtime), or of another shape is reported (MGP261).
    """

    CODE = Rewrite("MGP134")
    PHASE = PROGRAM
    USES = ("values",)
    REVIEW_CODES = (FILE_WRITTEN_BY_EVERY_PROCESS,)
    DESCRIPTION = "files the script writes itself written once, by the main process"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import os
            import torch
            import torch.nn as nn
            model = nn.DataParallel(model)
            for epoch in range(epochs):
                torch.save(model.state_dict(), f'ckpt_{epoch}.pth')
                if epoch > 0:
                    os.remove(f'ckpt_{epoch - 1}.pth')
            """,
            """
            import os
            import torch
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            for epoch in range(epochs):
                torch.save(model.state_dict(), f'ckpt_{epoch}.pth')
                if epoch > 0:
                    mgpu_runtime.on_main_process(os.remove, f'ckpt_{epoch - 1}.pth')
            """,
            DDP,
            ("MGP101", "MGP134"),
            line=8,
            name="an old checkpoint removed once: by every process, all but one would fail to find it",
        ),
        Example(
            """
            import os
            import shutil
            import torch.nn as nn
            model = nn.DataParallel(model)
            if not os.path.exists(os.path.join(log_dir, 'config.yaml')):
                shutil.copy('config.yaml', log_dir)
            """,
            """
            import os
            import shutil
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            if not mgpu_runtime.main_process_value(os.path.exists, os.path.join(log_dir, 'config.yaml')):
                mgpu_runtime.on_main_process(shutil.copy, 'config.yaml', log_dir)
            """,
            DDP,
            ("MGP101", "MGP134"),
            message="its `if` reads the disk there; every process waits",
            line=6,
            name="a process that asked the disk after the main process copied would skip the copy's wait",
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            with open('log.txt', 'a') as log:
                log.write('started')
            """,
            """
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            with mgpu_runtime.main_process_only(open, 'log.txt', 'a') as log:
                log.write('started')
            """,
            DDP,
            ("MGP101", "MGP134"),
            message="`open('log.txt', 'a')`: opened and written on the main process only",
            line=3,
        ),
        Example(
            """
            import csv
            import os
            import torch.nn as nn
            model = nn.DataParallel(model)
            if not os.path.exists('log.csv'):
                with open('log.csv', 'w') as logfile:
                    logwriter = csv.writer(logfile, delimiter=',')
                    logwriter.writerow(['epoch', 'loss'])
            """,
            """
            import csv
            import os
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            if not mgpu_runtime.main_process_value(os.path.exists, 'log.csv'):
                with mgpu_runtime.main_process_only(open, 'log.csv', 'w') as logfile:
                    logwriter = csv.writer(logfile, delimiter=',')
                    logwriter.writerow(['epoch', 'loss'])
            """,
            DDP,
            ("MGP101", "MGP134"),
            message="its `if` reads the disk there; the block's end waits for it",
            line=6,
            name="a csv log's header, written through a csv writer when the file is not there yet (mixup-cifar10)",
        ),
        Example(
            """
            import torch.nn as nn
            from torchvision.utils import save_image
            model = nn.DataParallel(model)
            for x in loader:
                save_image(model(x), 'samples.png', nrow=4)  # the last batch's
            """,
            """
            from torchvision.utils import save_image
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            for x in loader:
                mgpu_runtime.on_main_process(save_image, model(x), 'samples.png', nrow=4)  # the last batch's
            """,
            DDP,
            ("MGP101", "MGP134"),
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            log = open('log_dataset.txt', 'a')
            log.write(dataset_log)
            log.close()
            """,
            """
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            log = mgpu_runtime.main_process_only(open, 'log_dataset.txt', 'a')
            log.write(dataset_log)
            log.close()
            """,
            DDP,
            ("MGP101", "MGP134"),
            message="opened and written on the main process only (mgpu_runtime.main_process_only); its writes too",
            line=3,
            name="a file object kept in a name that is only written to, flushed and closed (deep-text-recognition)",
        ),
        Example(
            """
            import sys
            import torch.nn as nn
            model = nn.DataParallel(model)
            log = open('log.txt', 'w')
            sys.stdout = log
            """,
            """
            import sys
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            log = open('log.txt', 'w')
            sys.stdout = log
            """,
            DDP,
            ("MGP101", "MGP261"),
            message="not moved: kept in `log` after the statement",
            name="a file object kept in a name and used otherwise is reported",
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            with open('data.txt') as f:
                f.read()
            """,
            """
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            with open('data.txt') as f:
                f.read()
            """,
            DDP,
            ("MGP101",),
        ),
    )

    def apply(self) -> None:
        if not self.program.runs_distributed:
            return
        self._queries_read: set[int] = set()  # the disk queries already read on the main process (``_read_on_main``)
        for call in self.analysis.calls:
            how = self._writes(call)
            if how is None or under_main_process_block(self.analysis, call) or self._checkpoint_file(call):
                continue
            if self._copies_a_checkpoint(call) or self._goes_with_a_save(call):
                continue
            reason = self._why_not(call)
            if reason is None and self.rewrite_allowed(call):
                self._once(call)
            elif reason is not None:
                said = f"runs on every process ({how}); not moved: {reason}"
                code = shorten(self.analysis.code_of(call), 40)
                if len(code) + len(said) + 3 > 160:  # a long command: its function's name says enough
                    code = f"{shorten(self.analysis.code_of(call.func), 30)}(...)"
                self.left(call, FILE_WRITTEN_BY_EVERY_PROCESS, f"`{code}` {said}")

    # -- what is written ---------------------------------------------------------------------------------
    def _opens_for_writing(self, call: cst.Call) -> Optional[str]:
        """The mode of ``open(path, mode)`` when it writes (``w``, ``a``, ``x``)."""
        return opens_for_writing(self.analysis, call)

    def _writes(self, call: cst.Call) -> Optional[str]:
        mode = self._opens_for_writing(call)
        if mode is not None:
            return "each appends its own copy of every line" if "a" in mode else _RACE
        if self._is_writer(call):
            return _RACE
        return None

    def _is_writer(self, call: cst.Call) -> bool:
        qualified = self.analysis.resolve(call.func)
        if qualified in _WRITERS:
            return True
        if type(call.func) is not cst.Attribute or (qualified is not None and not qualified.startswith(_PIL_MAKERS)):
            return False
        method = call.func.attr.value
        if method in _WRITING_METHODS:
            return True
        return method == "save" and (self._pil_image(call.func.value, call) or self._media_path(call))

    def _pil_image(self, receiver: cst.BaseExpression, call: cst.Call) -> bool:
        """A value made by PIL (``Image.fromarray(...)``, ``Image.open(...)``), also an item of such a list."""
        while type(receiver) is cst.Subscript:
            receiver = receiver.value
        values = self.analysis.values
        return any(
            type(value) is cst.Call and (self.analysis.resolve(value.func) or "").startswith("PIL.Image.")
            for value in values.of(receiver, values.scope_of(call))
        )

    def _media_path(self, call: cst.Call) -> bool:
        """``x.save(os.path.join(d, "movie.gif"), ...)``: the path it is given names an image, a sound or a video."""
        if not call.args or call.args[0].keyword is not None:
            return False
        return any(
            isinstance(text.evaluated_value, str) and _MEDIA_FILE.search(text.evaluated_value)
            for text in contains(call.args[0].value, lambda n: type(n) is cst.SimpleString)
        )

    def _checkpoint_file(self, call: cst.Call) -> bool:
        """``with open(path, "wb") as f: torch.save(obj, f)``: MGP123 reports that save (MGP240). A save of
        another file inside the block (a best model saved while a log opened for appending is written) does not
        make the opened file a checkpoint: that file is still written by every process."""
        item = self.analysis.tree.parent(call)
        block = self.analysis.tree.parent(item) if type(item) is cst.WithItem else None
        if type(block) is not cst.With or type(item) is not cst.WithItem:
            return False
        bound = item.asname.name if item.asname is not None else None
        if type(bound) is not cst.Name:
            return False
        for inner in contains(block.body, lambda node: type(node) is cst.Call):
            if self.analysis.resolve(inner.func) != "torch.save":
                continue
            target = argument(inner, "f", 1)
            if target is not None and type(target.value) is cst.Name and target.value.value == bound.value:
                return True
        return False

    def _goes_with_a_save(self, call: cst.Call) -> bool:
        """A file written between a ``torch.save`` and the move or copy of its file (CondenseNet's
        ``save_checkpoint``): MGP123 puts the save, that file and the move on the main process together."""
        tree = self.analysis.tree
        statement = next((node for node in tree.ancestors(call) if type(node) is cst.With), None)
        block = tree.parent(statement) if statement is not None else None
        if statement is None or block is None or tree.parent(call) is not statement.items[0]:
            return False
        reading = save_reading(self.analysis)
        for save in contains(block, lambda node: type(node) is cst.Call and self.analysis.resolve(node.func) == TORCH_SAVE):
            moved = reading.save_and_move(save)
            if moved is not None and statement in moved[1] and not self.analysis.silenced(save, CHECKPOINT_SAVE.code):
                return True
        return False

    def _copies_a_checkpoint(self, call: cst.Call) -> bool:
        """A copy of the file a ``torch.save`` of its function wrote (``if is_best: shutil.copyfile(filename,
        ...)``): MGP123 moves the save and the copy together."""
        analysis = self.analysis
        if not (analysis.resolve(call.func) or "").startswith("shutil.") or not call.args:
            return False
        copied = analysis.code_of(call.args[0].value)
        function = analysis.tree.function(call)
        for inner in contains(function if function is not None else analysis.module, lambda node: type(node) is cst.Call):
            saved = argument(inner, "f", 1) if analysis.resolve(inner.func) == "torch.save" else None
            if saved is not None and analysis.code_of(saved.value) == copied:
                return True
        return False

    # -- moved, or why not -------------------------------------------------------------------------------
    def _why_not(self, call: cst.Call) -> Optional[str]:
        if self.options.style != RUNTIME_STYLE:
            return "--style torch has no runtime to write on the main process with"
        caller = main_process_caller(self.analysis, call)
        if caller is not None:
            return f"its function is called on the main process only at line {self.analysis.position(caller)[0]}"
        tree = self.analysis.tree
        parent = tree.parent(call)
        if self._opens_for_writing(call) is not None:
            if type(parent) is not cst.WithItem:
                return self._kept_otherwise(call, parent)
            block = tree.parent(parent)
            assert type(block) is cst.With
            asname = parent.asname.name if parent.asname is not None else None
            if asname is not None and type(asname) is not cst.Name:
                return "bound to more than a name"
            return self._other_use(block, asname.value) if asname is not None else None
        if type(parent) is not cst.Expr:
            return "what it returns is used"
        return None

    def _kept_otherwise(self, call: cst.Call, parent: Optional[cst.CSTNode]) -> Optional[str]:
        """``log = open(path, 'a')`` (deep-text-recognition's dataset log): movable where the name is bound once in
        its function and every use writes to the file, flushes or closes it, each a statement of its own; else why
        not."""
        if type(parent) is not cst.Assign or len(parent.targets) != 1 or type(parent.targets[0].target) is not cst.Name:
            return self._kept(call, parent)
        name = parent.targets[0].target.value
        tree = self.analysis.tree
        function = tree.function(call)
        scope: cst.CSTNode = function if function is not None else self.analysis.module
        bindings = [
            target
            for target in contains(scope, lambda n: type(n) is cst.AssignTarget, into_functions=True)
            if type(target.target) is cst.Name and target.target.value == name
        ]
        if len(bindings) != 1:
            return self._kept(call, parent)
        for use in contains(scope, lambda n: type(n) is cst.Name and n.value == name, into_functions=True):
            if use is parent.targets[0].target or type(tree.parent(use)) is cst.AsName:
                # A `with open(...) as log:` of the same name binds another file object, whose uses are read too.
                continue
            if not self._writes_to(use, _FILE_METHODS):
                return self._kept(call, parent)
        return None

    def _kept(self, call: cst.Call, parent: Optional[cst.CSTNode]) -> str:
        if type(parent) is cst.Assign and len(parent.targets) == 1:
            return f"kept in `{shorten(self.analysis.code_of(parent.targets[0].target), 30)}` after the statement"
        return "opened by every process where it is used"

    def _other_use(self, block: cst.With, name: str) -> Optional[str]:
        """What the block does with the file ``name`` other than writing to it, if anything. A csv writer made of it
        (``w = csv.writer(f)``) writes to it too, when the block only calls its writing methods."""
        writers = self._csv_writers(block, name)
        for use in contains(block.body, lambda n: type(n) is cst.Name and n.value in (name, *writers)):
            if use.value in writers:
                if self._method_statement(use, _CSV_WRITING_METHODS) or self._bound_by(use, writers[use.value]):
                    continue
                line = self.analysis.position(use)[0]
                return f"the block uses `{use.value}` at line {line} other than to write rows"
            if any(self._bound_by(use, made) for made in writers.values()) or self._writes_to(use):
                continue
            line = self.analysis.position(use)[0]
            return f"the block uses `{name}` at line {line} other than by writing to it"
        return None

    def _writes_to(self, use: cst.Name, methods: Optional[frozenset[str]] = None) -> bool:
        """The file ``use`` names is written to there: a method of it called as a statement of its own (one of
        ``methods``, when given), or the file handed to a writer (``json.dump(x, f)``, ``print(..., file=f)``) as one."""
        if self._method_statement(use, methods):
            return True
        tree = self.analysis.tree
        argument = tree.parent(use)
        call = tree.parent(argument) if type(argument) is cst.Arg else None
        if type(call) is not cst.Call or type(tree.parent(call)) is not cst.Expr:
            return False
        named = call.func.value if type(call.func) is cst.Name else None
        return self.analysis.resolve(call.func) in _FILE_WRITERS or named == "print"

    def _method_statement(self, use: cst.Name, methods: Optional[frozenset[str]]) -> bool:
        """``use.METHOD(...)`` as a statement of its own, METHOD one of ``methods`` (any, when None)."""
        tree = self.analysis.tree
        method = tree.parent(use)
        if type(method) is not cst.Attribute or method.value is not use:
            return False
        if methods is not None and method.attr.value not in methods:
            return False
        call = tree.parent(method)
        return type(call) is cst.Call and call.func is method and type(tree.parent(call)) is cst.Expr

    def _csv_writers(self, block: cst.With, name: str) -> dict[str, cst.Assign]:
        """The names the block binds, once each, to ``csv.writer(name, ...)`` or ``csv.DictWriter(name, ...)``: the
        file is their first argument, and nothing else of the statement uses it."""
        bound: dict[str, list[cst.Assign]] = {}
        for statement in contains(block.body, lambda n: type(n) is cst.Assign):
            for target in statement.targets:
                if type(target.target) is cst.Name:
                    bound.setdefault(target.target.value, []).append(statement)
        writers = {}
        for target, statements in bound.items():
            statement = statements[0]
            value = statement.value
            if len(statements) != 1 or len(statement.targets) != 1 or type(value) is not cst.Call or not value.args:
                continue
            if self.analysis.resolve(value.func) not in _CSV_WRITERS or value.args[0].keyword is not None:
                continue
            first = value.args[0].value
            others = [arg.value for arg in value.args[1:]]
            handed_again = any(
                True for other in others for _ in contains(other, lambda n: type(n) is cst.Name and n.value == name)
            )
            if type(first) is cst.Name and first.value == name and not handed_again:
                writers[target] = statement
        return writers

    def _bound_by(self, use: cst.Name, statement: cst.Assign) -> bool:
        """``use`` is in ``statement`` (the writer's own binding, or the file handed to it)."""
        return any(node is use for node in contains(statement, lambda n: type(n) is cst.Name))

    def _once(self, call: cst.Call) -> None:
        self.edits.need_import(RUNTIME)
        mode = self._opens_for_writing(call)
        if mode is not None:
            self.edits.replace(call, through_runtime("main_process_only"))
            # `if not os.path.exists(log): with open(log, "w")`: a process that read the disk after the main process
            # made the file would skip the block, and the wait at its end (mixup-cifar10's csv log header).
            looked = self._looks_at_files(call)
            self._read_on_main(looked)
            self.rewrote(
                call,
                f"`{shorten(self.analysis.code_of(call), 60)}`: "
                + ("written" if looked else "opened and written")
                + f" on the main process only ({RUNTIME}.main_process_only); "
                + ("its `if` reads the disk there; " if looked else "")
                + ("the block's end waits for it" if type(self.analysis.tree.parent(call)) is cst.WithItem else "its writes too"),
            )
            return
        self.edits.replace(call, through_runtime("on_main_process"))
        looked = self._looks_at_files(call)
        self._read_on_main(looked)
        self.rewrote(
            call,
            f"`{shorten(self.analysis.code_of(call.func), 40)}(...)` writes on the main process only ({RUNTIME}.on_main_process), "
            + ("its `if` reads the disk there; every process waits" if looked else "given the whole values; every process waits"),
        )

    def _read_on_main(self, queries: list[cst.Call]) -> None:
        """Each disk query read by the main process, once: several writes under one ``if`` share its test
        (Person_reID's three ``os.system`` calls under ``if not os.path.isdir(...)``)."""
        for query in queries:
            if id(query) not in self._queries_read:
                self._queries_read.add(id(query))
                self.edits.replace(query, through_runtime("main_process_value"))

    def _looks_at_files(self, call: cst.Call) -> list[cst.Call]:
        """The file-system queries (``os.path.exists(...)``) in the tests of the ``if`` statements around a write, in
        its function: each process would read the disk at its own time, and one that runs after the main process
        wrote (run.py's ``if not os.path.exists(...): copy(config, log_dir)``) would skip the write, and the wait
        the others hold for it."""
        tree = self.analysis.tree
        function = tree.function(call)
        found: list[cst.Call] = []
        for ancestor in tree.ancestors(call):
            if ancestor is function:
                break
            if type(ancestor) is cst.If:
                found.extend(
                    query
                    for query in contains(ancestor.test, lambda node: type(node) is cst.Call)
                    if self.analysis.resolve(query.func) in _FILE_QUERIES
                )
        return found
