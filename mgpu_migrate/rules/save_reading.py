"""What a ``torch.save`` writes into and what the lines beside it do, read without editing: shared by the rule
that puts checkpoints on the main process (``checkpoint_save``) and the one that writes a file once
(``shared_files``), which leaves to the first the files written between a save and the move of its file."""

from __future__ import annotations

from typing import Any

import libcst as cst

from mgpu_migrate.analysis.guards import under_main_process_block
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.analysis.writers import LOGGING_METHODS, TEXT_METHODS
from mgpu_migrate.diagnostics import Rewrite
from mgpu_migrate.rules.syntax import argument, opens_for_writing

CHECKPOINT_SAVE = Rewrite("MGP123")
TORCH_SAVE = "torch.save"
# Calls that make a file object (or an in-memory one): each process would write its own.
_MOVERS = {"os.replace", "os.rename", "os.remove", "os.unlink", "shutil.move", "shutil.copy", "shutil.copyfile"}
# What ``tempfile`` makes for the process that asks: a save into it is that process's alone.
_PRIVATE_TEMPORARY = {"tempfile.TemporaryDirectory", "tempfile.mkdtemp", "tempfile.NamedTemporaryFile"}
_FILE_MAKERS = {"open", "io.open", "io.BytesIO", "gzip.open", "bz2.open", "lzma.open", "builtins.open"}


class SaveReading:
    """What a ``torch.save`` writes into and what the lines beside it do, read without editing: where
    ``CheckpointSave`` moves a save and the statements that go with it onto the main process, and ``SharedFiles``
    leaves to it the files written between a save and its move (``save_reading``)."""

    analysis: Any

    def save_and_move(self, call: cst.Call) -> tuple[cst.Call, list[cst.CSTNode]] | None:
        """For a ``torch.save`` that ``CheckpointSave`` puts on the main process together with the statements
        after it, up to the one that moves, copies or removes its file: that mover and those statements."""
        if under_main_process_block(self.analysis, call):
            return None
        destination = argument(call, "f", 1)
        if destination is None or self._is_file_object(call, destination.value) or self._private_temporary(destination.value, call):
            return None
        mover = self._moved_after(call, destination)
        if mover is None:
            return None
        followers, other, simple = self._span(call, mover, self.analysis.code_of(destination.value))
        return (mover, followers) if simple and followers is not None and other is None else None

    def _span(self, call: cst.Call, mover: cst.Call, path: str) -> tuple[list[cst.CSTNode] | None, cst.CSTNode | None, bool]:
        """The statements after the save (into ``path``, its code) up to the one that holds its mover (None where
        the mover is not after it in its block), the first of them (or of an ``if`` around the mover) that may not
        go along, and whether the save and the mover are statements of their own."""
        tree = self.analysis.tree
        save_statement = tree.statement(call)
        block = tree.parent(save_statement)
        body = list(block.body)
        # The statement of the save's block that holds the move: the move itself, or an `if` around it
        # (pytorch/examples' `if is_best: shutil.copyfile(filename, 'model_best.pth.tar')`).
        move_statement = next(node for node in (mover, *tree.ancestors(mover)) if tree.parent(node) is block)
        between = body[body.index(save_statement) + 1 : body.index(move_statement)] if move_statement in body[body.index(save_statement) :] else None
        # An `if` around the move: the statements of each of its branches (CondenseNet's `if args.no_save_model:
        # shutil.move(...)` `elif is_best: shutil.copyfile(...)`), every one a line of its own.
        inside = _branches(move_statement) if type(move_statement) is cst.If else []
        span = [save_statement, *(between or []), move_statement]
        other = next(
            (
                statement
                for statement in (*(between or []), *inside)
                if not self._moves(statement, path) and not self._goes_along(statement, span)
            ),
            None,
        )
        simple = self._single(save_statement) and (
            self._single(move_statement) or (type(move_statement) is cst.If and all(map(self._single, inside)))
        )
        return (None if between is None else [*between, move_statement]), other, simple

    def _private_temporary(self, destination: cst.BaseExpression, call: cst.Call) -> bool:
        """Whether ``destination`` is a path in a directory or file that ``tempfile`` made for this process (the
        transfer-learning tutorial's ``best_model_params.pt`` in ``with TemporaryDirectory() as tempdir:``): each
        process makes its own, so a save there stays each process's, and its load reads it back. Written once, the
        other processes would find no file."""
        if "tempfile" not in self.analysis.source:
            return False
        values = self.analysis.values
        scope = values.scope_of(call)
        for value in values.of(destination, scope):
            while True:
                if type(value) is cst.Call and self.analysis.resolve(value.func) in ("os.path.join", "pathlib.Path"):
                    value = value.args[0].value if value.args else value  # the directory it starts from
                elif type(value) is cst.BinaryOperation and type(value.operator) in (cst.Divide, cst.Add):
                    value = value.left  # `Path(tempdir) / "best.pt"`, `tempdir + "/best.pt"`
                elif type(value) is cst.FormattedString and value.parts and type(value.parts[0]) is cst.FormattedStringExpression:
                    value = value.parts[0].expression
                elif type(value) is cst.Attribute and value.attr.value == "name":
                    value = value.value  # `NamedTemporaryFile().name`
                else:
                    break
            if type(value) is cst.Call and self.analysis.resolve(value.func) in _PRIVATE_TEMPORARY:
                return True
            if type(value) is cst.Name and self._made_by_with(value.value, call):
                return True
        return False

    def _made_by_with(self, name: str, call: cst.Call) -> bool:
        """Whether ``name`` is bound by ``with tempfile.TemporaryDirectory() as name:`` (or a named temporary
        file) in the function of ``call``, and by no other ``with`` there."""
        made = False
        function = self.analysis.tree.function(call)
        for node in contains(function or self.analysis.module, lambda node: type(node) is cst.WithItem):
            target = node.asname.name if node.asname is not None else None
            if type(target) is cst.Name and target.value == name:
                if type(node.item) is not cst.Call or self.analysis.resolve(node.item.func) not in _PRIVATE_TEMPORARY:
                    return False
                made = True
        return made

    @staticmethod
    def _single(statement: cst.CSTNode) -> bool:
        return _one_line(statement) is not None

    def _goes_along(self, statement: cst.CSTNode, span: list[cst.CSTNode]) -> bool:
        """A line that may go onto the main process with a save and its move: one that only prints or logs, or
        one that names a value (``best_name = "_".join(...)``) that nothing else in its function reads."""
        if self._only_tells(statement) or self._only_writes_a_file(statement):
            return True
        assign = _one_line(statement)
        if type(assign) is not cst.Assign:
            return False
        named = {target.target.value for target in assign.targets if type(target.target) is cst.Name}
        if len(named) < len(assign.targets) or contains(
            assign.value, lambda n: type(n) in (cst.Call, cst.NamedExpr) and not self._plain_call(n)
        ):
            return False
        scope = self.analysis.tree.function(statement) or self.analysis.module
        kept = [
            node
            for node in contains(scope, lambda n: type(n) is cst.Name and n.value in named, into_functions=True)
            if not any(node in contains(part, lambda n: type(n) is cst.Name) for part in span)
        ]
        return not kept

    def _plain_call(self, node: cst.CSTNode) -> bool:
        """A call that computes a name: ``os.path.join``'s, text's own methods (``"_".join(...)``, ``.format``)."""
        if type(node) is not cst.Call:
            return False
        qualified = self.analysis.resolve(node.func)
        if qualified is not None and (qualified.startswith("os.path.") or qualified in ("str", "builtins.str")):
            return True
        return type(node.func) is cst.Attribute and node.func.attr.value in TEXT_METHODS and qualified is None

    def _only_tells(self, statement: cst.CSTNode) -> bool:
        """A line that only prints or logs (``print(...)``, ``LOG.info(...)``, ``logging.warning(...)``): what
        the main process alone says of its save, as the other processes' output goes nowhere (``MGPU_LOG``)."""
        expression = _one_line(statement)
        if type(expression) is not cst.Expr or type(expression.value) is not cst.Call:
            return False
        func = expression.value.func
        if type(func) is cst.Name:
            return func.value == "print"
        return type(func) is cst.Attribute and func.attr.value in LOGGING_METHODS and type(func.value) in (cst.Name, cst.Attribute)

    def _moves(self, statement: cst.CSTNode, path: str) -> bool:
        """Whether ``statement`` moves, copies or removes the file at ``path`` (its code)."""
        return any(
            self.analysis.resolve(other.func) in _MOVERS and other.args and self.analysis.code_of(other.args[0].value) == path
            for other in contains(statement, lambda n: type(n) is cst.Call)
        )

    def _moved_after(self, call: cst.Call, destination) -> cst.Call | None:
        """The call of a later statement of the same block that renames, moves or removes the saved path."""
        if destination is None:
            return None
        tree = self.analysis.tree
        statement = tree.statement(call)
        block = tree.parent(statement)
        body = getattr(block, "body", None)
        if not isinstance(body, (list, tuple)) or statement not in body:
            return None
        path = self.analysis.code_of(destination.value)
        for later in body[body.index(statement) + 1 :]:
            for other in contains(later, lambda n: type(n) is cst.Call):
                if type(other) is cst.Call and self.analysis.resolve(other.func) in _MOVERS and other.args and (
                    self.analysis.code_of(other.args[0].value) == path
                ):
                    return other
        return None

    def _is_file_object(self, call: cst.Call, destination: cst.BaseExpression) -> bool:
        """Whether the destination is an open file or a buffer rather than a path."""
        if type(destination) is cst.Name:
            for ancestor in self.analysis.tree.ancestors(call):
                if type(ancestor) is cst.With:
                    for item in ancestor.items:
                        asname = item.asname.name if item.asname else None
                        if (
                            type(asname) is cst.Name
                            and asname.value == destination.value
                            and self._makes_file(item.item)
                        ):
                            return True
        values = self.analysis.values
        return any(self._makes_file(value) for value in values.of(destination, values.scope_of(call)))

    def _makes_file(self, expr: cst.BaseExpression) -> bool:
        if type(expr) is not cst.Call:
            return False
        if type(expr.func) is cst.Name and expr.func.value == "open":
            return True
        return self.analysis.resolve(expr.func) in _FILE_MAKERS

    def _only_writes_a_file(self, statement: cst.CSTNode) -> bool:
        """``with open(path, "w") as f: f.write(...)``: a file opened for writing whose block only writes to it
        (CondenseNet's results and ``latest.txt`` written between its checkpoint's save and copy)."""
        if type(statement) is not cst.With or len(statement.items) != 1:
            return False
        item = statement.items[0]
        if type(item.item) is not cst.Call or not opens_for_writing(self.analysis, item.item):
            return False
        bound = item.asname.name if item.asname is not None else None
        if type(bound) is not cst.Name:
            return False
        for inner in statement.body.body if type(statement.body) is cst.IndentedBlock else ():
            line = _one_line(inner)
            if type(line) is not cst.Expr:
                return False
            call = line.value
            if not (
                type(call) is cst.Call
                and type(call.func) is cst.Attribute
                and type(call.func.value) is cst.Name
                and call.func.value.value == bound.value
                and call.func.attr.value in ("write", "writelines", "flush")
            ):
                return False
        return True


def _one_line(statement: cst.CSTNode) -> cst.BaseSmallStatement | None:
    """The statement of a line that holds one statement alone (``print(x)``, not ``a = 1; b = 2``)."""
    if type(statement) is cst.SimpleStatementLine and len(statement.body) == 1:
        return statement.body[0]
    return None


def _branches(statement: cst.If) -> list[cst.CSTNode]:
    """The statements of every branch of an ``if``/``elif``/``else`` chain."""
    found: list[cst.CSTNode] = list(statement.body.body)
    orelse = statement.orelse
    if type(orelse) is cst.If:
        found += _branches(orelse)
    elif type(orelse) is cst.Else:
        found += list(orelse.body.body)
    return found


def save_reading(analysis: Any) -> SaveReading:
    """A ``SaveReading`` of ``analysis`` for a rule other than ``CheckpointSave``."""
    reading = SaveReading()
    reading.analysis = analysis
    return reading



