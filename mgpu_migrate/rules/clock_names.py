"""MGP138: a clock reading that names something (a run directory) is the main process's on every process
(``--to ddp``)."""

from __future__ import annotations

import ast
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.entrypoint import main_function
from mgpu_migrate.analysis.guards import main_process_caller, under_main_process_block
from mgpu_migrate.analysis.project import Found, Project, project_of
from mgpu_migrate.analysis.writers import LOGGING_METHODS
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, Example, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, through_runtime

# Readings of the wall clock: the function, and how many positional arguments it may be given and still read
# the clock (``time.strftime(fmt)`` reads it, ``time.strftime(fmt, t)`` formats ``t``).
_READINGS = {
    "time.strftime": 1,
    "time.asctime": 0,
    "time.ctime": 0,
    "time.localtime": 0,
    "time.gmtime": 0,
    "time.time": 0,
    "time.time_ns": 0,
    "datetime.datetime.now": 1,
    "datetime.datetime.today": 0,
    "datetime.datetime.utcnow": 0,
    "datetime.date.today": 0,
}
# Readings that are text already.
_TEXT_READINGS = frozenset({"time.strftime", "time.asctime", "time.ctime"})
# Calls and methods that make text of a reading, and those that pass it on unchanged in kind.
_TO_TEXT = frozenset({"str", "format", "repr", "time.strftime", "time.asctime", "time.ctime"})
_TO_TEXT_METHODS = frozenset({"strftime", "isoformat", "ctime", "format", "__str__"})
_PASSING = frozenset({"int", "round", "float", "time.mktime"})
_PASSING_METHODS = frozenset({"replace", "date", "astimezone", "timestamp", "lower", "upper", "strip"})
# What only shows a reading (a time stamp printed or logged): it names nothing.
_SHOWING = frozenset({"print"})
_SHOWING_METHODS = LOGGING_METHODS
_LOOPS = (cst.For, cst.While, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


class ClockNames(Rule):
    """
    ## What it does
    In a file that becomes a distributed program, a reading of the wall clock that names something, made where
    the program sets up (at module level, in the main block, or in the function that trains, before its
    loop), becomes the main process's reading on every process: the call that reads the clock
    (``time.strftime(fmt)``, ``time.asctime()``, ``time.gmtime()``, ``datetime.datetime.now()``,
    ``datetime.date.today()``, ``time.time()``) goes through ``mgpu_runtime.main_process_value``, and what the
    script makes of it (``.strftime(fmt)``, ``.isoformat()``, ``"eval-{}".format(...)``) stays as written.

    A call of a project function that reads the clock into text and returns it (SfmLearner's
    ``save_path = save_path_formatter(args, parser)``, whose ``utils.py`` joins
    ``datetime.datetime.now().strftime("%m-%d-%H:%M")`` into the run directory's path), made where the program
    sets up and its result kept, goes through ``mgpu_runtime.main_process_value`` the same way, when the function
    writes nothing (one that writes is MGP132's, on the main process only).

    A reading names something when it becomes text that is kept or passed on (assigned, given to a function,
    joined into a path), not when it is only printed or logged; ``time.time()`` and ``datetime.now()`` count
    only when made into text (``str(int(time.time()))``): a time taken to measure a duration is left.

    ## Why is this bad?
    The original read the clock once, in one process. One process per GPU reads it once per process, and two
    processes whose readings fall on either side of a second name two run directories: the main process makes
    its own (MGP132, MGP133), and another opens its log file in the one nobody made (FileNotFoundError), or
    writes its files beside the main process's under another name.

    ## Example
    ```python
    args.save = "eval-{}-{}".format(args.save, time.strftime("%Y%m%d-%H%M%S"))
    ```

    ## Use instead
    ```python
    args.save = "eval-{}-{}".format(args.save, mgpu_runtime.main_process_value(time.strftime, "%Y%m%d-%H%M%S"))
    save_path = mgpu_runtime.main_process_value(save_path_formatter, args, parser)   # a project helper's reading
    ```

    ## Fix safety
    The main process reads the clock where it did; the others get its reading (a helper's result: it must
    pickle, as a path or text does, and the helper's other work is the main process's only). No collective: the main
    process publishes the value in the job's store and goes on, and each other process waits for it alone (at
    most ``MGPU_TIMEOUT``), so the call cannot pair with another. In a single process it is the call itself.
    A reading in a loop (a time stamp per epoch or step), under a main-process block, or in a function the main
    process alone calls is left, as is any reading under ``--style torch``, which has no runtime.
    """

    CODE = Rewrite("MGP138")
    PHASE = PROGRAM
    USES = ("loaders",)
    STYLES = (RUNTIME_STYLE,)
    DESCRIPTION = "a clock reading that names something is the main process's on every process"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import time
            import torch.nn as nn

            args.save = 'eval-{}-{}'.format(args.save, time.strftime("%Y%m%d-%H%M%S"))
            model = nn.DataParallel(model)
            """,
            """
            import time
            import mgpu_runtime

            args.save = 'eval-{}-{}'.format(args.save, mgpu_runtime.main_process_value(time.strftime, "%Y%m%d-%H%M%S"))
            model = mgpu_runtime.DistributedDataParallel(model)
            """,
            DDP,
            ("MGP101", "MGP138"),
            message='`time.strftime("%Y%m%d-%H%M%S")` names something from the clock: the main process\'s reading on every process',
            line=4,
        ),
        Example(
            """
            import datetime
            import torch.nn as nn
            from time import gmtime, strftime


            def train(loader):
                stamp = strftime("%Y-%d-%m %H:%M:%S", gmtime())
                run = datetime.datetime.now().strftime("%H%M")
                model = nn.DataParallel(net)
                start = datetime.datetime.now()
                for x in loader:
                    print(time.strftime("%H:%M:%S"), datetime.datetime.now() - start)
                    model(x).mean().backward()
            """,
            """
            import datetime
            from time import gmtime, strftime
            import mgpu_runtime


            def train(loader):
                stamp = strftime("%Y-%d-%m %H:%M:%S", mgpu_runtime.main_process_value(gmtime))
                run = mgpu_runtime.main_process_value(datetime.datetime.now).strftime("%H%M")
                model = mgpu_runtime.DistributedDataParallel(net)
                start = datetime.datetime.now()
                for x in loader:
                    print(time.strftime("%H:%M:%S"), datetime.datetime.now() - start)
                    model(x).mean().backward()
            """,
            DDP,
            ("MGP101", "MGP138"),
            name="the set-up's names change; a duration and a time stamp in the loop stay",
        ),
        Example(
            """
            import time
            import torch.nn as nn

            print("started at", time.asctime())
            if args.rank == 0:
                stamp = time.strftime("%Y%m%d")
            model = nn.DataParallel(model)
            """,
            """
            import time
            import mgpu_runtime

            print("started at", time.asctime())
            if args.rank == 0:
                stamp = time.strftime("%Y%m%d")
            model = mgpu_runtime.DistributedDataParallel(model)
            """,
            DDP,
            ("MGP101",),
            name="a printed time stamp and a reading on the main process only stay",
        ),
        Example(
            """
            import os
            import time
            from datetime import datetime
            import torch.nn as nn

            log_dir = os.path.join("runs", datetime.now().isoformat())
            name = "exp_" + str(int(time.time()))
            start = time.time()
            model = nn.DataParallel(model)
            """,
            """
            import os
            import time
            from datetime import datetime
            import mgpu_runtime

            log_dir = os.path.join("runs", mgpu_runtime.main_process_value(datetime.now).isoformat())
            name = "exp_" + str(int(mgpu_runtime.main_process_value(time.time)))
            start = time.time()
            model = mgpu_runtime.DistributedDataParallel(model)
            """,
            DDP,
            ("MGP101", "MGP138"),
            name="a reading made into a name changes; a start time kept for a duration stays",
        ),
    )

    def apply(self) -> None:
        if not self.program.runs_distributed:
            return
        analysis = self.analysis
        training = {analysis.tree.function(loop) for loop in analysis.loaders.training_loops} - {None}
        training.add(main_function(analysis))  # None when there is none: a function is never None
        project = project_of(analysis.path)
        for call in analysis.calls:
            qualified = self._reading(call)
            helper = None
            if qualified is None:
                helper = self._naming_helper(project, call) if project is not None else None
                if helper is None or not self._in_set_up(call, training) or not self._result_kept(call):
                    continue
            elif not self._in_set_up(call, training) or not self._names(call, qualified):
                continue
            if under_main_process_block(analysis, call) or main_process_caller(analysis, call) is not None:
                continue
            if not self.rewrite_allowed(call):
                continue
            self.edits.need_import(RUNTIME)
            self.edits.replace(call, through_runtime("main_process_value"))
            if helper is not None:
                what = shorten(analysis.code_of(call.func), 40)
                self.rewrote(
                    call,
                    f"`{what}(...)` names something from the clock ({helper}): the main process's result on every process "
                    f"({RUNTIME}.main_process_value)",
                )
                continue
            what = shorten(analysis.code_of(call), 40)
            self.rewrote(call, f"`{what}` names something from the clock: the main process's reading on every process ({RUNTIME}.main_process_value)")

    def _naming_helper(self, project: Project, call: cst.Call) -> Optional[str]:
        """Where a project function that ``call`` calls reads the clock into text it returns (SfmLearner's
        ``save_path_formatter``: ``datetime.datetime.now().strftime(...)`` joined into the run directory's path),
        as ``utils.py:36``; None when it does not, or when it also writes (MGP132's, on the main process only)."""
        qualified = self.analysis.resolve(call.func)
        if not qualified or qualified.startswith(("torch.", "builtins.", "time.", "datetime.")) or any(arg.star for arg in call.args):
            return None
        found = project.find(qualified)
        if found is None or not isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        if project.writes(found) is not None or not _returns_a_value(found.node) or _changes_its_arguments(found.node):
            return None
        reading = _text_reading(found)
        if reading is None:
            return None
        return f"{found.where.rpartition(':')[0]}:{reading}"

    def _result_kept(self, call: cst.Call) -> bool:
        """What the call returns is kept or passed on: not a statement of its own."""
        return type(self.analysis.tree.parent(call)) is not cst.Expr

    def _reading(self, call: cst.Call) -> Optional[str]:
        """The clock function ``call`` reads the clock with (``time.strftime``), None for any other call."""
        qualified = self.analysis.resolve(call.func)
        most = _READINGS.get(qualified or "")
        if most is None or any(arg.star for arg in call.args) or len(call.args) > most:
            return None
        # `datetime.now(tz=...)`: a time zone, no time; any other keyword names what is formatted.
        if any(arg.keyword is not None and arg.keyword.value != "tz" for arg in call.args):
            return None
        return qualified

    def _in_set_up(self, call: cst.Call, training: set) -> bool:
        """At module level (the main block included) or in a function that trains, outside any loop."""
        for ancestor in self.analysis.tree.ancestors(call):
            if type(ancestor) in _LOOPS:
                return False
            if type(ancestor) in (cst.FunctionDef, cst.Lambda, cst.ClassDef):
                return ancestor in training
        return True

    def _names(self, call: cst.Call, qualified: str) -> bool:
        """Whether the reading becomes text that is kept or passed on (see the class doc)."""
        tree = self.analysis.tree
        node: cst.CSTNode = call
        text = qualified in _TEXT_READINGS
        while True:
            parent = tree.parent(node)
            if parent is None:
                return text
            if type(parent) is cst.Attribute and parent.value is node:
                called = tree.parent(parent)
                if type(called) is not cst.Call or called.func is not parent:
                    return text
                if parent.attr.value in _TO_TEXT_METHODS:
                    text = True
                elif parent.attr.value not in _PASSING_METHODS:
                    return False
                node = called
            elif type(parent) is cst.Arg:
                called = tree.parent(parent)
                if type(called) is not cst.Call:
                    return text
                func = called.func
                name = self._name(func)
                method = func.attr.value if type(func) is cst.Attribute else None
                if name in _SHOWING or method in _SHOWING_METHODS:
                    return False
                if name in _TO_TEXT or method == "format":
                    text = True
                elif name not in _PASSING:
                    return text
                node = called
            elif type(parent) is cst.FormattedStringExpression:
                text, node = True, tree.parent(parent) or parent
            elif type(parent) is cst.Element:
                node = tree.parent(parent) or parent
            elif type(parent) is cst.BinaryOperation and type(parent.operator) in (cst.Add, cst.Modulo):
                other = parent.right if parent.left is node else parent.left
                if not (text or type(other) in (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
                    return False
                text, node = True, parent
            else:
                return text

    def _name(self, func: cst.BaseExpression) -> Optional[str]:
        if type(func) is cst.Name and func.value in (_TO_TEXT | _PASSING | _SHOWING):
            return func.value
        return self.analysis.resolve(func)


_AST_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _returns_a_value(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(node, ast.Return) and node.value is not None for node in ast.walk(function))


def _changes_its_arguments(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether a function assigns into an object it is given (``args.save = ...``, ``config["run"] = ...``):
    called on the main process alone, it would change the main process's object only."""
    given = {arg.arg for arg in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)}
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if not isinstance(target, (ast.Attribute, ast.Subscript)):
                continue
            while isinstance(target, (ast.Attribute, ast.Subscript)):
                target = target.value
            if isinstance(target, ast.Name) and target.id in given:
                return True
    return False


def _text_reading(found: Found) -> Optional[int]:
    """The line of the first clock reading in a project function, outside its loops, made into text there
    (``time.strftime(fmt)``, ``datetime.datetime.now().strftime(fmt)``, ``str(time.time())``) and returned; None when
    none is."""
    if not isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    parents = {id(child): node for node in ast.walk(found.node) for child in ast.iter_child_nodes(node)}
    for node in sorted((n for n in ast.walk(found.node) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset)):
        qualified = found.module.qualified(node.func)
        most = _READINGS.get(qualified or "")
        if most is None or len(node.args) > most or any(k.arg not in ("tz",) for k in node.keywords):
            continue
        up: ast.AST = node
        looped = False
        while id(up) in parents:
            up = parents[id(up)]
            if isinstance(up, _AST_LOOPS):
                looped = True
                break
        if looped:
            continue
        parent = parents.get(id(node))
        method = parent.attr if isinstance(parent, ast.Attribute) and parent.value is node else None
        called = parents.get(id(parent)) if method is not None else parent
        text = qualified in _TEXT_READINGS or method in _TO_TEXT_METHODS or (
            isinstance(called, ast.Call) and isinstance(called.func, ast.Name) and called.func.id == "str" and node in called.args
        )
        if text and _returned(found.node, node):
            return node.lineno
    return None


def _returned(function: ast.FunctionDef | ast.AsyncFunctionDef, reading: ast.Call) -> bool:
    """Whether what ``function`` returns is made from ``reading``: the reading itself, or a name assigned from it,
    directly or through other such names (``stamp = now().strftime(...)``, ``return base / stamp``). A function
    that only uses it on the way (pytorch-semseg's ``get_logger``, which names its log file by it and returns
    the logger) returns no name."""
    derived: set[str] = set()

    def made_of(value: ast.AST) -> bool:
        return any(node is reading or (isinstance(node, ast.Name) and node.id in derived) for node in ast.walk(value))

    assignments = sorted(
        (node for node in ast.walk(function) if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None),
        key=lambda node: node.lineno,
    )
    for assignment in assignments:
        assert assignment.value is not None
        if not made_of(assignment.value):
            continue
        targets = assignment.targets if isinstance(assignment, ast.Assign) else [assignment.target]
        derived |= {node.id for target in targets for node in ast.walk(target) if isinstance(node, ast.Name)}
    return any(isinstance(node, ast.Return) and node.value is not None and made_of(node.value) for node in ast.walk(function))
