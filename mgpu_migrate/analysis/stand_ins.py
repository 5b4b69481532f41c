"""Whether an object that writes can be held by the main process alone, with a stand-in on every other process.

``mgpu_runtime.main_process_only(SummaryWriter, log_dir)`` gives every process an object that it uses as the
original used the writer: calling one of its methods runs it on the main process only, and returns None on the
others. That is the original's behaviour exactly where the script calls the object's methods for their effect
and never reads what they return or what the object holds: this module finds the first use that does, in the
file (``writer.add_scalar(...)`` as a statement is fine, ``writer.log_dir`` is not; an ignite engine's
``add_event_handler(event, handler)`` calls it for its effect) and in the functions the object is handed to,
the file's own or the project's (a ``log(logger, ...)`` helper in ``utils/``, an ``evaluate(..., logger)`` that
tests ``if logger is not None:``), read with ``ast`` through project reading.
"""

from __future__ import annotations

import ast
import os
from typing import TYPE_CHECKING, Optional

import libcst as cst

from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.project import Found, project_of
from mgpu_migrate.analysis.tree import contains

if TYPE_CHECKING:
    from mgpu_migrate.analysis.file import FileAnalysis

_MAX_DEPTH = 4


def blocker(analysis: FileAnalysis, target: cst.BaseExpression, made: cst.Call, results: bool | str = False) -> Optional[str]:
    """Why the object ``made`` and stored in ``target`` (a name, or ``self.NAME``) cannot be a stand-in: the first
    use that reads more than the effect of a method call, in a few words with its line; None when none does.
    ``results``: the stand-in returns the main process's results of its method calls on every process (a visdom
    client's window ids), so a method call whose result is used is fine too; ``LOGDIR``: only its log directory is
    (a TensorBoard writer's ``get_logdir()``, also through ``file_writer``)."""
    uses = uses_of(analysis, target, made)
    if isinstance(uses, str):
        return uses
    for use in uses:
        reason = _use_blocks(analysis, use, results)
        if reason is not None:
            return f"{reason} at line {analysis.position(use)[0]}"
    return None


def uses_of(analysis: FileAnalysis, target: cst.BaseExpression, made: cst.Call) -> list[cst.BaseExpression] | str:
    """Where the object ``made`` and stored in ``target`` is used: a name, in the function that makes it (or the
    module); ``self.NAME``, in the class that makes it. What keeps them from being told, when they cannot be."""
    tree = analysis.tree
    if type(target) is cst.Name:
        function = tree.function(made)
        where: cst.CSTNode = function if function is not None else analysis.module
        uses = [n for n in contains(where, lambda n: type(n) is cst.Name and n.value == target.value, into_functions=True)]
        return [n for n in uses if n is not target and not _is_attribute_name(tree, n) and not _a_parameter(tree, n, where)]
    if type(target) is cst.Attribute and type(target.value) is cst.Name and target.value.value == "self":
        owner = next((a for a in tree.ancestors(made) if type(a) is cst.ClassDef), None)
        if owner is None:
            return "stored in an attribute outside a class"
        name = target.attr.value
        return [
            n
            for n in contains(owner, lambda n: type(n) is cst.Attribute and n.attr.value == name, into_functions=True)
            if n is not target and type(n.value) is cst.Name and n.value.value == "self"
        ]
    return f"stored in `{analysis.code_of(target)}`"


def _a_parameter(tree, node: cst.Name, scope: cst.CSTNode) -> bool:
    """``node`` is, or names, a parameter of a function inside ``scope``: another variable of the same name
    (pytorch-semseg's ``def train(cfg, writer, logger)``, handed the module's ``writer``: what the function does with
    it is read where it is handed)."""
    for ancestor in tree.ancestors(node):
        if ancestor is scope:
            return False
        if type(ancestor) in (cst.FunctionDef, cst.Lambda):
            params = ancestor.params
            every = [*params.posonly_params, *params.params, *params.kwonly_params]
            every += [star for star in (params.star_arg, params.star_kwarg) if type(star) is cst.Param]
            if any(param.name.value == node.value for param in every):
                return True
    return False


def _is_attribute_name(tree, node: cst.Name) -> bool:
    """``x.NAME`` or a keyword ``NAME=``: the name there is no use of a variable."""
    parent = tree.parent(node)
    return (type(parent) is cst.Attribute and parent.attr is node) or (type(parent) is cst.Arg and parent.keyword is node)


# ``blocker``'s ``results`` for a TensorBoard writer: its stand-in returns the main process's log directory.
LOGDIR = "logdir"


def _reads_the_logdir(tree, attribute: cst.Attribute) -> bool:
    """``attribute`` (``writer.get_logdir`` or ``writer.file_writer``) begins ``writer.get_logdir()`` or
    ``writer.file_writer.get_logdir()``."""
    if attribute.attr.value == "file_writer":
        inner = tree.parent(attribute)
        if type(inner) is not cst.Attribute or inner.value is not attribute:
            return False
        attribute = inner
    call = tree.parent(attribute)
    return attribute.attr.value == "get_logdir" and type(call) is cst.Call and call.func is attribute


def _reads_the_logdir_ast(parents: dict, attribute: ast.Attribute) -> bool:
    """``_reads_the_logdir`` in a function read with ``ast`` (``parents``: each node's parent, by id)."""
    if attribute.attr == "file_writer":
        inner = parents.get(id(attribute))
        if not isinstance(inner, ast.Attribute) or inner.value is not attribute:
            return False
        attribute = inner
    call = parents.get(id(attribute))
    return attribute.attr == "get_logdir" and isinstance(call, ast.Call) and call.func is attribute


def _use_blocks(analysis: FileAnalysis, use: cst.BaseExpression, results: bool | str) -> Optional[str]:
    tree = analysis.tree
    parent = tree.parent(use)
    # `logger if args.log else None` handed on: what receives it is what uses it.
    while type(parent) is cst.IfExp and use is not parent.test:
        use, parent = parent, tree.parent(parent)
    if type(parent) in (cst.AssignTarget, cst.Del):
        return None
    if type(parent) is cst.Attribute and parent.value is use:
        call = tree.parent(parent)
        if results == LOGDIR and _reads_the_logdir(tree, parent):
            return None
        if type(call) is cst.Call and call.func is parent:
            return None if results is True or type(tree.parent(call)) is cst.Expr else f"what `{analysis.code_of(parent)}(...)` returns is used"
        if type(call) is cst.AssignTarget:
            return None  # an attribute set (yolact's `log.log_gpu_stats = ...`): the stand-in sets it on the main process
        return f"`{analysis.code_of(parent)}` is read"
    comparison = tree.parent(parent) if type(parent) is cst.ComparisonTarget else parent
    if type(comparison) is cst.Comparison:
        sides = [comparison.left, *(target.comparator for target in comparison.comparisons)]
        kinds = {type(target.operator) for target in comparison.comparisons}
        if kinds <= {cst.Is, cst.IsNot} and any(type(side) is cst.Name and side.value == "None" for side in sides):
            return None
        return f"`{analysis.code_of(comparison)}` compares it"
    if type(parent) is cst.If and parent.test is use:
        return None
    if type(parent) is cst.Arg:
        call = tree.parent(parent)
        assert type(call) is cst.Call
        return _handed(analysis, call, parent, results)
    return f"`{analysis.code_of(parent)}` uses it" if parent is not None else "used"


def _handed(analysis: FileAnalysis, call: cst.Call, arg: cst.Arg, results: bool | str) -> Optional[str]:
    """The object handed to ``call`` as ``arg``: a function of the file or of the project that only calls its
    methods for their effect."""
    if arg.star:
        return "handed on with *"
    position = None if arg.keyword is not None else [a for a in call.args if a.keyword is None].index(arg)
    keyword = arg.keyword.value if arg.keyword is not None else None
    if _attached_to_an_engine(call, position, keyword):
        return None
    callee = analysis.code_of(call.func)
    if type(call.func) is cst.Name:
        own = _own_function(analysis, call.func.value, position, keyword, 0, results)
        if own is not _NOT_OWN:
            return own
    function = _project_function(analysis.path, analysis.resolve(call.func))
    if function is None:
        method = _project_method(analysis, call)
        if method is None:
            return f"handed to `{callee}`, which is not read"
        # A method of an object of a project class (deeplab's `self.summary.visualize_image(self.writer, ...)`):
        # its first parameter is the object.
        found = method
        assert isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef))
        shifted = position + 1 if position is not None else None
        return _parameter_blocks(found, found.node, shifted, keyword, 0, callee, _lines_of(found), results)
    found, definition = function
    return _parameter_blocks(found, definition, position, keyword, 0, callee, _lines_of(found), results)


def _project_method(analysis: FileAnalysis, call: cst.Call) -> Optional[Found]:
    """The method ``call`` calls on an object the file makes of a project class (``self.summary =
    TensorboardSummary(...)``, then ``self.summary.visualize_image(...)``), the same for every value the object may
    hold; None where it does not show."""
    func = call.func
    project = project_of(analysis.path)
    if type(func) is not cst.Attribute or project is None:
        return None
    found: Optional[Found] = None
    values = analysis.values
    for value in values.of(func.value, values.scope_of(call)):
        qualified = analysis.resolve(value.func) if type(value) is cst.Call else None
        cls = project.find(qualified) if qualified and not qualified.startswith(("torch.", "builtins.")) else None
        if cls is None or not isinstance(cls.node, ast.ClassDef):
            return None
        method = project.method(cls, func.attr.value)
        if method is None or (found is not None and method.node is not found.node):
            return None
        found = method
    return found


def _project_function(path: str, qualified: Optional[str]) -> Optional[tuple[Found, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """The project's function that ``qualified`` names, as the file at ``path`` sees it, and its definition; None for
    anything else."""
    project = project_of(path)
    if project is None or not qualified or qualified.startswith(("torch.", "builtins.")):
        return None
    found = project.find(qualified)
    if found is None or not isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return found, found.node


def _place(call: ast.Call, node: ast.Name) -> tuple[Optional[int], Optional[str]]:
    """Where ``call`` is given ``node``: its position among the arguments, or its keyword."""
    position = next((index for index, argument in enumerate(call.args) if argument is node), None)
    return position, next((k.arg for k in call.keywords if k.value is node), None)


def _attached_to_an_engine(call: cst.Call, position: Optional[int], keyword: Optional[str]) -> bool:
    """``engine.add_event_handler(event, handler, *args)`` (ignite's): the engine calls the handler at each event
    for its effect, and drops what it returns."""
    func = call.func
    if type(func) is not cst.Attribute or func.attr.value != "add_event_handler":
        return False
    return position == 1 or keyword == "handler"


def _lines_of(found: Found):
    module = os.path.relpath(found.module.path, found.seen_from)
    return lambda line: f"{module}:{line}"


def _parameter_blocks(
    found: Optional[Found],
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    position: Optional[int],
    keyword: Optional[str],
    depth: int,
    callee: str,
    where,
    results: bool | str = False,
    analysis: Optional[FileAnalysis] = None,
) -> Optional[str]:
    """Why the parameter (by ``position`` or ``keyword``) of ``function`` is used for more than its methods' effect.
    ``found`` is where ``function`` is in the project; None for a function of the file ``analysis`` reads."""
    parameters = [*function.args.posonlyargs, *function.args.args]
    if position is not None:
        if position >= len(parameters):
            return f"handed to `{callee}` past its parameters"
        name = parameters[position].arg
    else:
        name = keyword or ""
        if name not in {p.arg for p in [*parameters, *function.args.kwonlyargs]}:
            return f"handed to `{callee}` as `{name}`, which it does not name"
    parents = {id(child): node for node in ast.walk(function) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(function):
        if not (isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load)):
            continue
        parent = parents.get(id(node))
        if isinstance(parent, ast.Attribute):
            call = parents.get(id(parent))
            if isinstance(call, ast.Call) and call.func is parent and (results is True or isinstance(parents.get(id(call)), ast.Expr)):
                continue
            if results == LOGDIR and _reads_the_logdir_ast(parents, parent):
                continue
            return f"`{callee}` reads `{name}.{parent.attr}` ({where(node.lineno)})"
        if isinstance(parent, ast.Compare) and any(isinstance(c, ast.Constant) and c.value is None for c in parent.comparators):
            continue
        if isinstance(parent, ast.If) and parent.test is node:
            continue
        if isinstance(parent, (ast.Call, ast.keyword)) and depth < _MAX_DEPTH and (found is not None or analysis is not None):
            call = parent if isinstance(parent, ast.Call) else parents.get(id(parent))
            assert isinstance(call, ast.Call)
            if call.func is node:
                return f"`{callee}` calls `{name}` ({where(node.lineno)})"
            if found is not None:
                reason = _handed_on(found, call, node, depth, results)
            else:
                assert analysis is not None
                reason = _handed_on_in_file(analysis, call, node, depth, results)
            if reason is None:
                continue
            return reason
        return f"`{callee}` uses `{name}` otherwise ({where(node.lineno)})"
    return None


_NOT_OWN = "<not a function of the file>"


def _own_function(
    analysis: FileAnalysis, name: str, position: Optional[int], keyword: Optional[str], depth: int, results: bool | str
) -> Optional[str]:
    """``_parameter_blocks`` of the file's own function ``name``; ``_NOT_OWN`` when the file defines no one function of
    that name."""
    own = [f for f in analysis.tree.nodes(cst.FunctionDef) if f.name.value == name]
    if len(own) != 1:
        return _NOT_OWN
    parsed = ast.parse(analysis.code_of(own[0]).strip()).body[0]
    assert isinstance(parsed, ast.FunctionDef)
    first = analysis.position(own[0].name)[0] - 1
    return _parameter_blocks(None, parsed, position, keyword, depth, name, lambda line: f"line {first + line}", results, analysis)


def _handed_on_in_file(analysis: FileAnalysis, call: ast.Call, node: ast.Name, depth: int, results: bool | str) -> Optional[str]:
    """``node`` handed on by a function of the file to another: one of the file's own (by its name), or one that the
    file imports from the project (SfmLearner's ``validate(..., tb_writer)`` calling utils' ``log_output_tensorboard(tb_writer,
    ...)``)."""
    position, keyword = _place(call, node)
    callee = ast.unparse(call.func)
    if isinstance(call.func, ast.Name):
        own = _own_function(analysis, call.func.id, position, keyword, depth + 1, results)
        if own is not _NOT_OWN:
            return own
    # The file's imports name the callee (parsed again by LibCST, whose names the file's bindings resolve).
    try:
        qualified = names.resolve(analysis.bindings, cst.parse_expression(callee))
    except cst.ParserSyntaxError:
        qualified = None
    function = _project_function(analysis.path, qualified)
    if function is None:
        return f"handed on to `{callee}`, which is not read"
    found, definition = function
    return _parameter_blocks(found, definition, position, keyword, depth + 1, callee, _lines_of(found), results)


def _handed_on(found: Found, call: ast.Call, node: ast.Name, depth: int, results: bool | str) -> Optional[str]:
    project = project_of(found.module.path)
    if project is None:
        return "handed on"
    _, inner = project.resolve_in(found, call.func)
    if inner is None or not isinstance(inner.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return f"handed on to `{ast.unparse(call.func)}`, which is not read"
    position, keyword = _place(call, node)
    return _parameter_blocks(inner, inner.node, position, keyword, depth + 1, ast.unparse(call.func), _lines_of(inner), results)
