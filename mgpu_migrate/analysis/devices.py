"""The GPUs a DataParallel's ``device_ids`` chose, and whether the program knows them where it starts.

``--to ddp`` hands the GPUs a wrap chose to ``mgpu_runtime.setup(devices=...)``, which runs before the wrap
(``analysis.entrypoint``). That is the wrap's own expression written at the set-up (``args.gpus``), so it
must hold there what it holds at the wrap: every name it reads is bound where the set-up runs, and nothing
that may change it (an assignment to it or to what it is read from, ``del``, a method call on it, passing it
to a function that may change it) runs after the set-up. ``why_unknown`` says, in the message's words, why
an expression fails that, as conservatively as the flow index it reads is simple (aliases are not followed).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import libcst as cst

from mgpu_migrate.analysis.entrypoint import main_block, touches_cuda
from mgpu_migrate.analysis.project import freezes_parameter, project_of
from mgpu_migrate.analysis.scopes import Place, Scope, Slot
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.analysis.walk import children

if TYPE_CHECKING:
    from mgpu_migrate.analysis.parsed import ParsedFile

_DEVICE_COUNT = "torch.cuda.device_count"
# Builtins that neither change their arguments nor depend on anything but them.
_PURE_BUILTINS = frozenset(
    {"abs", "all", "any", "bool", "enumerate", "float", "format", "int", "isinstance", "len", "list", "map", "max",
     "min", "print", "range", "repr", "reversed", "set", "sorted", "str", "sum", "tuple", "vars", "zip"}
)
# (`vars(opt)` gives the namespace's own dict, which a caller could change; it is read: `yaml.dump(vars(opt), fp)`,
# `print(vars(args))`.)
# Methods of strings, lists, dicts and loggers that read their object without changing it.
_READING_METHODS = frozenset(
    {"copy", "count", "debug", "endswith", "format", "get", "index", "info", "items", "join", "keys", "lower",
     "replace", "split", "startswith", "strip", "upper", "values", "warning"}
)


def device_ids(call: cst.Call) -> Optional[cst.BaseExpression]:
    """The ``device_ids`` a DataParallel call is given, by keyword or second (None when absent or ``None``)."""
    chosen = next((arg for arg in call.args if arg.keyword is not None and arg.keyword.value == "device_ids"), None)
    leading = [arg for arg in call.args[:2] if arg.keyword is None and not arg.star]
    if chosen is None and len(leading) == 2 and call.args[1] is leading[1]:
        chosen = leading[1]
    if chosen is None or (type(chosen.value) is cst.Name and chosen.value.value == "None"):
        return None
    return chosen.value


def read_names(wraps: Iterable[cst.Call]) -> frozenset[str]:
    """The names the wraps' ``device_ids`` are read from (``args`` of ``device_ids=args.gpus``)."""
    return names_read(chosen for call in wraps if (chosen := device_ids(call)) is not None)


def paths_read(wraps: Iterable[cst.Call]) -> frozenset[str]:
    """What the wraps' ``device_ids`` read, as paths (``args.gpus``, ``gpu_ids[]``): whatever writes one of them, or
    what holds one (``args``), may change the GPUs chosen (``related``)."""
    return frozenset(
        _path(read) for call in wraps if (chosen := device_ids(call)) is not None for read in _reads(chosen, set())
        if _root(read) is not None
    )


def _path(node: cst.BaseExpression) -> str:
    """``args.gpus`` for that attribute chain, ``gpu_ids[]`` for a subscript of ``gpu_ids``."""
    if type(node) is cst.Attribute:
        return f"{_path(node.value)}.{node.attr.value}"
    if type(node) is cst.Subscript:
        return f"{_path(node.value)}[]"
    return node.value if type(node) is cst.Name else ""


def written_path(target: cst.BaseExpression) -> str:
    """The path an assignment target writes (``args.gpus``), as ``paths_read`` names them."""
    return _path(target)


def names_read(values: Iterable[cst.BaseExpression]) -> frozenset[str]:
    """The names the values are read from (``args`` of ``args.gpus``)."""
    return frozenset(root.value for value in values for read in _reads(value, set()) if (root := _root(read)) is not None)


def first_n(value: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """N for ``range(N)``, ``list(range(N))``, ``[i for i in range(N)]``, ``[0, 1, ..., N - 1]``."""
    if (type(value) is cst.List or type(value) is cst.Tuple) and value.elements and all(
        type(element.value) is cst.Integer and element.value.evaluated_value == index
        for index, element in enumerate(value.elements)
    ):
        return cst.Integer(str(len(value.elements)))
    if type(value) is cst.ListComp:
        loop = value.for_in
        # Only `[i for i in ...]` keeps every index: a condition or another expression picks GPUs.
        if loop.ifs or loop.inner_for_in is not None or not _same_name(value.elt, loop.target):
            return None
        value = loop.iter
    inner = _only_argument(value, "list")
    if inner is not None:
        value = inner
    return _only_argument(value, "range")


def every_visible(analysis: ParsedFile, value: cst.BaseExpression) -> bool:
    """``range(torch.cuda.device_count())`` and its spellings: what DDP runs on anyway."""
    count = first_n(value)
    return type(count) is cst.Call and analysis.resolve(count.func) == _DEVICE_COUNT


@dataclass(frozen=True)
class ChosenInMethod:
    """GPUs a method of the wraps' class chooses and keeps on ``self`` (``self.gpus = gpus`` in
    ``init_environment()``, which ``__init__`` calls before the method that wraps): the set-up goes right after
    ``anchor``, given ``devices``."""

    anchor: cst.BaseStatement
    devices: cst.BaseExpression
    method: str


def chosen_in_method(analysis: ParsedFile, wraps: Sequence[cst.Call]) -> Optional[ChosenInMethod]:
    """Where the set-up can be given the GPUs that the wraps' ``device_ids=self.X`` reads, when a method of their
    class chooses them: ``self.X`` is written once, by a method other than ``__init__`` that ``__init__`` calls
    (a statement of its own) before any method that wraps, and nothing before that write in ``__init__`` or in
    the method touches CUDA. The place is right after that write, or after the statement that binds the local
    it is written from (``gpus = visible_gpus(...)``), the GPUs' one binding in the method; None otherwise (a
    ``gpus`` given to the class, as a library's model is: its caller chooses them)."""
    chosen = [(call, value) for call in wraps if (value := device_ids(call)) is not None]
    if not chosen:
        return None
    first, value = chosen[0]
    if type(value) is not cst.Attribute or type(value.value) is not cst.Name:
        return None
    index = analysis.flow
    place = index.place_of(value, analysis.values.scope_of(first))
    if place is None or not place[0].is_class or place[1].count(".") != 1:
        return None
    if any(index.place_of(other, analysis.values.scope_of(call)) != place for call, other in chosen[1:]):
        return None
    stored = analysis.values.stored.get(place, [])
    if len(stored) != 1 or index.store_count(place) != 1:
        return None
    given, scope, _ = stored[0]
    method = scope.node
    init = place[0].functions.get("__init__")
    if type(method) is not cst.FunctionDef or scope.owner is not place[0] or init is None or method is init:
        return None
    calls = _own_calls(init, scope.self_name or "self")
    if method.name.value not in calls:
        return None
    for call, _ in chosen:
        wrapping = analysis.tree.function(call)
        if wrapping is None or wrapping is init or wrapping is method:
            return None
        if calls.get(wrapping.name.value, len(init.body.body)) < calls[method.name.value]:
            return None
    before = init.body.body[: calls[method.name.value]]
    if any(touches_cuda(analysis, statement) for statement in before):
        return None
    anchor = analysis.tree.statement(given)
    devices: cst.BaseExpression = value
    local = _one_local_binding(analysis, given, scope, anchor)
    if local is not None:
        anchor, devices = local, given
    if type(anchor) is not cst.SimpleStatementLine:
        return None
    line = analysis.position(anchor)[0]
    earlier = contains(method.body, lambda node: type(node) is cst.SimpleStatementLine)
    if any(analysis.position(statement)[0] < line and touches_cuda(analysis, statement) for statement in earlier):
        return None
    return ChosenInMethod(anchor, devices, method.name.value)


@dataclass(frozen=True)
class ChosenByCaller:
    """GPUs a script's main function chooses and hands the wraps' class inside a namespace it is given
    (pytorch-deeplab-xception's ``Trainer(args)``, which wraps on ``self.args.gpu_ids``): the set-up goes right
    after ``anchor``, a statement of that function, given ``devices`` in its names (``args.gpu_ids``)."""

    anchor: cst.BaseStatement
    devices: cst.BaseExpression
    function: str


def chosen_by_the_caller(analysis: ParsedFile, wraps: Sequence[cst.Call]) -> Optional[ChosenByCaller]:
    """Where the set-up can be given the GPUs that the wraps' ``device_ids=self.A.B`` reads, when ``self.A`` is a
    parameter of the class's ``__init__`` kept once (``self.args = args``), nothing in the file writes ``self.A.B``,
    and the file's main function builds the class once, as a statement of its body, given a name there for that
    parameter (``trainer = Trainer(args)``): the GPUs are then that name's ``B`` (``args.gpu_ids``), and the set-up
    goes after the main function's last statement before the build that writes it or binds the name, when every
    statement up to there parses the command line or only computes (``if args.cuda: try: args.gpu_ids = [int(s)
    for s in args.gpu_ids.split(',')] except ValueError: raise ...``), and none after it, up to the build, writes it.
    None otherwise."""
    from mgpu_migrate.analysis.entrypoint import _is_docstring, _targets, main_function, only_computes_or_refuses, parses_arguments

    chosen = [(call, value) for call in wraps if (value := device_ids(call)) is not None]
    if not chosen:
        return None
    first, value = chosen[0]
    if any(analysis.code_of(other) != analysis.code_of(value) for _, other in chosen[1:]):
        return None
    if type(value) is not cst.Attribute or type(value.value) is not cst.Attribute or type(value.value.value) is not cst.Name:
        return None
    index = analysis.flow
    scope_at = analysis.values.scope_of(first)
    holder = index.place_of(value.value, scope_at)
    whole = index.place_of(value, scope_at)
    if holder is None or not holder[0].is_class or holder[1].count(".") != 1 or whole is None:
        return None
    stored = analysis.values.stored.get(holder, [])
    if len(stored) != 1 or index.store_count(holder) != 1 or index.store_count(whole) != 0:
        return None
    given, scope, _ = stored[0]
    init = holder[0].functions.get("__init__")
    if init is None or scope.node is not init or type(given) is not cst.Name or given.value not in scope.params:
        return None
    cls = holder[0].node
    main = main_function(analysis)
    if type(cls) is not cst.ClassDef or main is None or type(main.body) is not cst.IndentedBlock:
        return None
    builds = [call for call in analysis.calls if type(call.func) is cst.Name and call.func.value == cls.name.value]
    body = list(main.body.body)
    statement = analysis.tree.statement(builds[0]) if len(builds) == 1 else None
    if statement not in body:
        return None
    name = _argument_of(init, builds[0], given.value)
    if type(name) is not cst.Name:
        return None
    attribute = value.attr.value
    devices = cst.Attribute(value=cst.Name(name.value), attr=cst.Name(attribute))
    built = body.index(statement)
    writes = [
        position
        for position, line in enumerate(body[:built])
        for target in _targets(line)
        if (type(target) is cst.Name and target.value == name.value)
        or (type(target) is cst.Attribute and analysis.code_of(target) == f"{name.value}.{attribute}")
    ]
    if not writes:
        return None
    last = writes[-1]
    if not all(
        parses_arguments(analysis, line) or only_computes_or_refuses(analysis, line) or _is_docstring(line)
        for line in body[: last + 1]
    ):
        return None
    return ChosenByCaller(body[last], devices, main.name.value)


def _argument_of(init: cst.FunctionDef, call: cst.Call, parameter: str) -> Optional[cst.BaseExpression]:
    """What ``call`` of a class gives its ``__init__``'s ``parameter``; None when it cannot be told."""
    positional = [param.name.value for param in (*init.params.posonly_params, *init.params.params)][1:]
    return argument_given(call, positional, parameter)


def argument_given(call: cst.Call, positional: Sequence[str], parameter: str) -> Optional[cst.BaseExpression]:
    """What ``call`` gives ``parameter`` of a function whose positional parameters are ``positional`` (``self``
    left out where the call binds it), by keyword or position; None when it cannot be told (a ``*args``)."""
    for position, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is not None:
            if arg.keyword.value == parameter:
                return arg.value
        elif position < len(positional) and positional[position] == parameter:
            return arg.value
    return None


def _own_calls(function: cst.FunctionDef, self_name: str) -> dict[str, int]:
    """The methods a function calls on ``self`` as statements of its own (``self.init_environment()``), by name,
    with the index of the first such statement."""
    found: dict[str, int] = {}
    body = function.body.body if type(function.body) is cst.IndentedBlock else []
    for position, statement in enumerate(body):
        if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1:
            continue
        small = statement.body[0]
        call = small.value if type(small) is cst.Expr else None
        if (
            type(call) is cst.Call
            and type(call.func) is cst.Attribute
            and type(call.func.value) is cst.Name
            and call.func.value.value == self_name
        ):
            found.setdefault(call.func.attr.value, position)
    return found


def _one_local_binding(
    analysis: ParsedFile, given: cst.BaseExpression, scope: Scope, written: Optional[cst.BaseStatement]
) -> Optional[cst.BaseStatement]:
    """The statement binding the local ``given`` (a name) once, in the block that writes it to ``self``, above."""
    if type(given) is not cst.Name or written is None:
        return None
    place = analysis.flow.place_of(given, scope)
    stored = analysis.values.stored.get(place, []) if place is not None else []
    if place is None or place[0] is not scope or len(stored) != 1 or analysis.flow.store_count(place) != 1:
        return None
    binding = analysis.tree.statement(stored[0][0])
    if binding is None or analysis.tree.parent(binding) is not analysis.tree.parent(written):
        return None
    return binding if analysis.position(binding) < analysis.position(written) else None


def why_unknown(
    analysis: ParsedFile, value: cst.BaseExpression, wrap: cst.Call, anchor: cst.CSTNode, after: bool
) -> Optional[str]:
    """Why ``value`` (a ``device_ids`` of ``wrap``) may not hold, right before ``anchor`` (right after it when
    ``after``), what it holds at the wrap; None when it holds the same there."""
    index = analysis.flow
    wrap_scope = analysis.values.scope_of(wrap)
    setup_function = analysis.tree.function(anchor)
    setup_scope = index.scopes[setup_function] if setup_function is not None else index.module_scope
    if not _runs_after(analysis, wrap, wrap_scope, setup_scope, anchor, after):
        return "the wrap runs before the set-up"
    for read in _reads(value, _comprehension_names(value)):
        if type(read) is cst.Call:
            return f"`{analysis.code_of(read.func)}(...)` chooses them"
        place = index.place_of(read, wrap_scope)
        if place is None:
            return f"`{analysis.code_of(read)}` is not followed"
        owner, path = place
        root = _root_name(path)
        handing = _handing_on(analysis, wrap_scope, root, setup_scope, anchor, after) if owner is wrap_scope else []
        if handing:
            # `main(args)` after the set-up: the parameter is the set-up's `args`, unless main() changes it.
            reason = _changed_after(analysis, place, value, setup_scope, anchor, after)
            if reason is not None:
                return f"`{analysis.code_of(read)}` {reason}"
            owner = setup_scope.lookup(root)
            place = (owner, path)
        outside = _outside_setup(analysis, read, place, wrap_scope) if owner is not setup_scope else None
        if outside is not None:
            return outside
        if owner is not setup_scope and owner is not index.module_scope:
            return f"`{root}` is local to {_function_name(owner)}()"
        if setup_scope.lookup(root) is not owner:
            return f"`{root}` is another name where the set-up runs"
        reason = _changed_after(analysis, place, value, setup_scope, anchor, after, handing)
        if reason is not None:
            return f"`{analysis.code_of(read)}` {reason}"
    return None


def _handing_on(
    analysis: ParsedFile, function_scope: Scope, name: str, setup_scope: Scope, anchor: cst.CSTNode, after: bool
) -> list[cst.Call]:
    """The calls of the function, when each runs where the set-up does, after it, handing its parameter ``name``
    the name of the same spelling there (``main(args)``); none otherwise."""
    function = function_scope.node
    if type(function) is not cst.FunctionDef or name not in function_scope.params:
        return []
    calls = analysis.flow.call_sites(function)
    for call, scope, implicit in calls:
        if scope is not setup_scope or not _runs_after(analysis, call, scope, setup_scope, anchor, after):
            return []
        given = [
            arg.value
            for position, arg in enumerate(call.args)
            if analysis.flow.parameter_place(function, call, position, implicit) == (function_scope, name)
        ]
        if len(given) != 1 or type(given[0]) is not cst.Name or given[0].value != name:
            return []
    return [call for call, _, _ in calls]


def what_they_are(analysis: ParsedFile, value: cst.BaseExpression, wrap: cst.Call) -> Optional[str]:
    """What a wrap's ``device_ids`` are, when its function is handed them (``self.gpus`` is the ``gpus`` given to
    ``BaseModel()``, ``gpus`` is a parameter of ``fit()``): what the program must pass to the set-up."""
    wrap_scope = analysis.values.scope_of(wrap)
    for read in _reads(value, _comprehension_names(value)):
        place = analysis.flow.place_of(read, wrap_scope) if type(read) is not cst.Call else None
        described = _outside_setup(analysis, read, place, wrap_scope) if place is not None else None
        if described is not None:
            return described
    return None


def _outside_setup(analysis: ParsedFile, read: cst.BaseExpression, place: Place, wrap_scope: Scope) -> Optional[str]:
    """A read that no set-up outside the wrap's function can name: an attribute, or the function's parameter."""
    owner, path = place
    if owner.is_class:
        return _attribute(analysis, place, analysis.code_of(read))
    root = _root_name(path)
    if owner is wrap_scope and root in owner.params:
        return f"`{root}` is a parameter of {_function_name(owner)}()"
    return None


def _root_name(path: str) -> str:
    return path.split(".", 1)[0].split("[", 1)[0]


def _comprehension_names(value: cst.BaseExpression) -> set[str]:
    """The names the comprehensions of an expression bind (``i`` of ``[gpus[i] for i in ...]``)."""
    return {
        name.value
        for loop in contains(value, lambda node: type(node) is cst.CompFor)
        for name in contains(loop.target, lambda node: type(node) is cst.Name)
    }


def _runs_after(
    analysis: ParsedFile, wrap: cst.Call, wrap_scope: Scope, setup_scope: Scope, anchor: cst.CSTNode, after: bool
) -> bool:
    if wrap_scope is not setup_scope:
        # A wrap at module level runs on import, before a set-up in a function; one in a function runs when called.
        return wrap_scope is not analysis.flow.module_scope
    if after:
        return anchor not in analysis.tree.ancestors(wrap) and analysis.position(wrap) > analysis.position(anchor)
    return analysis.position(wrap) >= analysis.position(anchor)


def _reads(value: cst.BaseExpression, local_names: set[str]) -> Iterator[cst.BaseExpression]:
    """The references ``value`` reads (``args.gpus``, ``cfg.GPU_ID``), and the calls it makes of anything but a
    reading builtin or method (``get_gpus()``), outside the names its comprehensions bind."""
    todo: list[cst.CSTNode] = [value]
    while todo:
        node = todo.pop()
        if not isinstance(node, cst.BaseExpression):
            todo.extend(children(node))
            continue
        root = _root(node) if type(node) in (cst.Name, cst.Attribute, cst.Subscript) else None
        if root is not None:
            if root.value not in local_names:
                yield node
            todo.extend(_indices(node))
            continue
        if type(node) is cst.Call:
            func = node.func
            if type(func) is cst.Name and func.value in _PURE_BUILTINS:
                todo.extend(arg.value for arg in node.args)
                continue
            if type(func) is cst.Attribute and func.attr.value in _READING_METHODS:
                todo.extend([func.value, *(arg.value for arg in node.args)])
                continue
            yield node
            continue
        if type(node) is cst.Lambda:
            yield cst.Call(cst.Name("lambda"))
            continue
        todo.extend(children(node))


def _root(node: cst.BaseExpression) -> Optional[cst.Name]:
    """The name a reference is read from: ``args`` of ``args.gpus[0]``."""
    while type(node) is cst.Attribute or type(node) is cst.Subscript:
        node = node.value
    return node if type(node) is cst.Name else None


def _indices(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """What the subscripts along a reference read (``i`` of ``args.gpus[i]``)."""
    found: list[cst.BaseExpression] = []
    while type(node) is cst.Attribute or type(node) is cst.Subscript:
        if type(node) is cst.Subscript:
            found += [element.slice.value for element in node.slice if type(element.slice) is cst.Index]
        node = node.value
    return found


def related(first: str, second: str) -> bool:
    """Whether writing one path may change the other: one is the other or holds it (``args``, ``args.gpus``,
    ``args.gpus[]``)."""
    shorter, longer = sorted((first, second), key=len)
    return longer == shorter or longer.startswith((shorter + ".", shorter + "["))


def _changed_after(
    analysis: ParsedFile,
    place: Place,
    value: cst.BaseExpression,
    setup_scope: Scope,
    anchor: cst.CSTNode,
    after: bool,
    handing: Iterable[cst.Call] = (),
) -> Optional[str]:
    """Why what ``place`` holds may change after the set-up ran (None when nothing may): every statement that
    writes it or what it is read from, and every call that may change it, runs before the set-up. The calls
    ``handing`` it to the wrap's function (whose changes to it were looked at there) do not count."""
    index = analysis.flow
    owner, path = place
    changes: list[cst.CSTNode] = [
        node
        for node, scope in index.stores.items()
        if isinstance(node, cst.BaseExpression)
        and (written := index.place_of(node, scope)) is not None
        and written[0] is owner
        and related(written[1], path)
    ]
    root = _root_name(path)
    bound = root in owner.params or analysis.bindings.imported.get(root) or any(
        type(node) is cst.Name and node.value == root for node in changes
    )
    if not bound:
        return "is bound nowhere in this file"
    inside = set(map(id, contains(value, lambda node: True)))
    handed = set(handing)
    prefixes = [path[: position] for position, letter in enumerate(path) if letter in ".["] + [path]
    frozen: list[cst.CSTNode] = []  # where it is frozen before the set-up (yacs's `cfg.freeze()`): no call changes it after
    for prefix in dict.fromkeys(prefixes):
        for node, _, slot in index.references((owner, prefix)):
            if id(node) not in inside and slot is not None and slot.parent not in handed and _may_change(analysis, slot, path, node):
                changes.append(node)
                if prefix == root and _freezes(analysis, node, slot) and _before_setup(analysis, node, setup_scope, anchor, after):
                    frozen.append(node)
    if frozen:
        at = min(analysis.position(node) for node in frozen)
        changes = [node for node in changes if node in index.stores or analysis.position(node) <= at]
    # The writes first (the calls that may change it after them), those of the path itself before those of what holds
    # it (Person_reID's `opt.gpu_ids = gpu_ids` before its `opt = parser.parse_args()`), each in the file's order.
    changes.sort(key=lambda node: (node not in index.stores, _written_path(index, node) != path, analysis.position(node)))
    stored = len(changes) - len([node for node in changes if node not in index.stores])
    for position, node in enumerate(changes):
        if not _before_setup(analysis, node, setup_scope, anchor, after):
            line, _ = analysis.position(node)
            # A value stored there (face.evoLVe's one `GPU_ID = cfg['GPU_ID']`) is set after the set-up; a call
            # handed it, or a method of it, may change it there.
            if position < stored:
                again = stored > 1 or root in owner.params  # a parameter came with a value
                return f"is set {'again ' if again else ''}at line {line}, after the set-up"
            return f"may change at line {line}, after the set-up"
    return None


def _freezes(analysis: ParsedFile, node: cst.CSTNode, slot: Slot) -> bool:
    """Whether the reference at ``slot`` makes its object immutable, as a yacs ``CfgNode`` is after ``freeze()``
    (a later write raises): ``cfg.freeze()``, or a call of a project function whose body ends by freezing the
    parameter it is handed there (HRNet's ``update_config(cfg, args)``: merges the YAML and the command line into
    ``cfg``, then ``cfg.freeze()``)."""
    parent = slot.parent
    if slot.kind == "attr" and type(parent) is cst.Attribute:
        return parent.attr.value == "freeze"
    if slot.kind != "arg" or type(parent) is not cst.Call:
        return False
    position = next((index for index, arg in enumerate(parent.args) if arg.value is node), None)
    if position is None or parent.args[position].keyword is not None:
        return False
    qualified = analysis.resolve(parent.func)
    project = project_of(analysis.path) if qualified else None
    found = project.find(qualified) if project is not None and qualified else None
    return found is not None and freezes_parameter(found, position)


def _written_path(index, node: cst.CSTNode) -> Optional[str]:
    """The path a store writes (None for a reference that a call may change)."""
    scope = index.stores.get(node)
    written = index.place_of(node, scope) if scope is not None and isinstance(node, cst.BaseExpression) else None
    return written[1] if written is not None else None


def _may_change(analysis: ParsedFile, slot: Slot, path: str = "", node: Optional[cst.CSTNode] = None) -> bool:
    """A reference that a call may change: passed to one (but a reading builtin, or a project class or function that
    writes no attribute of the name ``path`` ends with: RAFT's ``RAFT(args)``, which sets ``args.corr_levels`` but
    not ``args.gpus``), or its method called."""
    parent = slot.parent
    if slot.kind == "arg" and type(parent) is cst.Call:
        func = parent.func
        if type(func) is cst.Name and func.value in _PURE_BUILTINS:
            return False
        if type(func) is cst.Attribute and func.attr.value in _READING_METHODS:
            return False
        if analysis.resolve(func) in _READS_ITS_DEVICES:
            return False  # another wrap given the same GPUs (face.evoLVe's HEAD after its BACKBONE) copies them
        return node is None or not _leaves_alone(analysis, parent, node, path)
    if slot.kind == "attr" and type(parent) is cst.Attribute:
        method = analysis.flow.slots.get(parent)
        return method is not None and method.kind == "func" and parent.attr.value not in _READING_METHODS
    return False


# Wrappers that read the ``device_ids`` they are given (``list(device_ids)``, torch's ``_get_device_index``) and
# never change them.
_READS_ITS_DEVICES = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel.DataParallel"})


def _leaves_alone(analysis: ParsedFile, call: cst.Call, handed: cst.CSTNode, path: str) -> bool:
    """Whether the project definition ``call`` runs (a function, or a class: its ``__init__`` and every method) only
    reads the object ``handed`` to it (a reference in one of its arguments), or writes attributes of it other than
    the one ``path`` ends with (RAFT's ``RAFT(args)`` sets ``args.corr_levels``, never ``args.gpus``;
    ``fetch_optimizer(args, model)`` reads ``args.lr``): no method of it (yacs's ``cfg.merge_from_file``) or of that
    attribute is called, it is handed whole only to Python's readers or to project definitions that leave it alone
    too, and nothing is set by name (``setattr``, ``__dict__``). Then the call cannot change that attribute. A
    definition the project does not show may change anything."""
    attribute = path.rpartition(".")[2]
    if "." not in path or "[" in attribute or not attribute:
        return False
    project = project_of(analysis.path)
    if project is None:
        return False
    qualified = analysis.resolve(call.func)
    if type(call.func) is cst.Name and call.func.value in analysis.bindings.local:
        found = project.own(call.func.value, analysis.source)  # a function or class of this file
    elif qualified and not qualified.startswith(("torch.", "builtins.", "numpy.")):
        found = project.find(qualified)
    else:
        return False
    if found is None:
        return False
    arg = next((arg for arg in call.args if arg.value is handed or any(inner is handed for inner in contains(arg.value, lambda _: True))), None)
    if arg is None or arg.star:
        return False
    keyword = arg.keyword.value if arg.keyword is not None else None
    position = None if keyword is not None else [a for a in call.args if a.keyword is None].index(arg)
    return _only_reads(project, found, position, keyword, attribute, 0)


def _only_reads(project, found, position: Optional[int], keyword: Optional[str], attribute: str, depth: int) -> bool:
    """``_leaves_alone`` in a project definition given the object as its argument at ``position`` (or ``keyword``):
    followed into the project classes and functions it hands the object on to, a few calls deep."""
    node = found.node
    if depth > 3:
        return False
    init = next((item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"), None) if isinstance(node, ast.ClassDef) else node
    if not isinstance(init, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    parameters = [argument.arg for argument in init.args.args][1 if isinstance(node, ast.ClassDef) else 0 :]
    name = keyword if keyword is not None else (parameters[position] if position is not None and position < len(parameters) else None)
    if name is None or name not in parameters:
        return False
    held = {name} | {
        f"self.{target.attr}"
        for item in ast.walk(node)
        if isinstance(item, ast.Assign) and isinstance(item.value, ast.Name) and item.value.id == name
        for target in item.targets
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    }

    def held_root(expression: ast.expr) -> bool:
        return (isinstance(expression, ast.Name) and expression.id in held) or ast.unparse(expression) in held

    def reached(expression: ast.expr) -> bool:
        """``expression`` is the handed object itself, or the attribute watched of it (``args.gpus``,
        ``self.args.gpus[0]``): what a call given it, or a method called on it, may change. (``args.dropout``, another
        attribute, is no way to ``args.gpus``.)"""
        if held_root(expression):
            return True
        while isinstance(expression, (ast.Attribute, ast.Subscript)):
            if isinstance(expression, ast.Attribute) and expression.attr == attribute and held_root(expression.value):
                return True
            expression = expression.value
        return False

    for item in ast.walk(node):
        if isinstance(item, ast.Attribute) and isinstance(item.ctx, (ast.Store, ast.Del)) and item.attr == attribute and held_root(item.value):
            return False
        if isinstance(item, ast.Name) and item.id in ("setattr", "delattr"):
            return False
        if isinstance(item, ast.Attribute) and item.attr == "__dict__":
            return False
        if not isinstance(item, ast.Call):
            continue
        if isinstance(item.func, ast.Attribute) and reached(item.func.value):
            return False  # `cfg.merge_from_file(...)`
        if isinstance(item.func, ast.Name) and item.func.id in _PURE_BUILTINS - {"vars"}:
            continue
        given = [(index, None, value) for index, value in enumerate(item.args)] + [(None, k.arg, k.value) for k in item.keywords]
        for index, given_keyword, value in given:
            if not reached(value):
                continue
            if not held_root(value) or isinstance(value, ast.Starred) or (given_keyword is None and index is None):
                return False
            # handed on whole (`BasicUpdateBlock(self.args, hidden_dim=hdim)`): followed into that definition
            _, callee = project.resolve_in(found, item.func) if isinstance(item.func, (ast.Name, ast.Attribute)) else (None, None)
            if callee is None or not _only_reads(project, callee, index, given_keyword, attribute, depth + 1):
                return False
    return True


def _before_setup(analysis: ParsedFile, node: cst.CSTNode, setup_scope: Scope, anchor: cst.CSTNode, after: bool) -> bool:
    """Whether ``node`` runs before the set-up: in its block, above it; at module level, before the set-up's
    function is called (a function the file never calls runs after the whole module was imported)."""
    function = analysis.tree.function(node)
    scope = analysis.flow.scopes[function] if function is not None else analysis.flow.module_scope
    position = analysis.position(node)
    if scope is setup_scope:
        return position < analysis.position(anchor) or (after and anchor in analysis.tree.ancestors(node))
    setup_function = setup_scope.node
    if function is not None or type(setup_function) is not cst.FunctionDef:
        return False
    calls = analysis.flow.call_sites(setup_function)
    main = main_block(analysis.module)
    # The main block runs only when the file is the script: a write there counts once it precedes each call.
    in_main = main is not None and main in analysis.tree.ancestors(node)
    return (bool(calls) or not in_main) and all(position < analysis.position(call) for call, _, _ in calls)


def _attribute(analysis: ParsedFile, place: Place, text: str) -> str:
    """What an attribute holds, when the file stores it once: ``the `gpus` given to BaseModel()`` (a parameter
    of ``__init__``), else where it is set."""
    stored = analysis.values.stored.get(place, [])
    if len(stored) != 1 or analysis.flow.store_count(place) != 1:
        return f"`{text}` is an attribute"
    value, scope, _ = stored[0]
    function = scope.node
    if type(function) is not cst.FunctionDef:
        return f"`{text}` is an attribute"
    if type(value) is cst.Name and value.value in scope.params:
        cls = scope.owner.node if scope.owner is not None and function.name.value == "__init__" else None
        owner = cls.name.value if type(cls) is cst.ClassDef else None
        return f"`{text}` is the `{value.value}` given to {owner or function.name.value}()"
    line, _ = analysis.position(value)
    return f"`{text}` is an attribute set in {function.name.value}() (line {line})"


def _function_name(scope: Scope) -> str:
    node = scope.node
    return node.name.value if type(node) is cst.FunctionDef else "<module>"


def _only_argument(value: cst.BaseExpression, builtin: str) -> Optional[cst.BaseExpression]:
    """``x`` of ``builtin(x)``."""
    if type(value) is cst.Call and type(value.func) is cst.Name and value.func.value == builtin and len(value.args) == 1:
        return value.args[0].value
    return None


def _same_name(first: cst.BaseExpression, second: cst.BaseExpression) -> bool:
    return type(first) is cst.Name and type(second) is cst.Name and first.value == second.value
