"""A function that is ``torch.nn.parallel.data_parallel`` written out by hand, recognised statement by statement.

WaveRNN's ``data_parallel_workaround(model, *input)`` replicates the model over every GPU, scatters its inputs,
applies the replicas and gathers their outputs on the first GPU: torch's functional ``data_parallel`` step by
step (kept by hand for references it holds on to). Such a function, and only one whose statements are exactly
those steps on its own arguments, is ``data_parallel(model, input)`` (all GPUs, gathered on the first one,
along dimension 0), which ``--to balanced`` can then call in the runtime's form.

The matcher reads Python's ``ast`` (a project module is read that way; the file being migrated gives the
function's own text). Statements that only keep a reference in a global (``_output_ref = outputs`` after
``global _output_ref``) are allowed anywhere; anything else is not the shape.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

_REPLICATE = frozenset({"torch.nn.parallel.replicate", "torch.nn.parallel.replicate.replicate"})
_SCATTER = frozenset({"torch.nn.parallel.scatter", "torch.nn.parallel.scatter_gather.scatter"})
_APPLY = frozenset({"torch.nn.parallel.parallel_apply", "torch.nn.parallel.parallel_apply.parallel_apply"})
_GATHER = frozenset({"torch.nn.parallel.gather", "torch.nn.parallel.scatter_gather.gather"})
_DEVICE_COUNT = "torch.cuda.device_count"


@dataclass(frozen=True)
class DataParallelByHand:
    """The function's parameters: the module, and the inputs (``*input``: a tuple of arguments)."""

    module: str
    inputs: str
    starred: bool


def data_parallel_by_hand(
    function: ast.FunctionDef | ast.AsyncFunctionDef, qualified: Callable[[ast.expr], str | None]
) -> DataParallelByHand | None:
    """The function's parameters when its body is torch's ``data_parallel`` step by step, else None.
    ``qualified`` names a callee as the function's module imports it (``torch.nn.parallel.replicate``)."""
    if isinstance(function, ast.AsyncFunctionDef) or function.decorator_list:
        return None
    args = function.args
    if args.posonlyargs or args.kwonlyargs or args.kwarg or args.defaults or not args.args:
        return None
    if args.vararg is not None:
        if len(args.args) != 1:
            return None
        module, inputs, starred = args.args[0].arg, args.vararg.arg, True
    elif len(args.args) == 2:
        module, inputs, starred = args.args[0].arg, args.args[1].arg, False
    else:
        return None
    kept = {name for statement in function.body if isinstance(statement, ast.Global) for name in statement.names}
    steps = [statement for statement in function.body if not _aside(statement, kept)]
    if steps and _is_docstring(steps[0]):
        steps = steps[1:]
    return DataParallelByHand(module, inputs, starred) if _steps(steps, module, inputs, qualified) else None


def _aside(statement: ast.stmt, kept: set[str]) -> bool:
    """A ``global`` statement, or a reference kept in a global: ``_output_ref = outputs``."""
    if isinstance(statement, ast.Global):
        return True
    return (
        isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
        and statement.targets[0].id in kept
        and isinstance(statement.value, ast.Name)
    )


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) and isinstance(statement.value.value, str)


def _steps(steps: list[ast.stmt], module: str, inputs: str, qualified: Callable[[ast.expr], str | None]) -> bool:
    """``device_ids = list(range(torch.cuda.device_count()))`` [``output_device = device_ids[0]``],
    ``replicas = replicate(module, device_ids)``, ``scattered = scatter(inputs, device_ids)``
    [``replicas = replicas[:len(scattered)]``], ``outputs = parallel_apply(replicas, scattered)``,
    ``y = gather(outputs, output_device)``, ``return y``."""
    it = iter(steps)
    step = next(it, None)
    devices = _assigned(step)
    if devices is None or not _all_devices(step.value, qualified):  # type: ignore[union-attr]
        return False
    step = next(it, None)
    first = _assigned(step)
    output_device = None
    if first is not None and _is_first(step.value, devices):  # type: ignore[union-attr]
        output_device, step = first, next(it, None)
    replicas = _assigned(step)
    if replicas is None or not _call(step.value, _REPLICATE, [module, devices], qualified):  # type: ignore[union-attr]
        return False
    step = next(it, None)
    scattered = _assigned(step)
    if scattered is None or not _call(step.value, _SCATTER, [inputs, devices], qualified):  # type: ignore[union-attr]
        return False
    step = next(it, None)
    if _assigned(step) == replicas and _is_cut(step.value, replicas, scattered):  # type: ignore[union-attr]
        step = next(it, None)
    outputs = _assigned(step)
    if outputs is None or not _call(step.value, _APPLY, [replicas, scattered], qualified):  # type: ignore[union-attr]
        return False
    step = next(it, None)
    gathered = _assigned(step)
    target = [outputs, output_device] if output_device is not None else [outputs, 0]
    if gathered is None or not _call(step.value, _GATHER, target, qualified):  # type: ignore[union-attr]
        return False
    step = next(it, None)
    returned = isinstance(step, ast.Return) and isinstance(step.value, ast.Name) and step.value.id == gathered
    return returned and next(it, None) is None


def _assigned(statement: ast.stmt | None) -> str | None:
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
        return statement.targets[0].id
    return None


def _all_devices(value: ast.expr, qualified: Callable[[ast.expr], str | None]) -> bool:
    """``list(range(torch.cuda.device_count()))``."""
    if not (_is_builtin_call(value, "list") and len(value.args) == 1):  # type: ignore[attr-defined]
        return False
    inner = value.args[0]  # type: ignore[attr-defined]
    if not (_is_builtin_call(inner, "range") and len(inner.args) == 1):
        return False
    count = inner.args[0]
    return isinstance(count, ast.Call) and not count.args and not count.keywords and qualified(count.func) == _DEVICE_COUNT


def _is_builtin_call(value: ast.expr, name: str) -> bool:
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == name and not value.keywords


def _is_first(value: ast.expr, devices: str) -> bool:
    return (
        isinstance(value, ast.Subscript)
        and isinstance(value.value, ast.Name)
        and value.value.id == devices
        and isinstance(value.slice, ast.Constant)
        and value.slice.value == 0
    )


def _is_cut(value: ast.expr, replicas: str, scattered: str) -> bool:
    """``replicas[:len(scattered)]``."""
    if not (isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) and value.value.id == replicas):
        return False
    cut = value.slice
    return (
        isinstance(cut, ast.Slice)
        and cut.lower is None
        and cut.step is None
        and _is_builtin_call(cut.upper, "len")  # type: ignore[arg-type]
        and len(cut.upper.args) == 1  # type: ignore[union-attr]
        and isinstance(cut.upper.args[0], ast.Name)  # type: ignore[union-attr]
        and cut.upper.args[0].id == scattered  # type: ignore[union-attr]
    )


def _call(value: ast.expr, callees: frozenset[str], arguments: list, qualified: Callable[[ast.expr], str | None]) -> bool:
    """``callee(a, b)`` with exactly those positional arguments (names, or the constant 0)."""
    if not isinstance(value, ast.Call) or value.keywords or qualified(value.func) not in callees:
        return False
    if len(value.args) != len(arguments):
        return False
    for given, wanted in zip(value.args, arguments):
        if isinstance(wanted, str):
            if not (isinstance(given, ast.Name) and given.id == wanted):
                return False
        elif not (isinstance(given, ast.Constant) and given.value == wanted):
            return False
    return True


# Names the tool itself knows: never looked up in the project.
KNOWN_TOPS = frozenset({"torch", "mgpu_runtime", "apex", "encoding", "builtins", "os", "sys", "numpy", "math"})


def calls_of_data_parallel_by_hand(path: str, source: str, calls, resolve) -> frozenset:
    """The calls (LibCST ``cst.Call`` nodes among ``calls``) of a function that is torch's ``data_parallel`` by hand:
    one of this file (``source``) or one the file imports from the project (WaveRNN's ``data_parallel_workaround``
    in ``utils/__init__.py``). ``resolve`` names a callee through the file's imports. Such a call computes the
    gathered outputs of the module it is given, as the functional ``data_parallel`` does (a wrap site).

    As for the project's own DataParallel (``rules/project_wrappers.py``), only a callee whose name says
    "parallel" is looked up: reading the project behind every call would cost a large repository's check."""
    # Imported here: the project reading is only asked when a call's name says "parallel".
    import libcst as cst

    from mgpu_migrate.analysis.project import project_of, text_module

    found = []
    own = project = None
    for call in calls:
        func = call.func
        name = func.value if type(func) is cst.Name else func.attr.value if type(func) is cst.Attribute else ""
        if "parallel" not in name.lower():
            continue
        qualified = resolve(func)
        if qualified is None and type(func) is cst.Name:
            own = own or text_module(path, source)
            if own is None:
                continue
            definition = own.definitions.get(name)
            if isinstance(definition, ast.FunctionDef) and data_parallel_by_hand(definition, own.qualified):
                found.append(call)
            continue
        if qualified is None or qualified.split(".")[0].lstrip(".") in KNOWN_TOPS:
            continue
        project = project or project_of(path)
        if project is None:
            continue
        located = project.find(qualified)
        if located is not None and isinstance(located.node, ast.FunctionDef) and data_parallel_by_hand(located.node, located.module.qualified):
            found.append(call)
    return frozenset(found)
