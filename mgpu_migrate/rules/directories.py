"""MGP133, MGP335: directories made and deleted once under DDP, as the original did (``--to ddp``)."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.guards import main_process_caller, under_main_process_block
from mgpu_migrate.analysis.project import EXISTING_CAUGHT
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, keyword, on_the_main_process, with_keyword

# The checks of a path the original made sure of before making it, and the calls that make or delete one.
_EXISTS = frozenset({"os.path.exists", "os.path.isdir", "os.path.lexists"})
_PATH_CHECKS = frozenset({"exists", "is_dir"})
_MAKERS = frozenset({"os.makedirs", "os.mkdir"})
_REMOVERS = frozenset({"shutil.rmtree", "os.rmdir", "os.removedirs"})

DIRECTORY_ON_EVERY_PROCESS = Review(
    "MGP335",
    name="directory-changed-on-every-process",
    summary="a directory made or deleted by every process, where the tool cannot move it to the main process",
    why=(
        "Every process makes or deletes this directory at about the same moment: `os.makedirs(d)` fails with "
        "FileExistsError on all but the first, `shutil.rmtree(d)` deletes what another process has just made "
        "or written there, or fails on a file that is already gone. The tool moves such a statement onto the "
        "main process, then makes every process wait (MGP133), unless it sits in the loop over the batches (a "
        "wait each step), under a condition each process judges from the disk, in a function called on the "
        "main process only (the others would never come to the wait), or under `--style torch`."
    ),
    todo=(
        "Make the directory once, before the loop, under `if mgpu_runtime.is_main_process():` followed by "
        "`mgpu_runtime.barrier()`; or use `os.makedirs(d, exist_ok=True)` where no process deletes it."
    ),
)


class DirectoriesOnce(Rule):
    """
    ## What it does
    In a file that becomes a distributed program, makes the directories the script makes and deletes behave
    as in the original's one process:

    - a check-then-create, ``if not os.path.exists(d): os.makedirs(d)`` (``os.path.isdir``,
      ``Path.exists()`` / ``Path.mkdir()`` alike), becomes ``os.makedirs(d, exist_ok=True)`` (or
      ``p.mkdir(..., exist_ok=True)``), which means the same in one process; under further conditions (``if
      output_dir and not os.path.exists(output_dir):``) the ``if`` stays and the making takes ``exist_ok=True``;
    - a reset, ``shutil.rmtree(d)`` (under ``if os.path.exists(d):`` or not) and the ``os.makedirs(d)`` right
      after it, a ``os.makedirs(d)`` or ``os.mkdir(d)`` with no check, and a check-then-create with
      ``os.mkdir`` (which has no ``exist_ok``), go under ``if mgpu_runtime.is_main_process():``, and every
      process waits for them (``mgpu_runtime.barrier()``).

    Where the wait is not safe it reports the site instead (MGP335).

    ## Why is this bad?
    Every process runs the script and reaches the same statement at about the same moment. Between one
    process's check and its ``os.makedirs``, another makes the directory, and the first fails with
    FileExistsError (a real script right after its set-up: 18 to 55 failures in 100 to 300 runs). A reset run
    by every process deletes what another has just made or written there, or fails on what is already gone.

    ## Example
    ```python
    if not os.path.exists(opt.expr_dir):
        os.makedirs(opt.expr_dir)

    if os.path.exists(args.log):
        shutil.rmtree(args.log)
    os.makedirs(args.log)
    ```

    ## Use instead
    ```python
    os.makedirs(opt.expr_dir, exist_ok=True)

    if mgpu_runtime.is_main_process():
        if os.path.exists(args.log):
            shutil.rmtree(args.log)
        os.makedirs(args.log)
    mgpu_runtime.barrier()
    ```

    ## Fix safety
    ``exist_ok=True`` changes nothing in one process: the check made sure the directory was missing. A
    statement moved onto the main process makes or deletes the directory once, and the others wait for it,
    so each finds the directory as the original's one process did; a process whose path differs (a name with
    its own timestamp) finds the main process's. Not moved, and reported (MGP335): a statement in the loop
    over the batches, under an ``if`` judged from the disk (each process may judge it apart, and only some
    would wait), in a function called on the main process only, and, under ``--style torch``, every one (it
    has no runtime to wait with). A path made by ``tempfile`` is each process's own: it stays as it is.
    """

    CODE = Rewrite("MGP133")
    PHASE = PROGRAM
    USES = ("loaders", "values")
    REVIEW_CODES = (DIRECTORY_ON_EVERY_PROCESS,)
    DESCRIPTION = "directories made once: check-then-create with exist_ok=True, resets on the main process"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import os
            import torch.nn as nn

            model = nn.DataParallel(model)
            if not os.path.exists(opt.expr_dir):  # where the checkpoints go
                os.makedirs(opt.expr_dir)
            """,
            """
            import os
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            # where the checkpoints go
            os.makedirs(opt.expr_dir, exist_ok=True)
            """,
            DDP,
            ("MGP101", "MGP133"),
            message="`os.makedirs(opt.expr_dir)` after `not os.path.exists(opt.expr_dir)`: exist_ok=True",
            line=5,
        ),
        Example(
            """
            import os
            import torch.nn as nn

            model = nn.DataParallel(model)
            if output_dir and not os.path.exists(output_dir):
                os.makedirs(output_dir)
            """,
            """
            import os
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            if output_dir and not os.path.exists(output_dir):
                os.makedirs(output_dir, exist_ok=True)
            """,
            DDP,
            ("MGP101", "MGP133"),
            message="`os.makedirs(output_dir)` after `not os.path.exists(output_dir)`: exist_ok=True",
            line=6,
            name="a check-then-create under a further condition keeps its `if` (reid-strong-baseline)",
        ),
        Example(
            """
            import os
            import shutil
            import torch.nn as nn

            model = nn.DataParallel(model)
            if os.path.exists(args.log):
                shutil.rmtree(args.log)
            os.makedirs(args.log)
            """,
            """
            import os
            import shutil
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            if mgpu_runtime.is_main_process():
                if os.path.exists(args.log):
                    shutil.rmtree(args.log)
                os.makedirs(args.log)
            mgpu_runtime.barrier()
            """,
            DDP,
            ("MGP101", "MGP133"),
            message="`shutil.rmtree(args.log)`, then `os.makedirs(args.log)` (line 8): on the main process only",
            line=7,
        ),
        Example(
            """
            import os
            import shutil
            import torch.nn as nn

            model = nn.DataParallel(model)
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                shutil.rmtree("scratch")
                os.makedirs("scratch")
            """,
            """
            import os
            import shutil
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                shutil.rmtree("scratch")
                os.makedirs("scratch")
            """,
            DDP,
            ("MGP101", DIRECTORY_ON_EVERY_PROCESS),
            message="in the loop over the batches at line 6",
            line=9,
            name="a reset in the loop over the batches is reported, not given a wait each step",
        ),
        Example(
            """
            from pathlib import Path
            import torch.nn as nn

            model = nn.DataParallel(model)
            out = Path(args.out)
            if not out.exists(): out.mkdir(parents=True)
            """,
            """
            from pathlib import Path
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            """,
            DDP,
            ("MGP101", "MGP133"),
        ),
    )

    def apply(self) -> None:
        if not self.program.runs_distributed:
            return
        resets: set[cst.CSTNode] = set()  # the makers that follow a removal: moved with it
        for call in self.analysis.calls:
            if self._qualified(call) in _REMOVERS and self._shared(call):
                self._reset(call, resets)
        for call in self.analysis.calls:
            if call not in resets and self._makes(call) and self._shared(call):
                self._make(call)

    # -- what a call does ------------------------------------------------------------------------------
    def _qualified(self, call: cst.Call) -> Optional[str]:
        return self.analysis.resolve(call.func)

    def _is_maker(self, call: cst.Call) -> bool:
        """``os.makedirs(d)``, ``os.mkdir(d)``, ``p.mkdir()``."""
        qualified = self._qualified(call)
        path_method = qualified is None and type(call.func) is cst.Attribute and call.func.attr.value == "mkdir"
        return qualified in _MAKERS or path_method

    def _makes(self, call: cst.Call) -> bool:
        """A making that fails where the directory exists (no ``exist_ok=True``)."""
        if not self._is_maker(call):
            return False
        exist_ok = keyword(call, "exist_ok")
        return not (exist_ok is not None and type(exist_ok.value) is cst.Name and exist_ok.value.value == "True")

    def _path(self, call: cst.Call) -> Optional[str]:
        """The text of the path a call makes, deletes or checks: its first argument, or a method's receiver."""
        if self._qualified(call) is None and type(call.func) is cst.Attribute:
            return self.analysis.code_of(call.func.value)
        if call.args and call.args[0].keyword is None and not call.args[0].star:
            return self.analysis.code_of(call.args[0].value)
        return None

    def _own_statement(self, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
        statement = self.analysis.tree.statement(call)
        if type(statement) is cst.SimpleStatementLine and self._alone(statement.body, call):
            return statement
        return None

    @staticmethod
    def _alone(body, call: cst.Call) -> bool:
        return len(body) == 1 and type(body[0]) is cst.Expr and body[0].value is call

    def _alone_under_if(self, call: cst.Call) -> Optional[cst.If]:
        """The ``if`` (no ``else``) whose whole body is ``call`` as a statement, on its own lines or after the
        colon (``if not os.path.exists(d): os.makedirs(d)``)."""
        tree = self.analysis.tree
        expression = tree.parent(call)
        suite = tree.parent(expression) if expression is not None else None
        if type(suite) is cst.SimpleStatementSuite:
            alone = self._alone(suite.body, call)
        else:
            line = self._own_statement(call)
            suite = tree.parent(line) if line is not None else None
            alone = type(suite) is cst.IndentedBlock and len(suite.body) == 1
        guard = tree.parent(suite) if alone and suite is not None else None
        return guard if type(guard) is cst.If and guard.orelse is None and guard.body is suite else None

    def _checks_missing(self, test: cst.BaseExpression, path: str) -> Optional[cst.Call]:
        """In ``not os.path.exists(path)`` (``isdir``, ``path.exists()``), the check."""
        if type(test) is not cst.UnaryOperation or type(test.operator) is not cst.Not:
            return None
        check = test.expression
        if type(check) is not cst.Call or self._path(check) != path:
            return None
        if self._qualified(check) in _EXISTS:
            return check
        if type(check.func) is cst.Attribute and check.func.attr.value in _PATH_CHECKS and not check.args:
            return check
        return None

    def _checks_missing_among(self, test: cst.BaseExpression, path: str) -> Optional[cst.Call]:
        """The check of ``not os.path.exists(path)`` among the conditions of an ``and`` (``d and not
        os.path.exists(d)``)."""
        if type(test) is not cst.BooleanOperation or type(test.operator) is not cst.And:
            return None
        for side in (test.left, test.right):
            check = self._checks_missing(side, path) or self._checks_missing_among(side, path)
            if check is not None:
                return check
        return None

    def _reads_only_the_disk(self, test: cst.BaseExpression) -> bool:
        """A test whose calls are checks of paths (``os.path.exists(d)``, ``not args.resume and ...``)."""
        return all(self._qualified(call) in _EXISTS for call in contains(test, lambda n: type(n) is cst.Call))

    # -- the two shapes ----------------------------------------------------------------------------------
    def _make(self, call: cst.Call) -> None:
        path = self._path(call)
        guard = self._alone_under_if(call)
        check = self._checks_missing(guard.test, path) if guard is not None and path is not None else None
        if guard is not None and check is not None:
            if path is not None and self._made_before_its_loop(call, path):
                return  # made once before the loop, as in the original: every process's check finds it there
            if keyword(call, "exist_ok") is None and self._qualified(call) != "os.mkdir":
                self._exist_ok(guard, call, check)
            else:
                self._once(call, [guard], f"`{shorten(self.analysis.code_of(call))}`")
            return
        # `if output_dir and not os.path.exists(output_dir): os.makedirs(output_dir)` (reid-strong-baseline): the
        # `if` stays, as its other conditions may not hold, and the making takes exist_ok=True.
        check = self._checks_missing_among(guard.test, path) if guard is not None and path is not None else None
        if guard is not None and check is not None and keyword(call, "exist_ok") is None and self._qualified(call) != "os.mkdir":
            if self.rewrite_allowed(call):
                self.edits.replace(call, _with_exist_ok)
                self.rewrote(
                    call,
                    f"`{shorten(self.analysis.code_of(call))}` after `not {shorten(self.analysis.code_of(check))}`: "
                    "exist_ok=True, no error where another process made it first",
                )
            return
        statement = self._own_statement(call)
        if statement is None:
            self._report(call, "is not a statement of its own")
            return
        refusal = self._refusal_before(statement, path)
        if refusal is not None:
            # `if os.path.exists(save_dir): raise NameError('model dir exists!')` right before: checked by the main
            # process with its making, as the other processes would find the directory it just made.
            what = f"`{shorten(self.analysis.code_of(call))}` with the check before it (line {self.analysis.position(refusal)[0]})"
            self._once(call, [refusal, statement], what)
            return
        self._once(call, [statement], f"`{shorten(self.analysis.code_of(call))}`")

    def _refusal_before(self, statement: cst.CSTNode, path: Optional[str]) -> Optional[cst.If]:
        """The statement right before ``statement`` in its block when it refuses to go on where ``path`` exists:
        ``if os.path.exists(path): raise ...`` (a test that reads only the disk and checks that path, a body that
        only raises, no ``else``)."""
        body = list(getattr(self.analysis.tree.parent(statement), "body", ()))
        index = next((position for position, other in enumerate(body) if other is statement), 0)
        previous = body[index - 1] if index > 0 else None
        if type(previous) is not cst.If or previous.orelse is not None or path is None:
            return None
        if not self._reads_only_the_disk(previous.test) or not any(
            self._path(check) == path for check in contains(previous.test, lambda node: type(node) is cst.Call)
        ):
            return None
        lines = previous.body.body
        if not all(
            type(line) is cst.SimpleStatementLine and all(type(small) is cst.Raise for small in line.body) for line in lines
        ) and not all(type(small) is cst.Raise for small in lines):
            return None
        return previous

    def _exist_ok(self, guard: cst.If, call: cst.Call, check: cst.Call) -> None:
        if not self.rewrite_allowed(guard):
            return
        # The `if` line's comment goes above the statement that replaces it, the body's stays at its end (on one
        # line, `if ...: os.makedirs(d)  # comment`, it is the body's).
        header = guard.body.header.comment if type(guard.body) is cst.IndentedBlock else None
        comments = [cst.EmptyLine(comment=header)] if header is not None else []

        def replaced(updated: cst.CSTNode) -> cst.CSTNode:
            assert type(updated) is cst.If  # the replaced node is the `if` (_alone_under_if)
            body = updated.body
            inner: list[cst.EmptyLine] = []
            if type(body) is cst.IndentedBlock:
                line = body.body[0]
                assert type(line) is cst.SimpleStatementLine
                inner = [*line.leading_lines, *body.footer]
            else:
                assert type(body) is cst.SimpleStatementSuite
                line = cst.SimpleStatementLine(body.body, trailing_whitespace=body.trailing_whitespace)
            statement = line.body[0]
            assert type(statement) is cst.Expr and type(statement.value) is cst.Call
            return line.with_changes(
                body=[statement.with_changes(value=with_keyword(statement.value, "exist_ok", cst.Name("True")))],
                leading_lines=[*updated.leading_lines, *comments, *inner],
            )

        self.edits.replace(guard, replaced)
        self.rewrote(
            guard,
            f"`{shorten(self.analysis.code_of(call))}` after `not {shorten(self.analysis.code_of(check))}`: exist_ok=True, "
            "no error where another process made it first",
        )

    def _reset(self, call: cst.Call, resets: set[cst.CSTNode]) -> None:
        guard = self._alone_under_if(call)
        first: Optional[cst.BaseStatement] = self._own_statement(call)
        # (Not an `elif`: it is no statement of its own block, to be moved whole.)
        if guard is not None and self._reads_only_the_disk(guard.test) and type(self.analysis.tree.parent(guard)) is not cst.If:
            first = guard
        if first is None:
            self._report(call, "is not a statement of its own")
            return
        moved: list[cst.BaseStatement] = [first]
        body = list(getattr(self.analysis.tree.parent(first), "body", ()))
        following = body[body.index(first) + 1] if first in body[:-1] else None
        maker = self._following_maker(following, self._path(call))
        what = f"`{shorten(self.analysis.code_of(call))}`"
        if maker is not None and following is not None:
            resets.add(maker)
            moved.append(following)
            what += f", then `{shorten(self.analysis.code_of(maker))}` (line {self.analysis.position(maker)[0]})"
        self._once(call, moved, what)

    def _following_maker(self, statement: Optional[cst.CSTNode], path: Optional[str]) -> Optional[cst.Call]:
        """The making of ``path`` that is the whole of ``statement`` (its ``exist_ok`` does not matter: the
        directory it makes is one another process would delete)."""
        if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1 or type(statement.body[0]) is not cst.Expr:
            return None
        call = statement.body[0].value
        if type(call) is not cst.Call or path is None or self._path(call) != path:
            return None
        return call if self._is_maker(call) else None

    # -- on the main process, or reported ----------------------------------------------------------------
    def _made_before_its_loop(self, call: cst.Call, path: str) -> bool:
        """A check-then-create in the loop over the batches of a directory that its function made before that
        loop, unconditionally or after a check that it is missing (Face_Pytorch's ``if not
        os.path.exists(save_dir): os.mkdir(save_dir)`` at each checkpoint, ``save_dir`` made at the start), under
        a name bound once, which nothing in the file deletes: every process's check finds it made, as the
        original's did, so the making never runs."""
        tree = self.analysis.tree
        around = set(tree.ancestors(call))
        loop = next((loop for loop in self.analysis.loaders.training_loops if loop in around), None)
        if loop is None or any(self._qualified(other) in _REMOVERS and self._path(other) == path for other in self.analysis.calls):
            return False
        function = tree.function(call)
        made = [
            other
            for other in self.analysis.calls
            if other is not call and self._is_maker(other) and self._path(other) == path and tree.function(other) is function
        ]
        for other in made:
            if self.analysis.position(other) >= self.analysis.position(loop):
                continue
            statement: Optional[cst.CSTNode] = tree.statement(other)
            guard = self._alone_under_if(other)
            if guard is not None and self._checks_missing(guard.test, path) is not None:
                statement = guard  # `if not os.path.exists(d): os.mkdir(d)`: made, whichever way it goes
            block = tree.parent(statement) if statement is not None else None
            owner = tree.parent(block) if block is not None else None
            if not (type(block) is cst.Module or (type(block) is cst.IndentedBlock and owner is function)):
                continue  # under another `if`, a loop, a `try`: it may not have run
            argument = other.args[0].value if other.args else None
            values = self.analysis.values
            if type(argument) is cst.Name and len(values.of(argument, values.scope_of(other))) == 1:
                return True
        return False

    def _once(self, call: cst.Call, moved: list[cst.BaseStatement], what: str) -> None:
        """``moved`` (the statements making or deleting the directory) on the main process, then a wait."""
        unsafe = self._unsafe(call, moved[0])
        if unsafe is not None:
            self._report(call, unsafe)
            return
        if not self.rewrite_allowed(call):
            return
        rest = moved[1:]

        def guarded(updated: cst.CSTNode) -> cst.FlattenSentinel:
            assert isinstance(updated, cst.BaseStatement)  # moved[0] is a statement of its block
            return cst.FlattenSentinel(on_the_main_process([updated, *rest]))

        self.edits.replace(moved[0], guarded)
        for statement in rest:
            self.edits.replace(statement, lambda _: cst.RemovalSentinel.REMOVE)
        self.edits.need_import(RUNTIME)
        self.rewrote(call, f"{what}: on the main process only, then every process waits")

    def _unsafe(self, call: cst.Call, first: cst.CSTNode) -> Optional[str]:
        """Why a wait after ``first`` could hang or cost a wait each step, or why the main process's directory
        is not every process's; None when it is safe."""
        if self.options.style != RUNTIME_STYLE:
            return "under --style torch, which has no runtime to wait with"
        tree = self.analysis.tree
        around = set(tree.ancestors(first))
        for loop in self.analysis.loaders.training_loops:
            if loop in around:
                return f"in the loop over the batches at line {self.analysis.position(loop)[0]}"
        for guard, _ in tree.enclosing_ifs(first):
            if any(self._qualified(check) in _EXISTS for check in contains(guard.test, lambda n: type(n) is cst.Call)):
                return f"under the `if` at line {self.analysis.position(guard)[0]}, judged by each from the disk"
        caller = main_process_caller(self.analysis, call)
        if caller is not None:
            return f"called only on the main process at line {self.analysis.position(caller)[0]}"
        return None

    def _shared(self, call: cst.Call) -> bool:
        """Whether every process would make or delete the same directory here, and fail: not under a
        main-process block or a ``try`` taking an existing directory for no error, and not a path ``tempfile``
        made (each process's own)."""
        if under_main_process_block(self.analysis, call) or self._existing_caught(call):
            return False
        if self._qualified(call) is None and type(call.func) is cst.Attribute:
            path: Optional[cst.BaseExpression] = call.func.value
        else:
            path = call.args[0].value if call.args else None
        if path is None:
            return True
        values = self.analysis.values
        return not any(
            type(value) is cst.Call and (self.analysis.resolve(value.func) or "").startswith("tempfile.")
            for value in values.of(path, values.scope_of(call))
        )

    def _existing_caught(self, call: cst.Call) -> bool:
        """Under a ``try`` whose handler takes a directory that exists already for no error (``except OSError``):
        the script made it safe for several processes itself."""
        tree = self.analysis.tree
        child: cst.CSTNode = call
        for ancestor in tree.ancestors(call):
            if type(ancestor) in (cst.FunctionDef, cst.ClassDef):
                return False
            if type(ancestor) is cst.Try and child is ancestor.body:
                for handler in ancestor.handlers:
                    kinds = [] if handler.type is None else list(contains(handler.type, lambda n: type(n) is cst.Name))
                    if handler.type is None or any(kind.value in EXISTING_CAUGHT for kind in kinds):
                        return True
            child = ancestor
        return False

    def _report(self, call: cst.Call, why: str) -> None:
        self.left(
            call,
            DIRECTORY_ON_EVERY_PROCESS,
            f"`{shorten(self.analysis.code_of(call))}` on every process, not moved ({why}): do it on the main one, "
            "then barrier()",
        )


def _with_exist_ok(updated: cst.CSTNode) -> cst.CSTNode:
    assert type(updated) is cst.Call
    return with_keyword(updated, "exist_ok", cst.Name("True"))
