"""Where a program starts: the place for ``mgpu_runtime.setup()`` under ``--to ddp``.

``mgpu_runtime.setup()`` must run once, before any model or tensor touches CUDA (it binds the process to its
GPU) and after the script has chosen its GPUs with ``CUDA_VISIBLE_DEVICES``. The places, in order:

* a flat script (a training loop at module level, or CUDA touched at module level): right after its
  imports, or after its last module-level ``CUDA_VISIBLE_DEVICES`` assignment;
* the function the ``if __name__ == "__main__":`` block calls first, when that function sets
  ``CUDA_VISIBLE_DEVICES`` itself (right after it does);
* in a method of the wraps' class that chooses their GPUs (``self.gpus = gpus`` in ``init_environment()``,
  which ``__init__`` calls before the method that wraps), right where it chooses them, given them
  (``analysis.devices.chosen_in_method``), in a script whose main block or ``main()`` starts the program, or in
  a module that trains nothing itself (a class that holds the model for subclasses elsewhere, st-gcn's ``IO``);
* in the main function that hands the wraps' class its GPUs inside a namespace (pytorch-deeplab-xception's
  ``Trainer(args)``, wrapping on ``self.args.gpu_ids``), right after it chooses them, given them
  (``analysis.devices.chosen_by_the_caller``);
* in the function the ``if __name__ == "__main__":`` block calls first, right after its leading statements
  that parse the command line, when a wrap's ``device_ids`` reads what they bind (``args.gpus``): the set-up
  is given those GPUs (``setup(devices=args.gpus)``);
* the top of the ``if __name__ == "__main__":`` block;
* a module without a main block: the top of its ``def main()``, or of the function its project installs as a
  command (a console script: BERT-pytorch's ``train()`` in ``__main__.py``), after its command line is parsed
  when the GPUs it hands on are read from it.

Statements that only parse the command line stay before it (with the paths computed among them, ``os.path`` only), so ``--help`` or a bad argument stops the
script before any other process starts.

Module-level code that the migration makes ask the runtime (darts's run directory, named by the clock and made
on the main process) does not move the set-up: the runtime answers such a call before ``setup()`` by setting up
first, which relaunches a plain start right there (``mgpu_runtime.distributed.process_group``).

A module with none of these (a library of helpers, a snippet that only wraps) gets no call; the runtime's
wrapper calls ``setup()`` itself when it is first built, so such a file still works, only later.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import libcst as cst

from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.analysis.project import project_of

if TYPE_CHECKING:
    from mgpu_migrate.analysis.parsed import ParsedFile

RUNTIME_SETUP = "mgpu_runtime.setup"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

_CUDA_WORDS = re.compile(r"cuda|device|gpu", re.IGNORECASE)
# torch.cuda functions that ask about devices without binding the process to one.
HARMLESS_CUDA = {"is_available", "device_count", "manual_seed", "manual_seed_all", "get_device_name"}


@dataclass(frozen=True)
class EntryPoint:
    """``mgpu_runtime.setup()`` goes right before ``anchor`` (or right after it when ``after``)."""

    anchor: cst.BaseStatement
    after: bool
    place: str
    # The GPUs the set-up is given there, when the place is where a method chooses them (``ChosenInMethod``).
    devices: Optional[cst.BaseExpression] = None
    # The test under which it is set up (a click group's commands that wrap: ``ctx.invoked_subcommand in
    # ("train", "test")``), when some of the program's commands run without a model.
    when: Optional[str] = None


# -- statements ------------------------------------------------------------------------------------
def is_main_guard(statement: cst.CSTNode) -> bool:
    """``if __name__ == "__main__":`` (either way round)."""
    if type(statement) is not cst.If or type(statement.test) is not cst.Comparison:
        return False
    test = statement.test
    if len(test.comparisons) != 1 or type(test.comparisons[0].operator) is not cst.Equal:
        return False
    sides = {_literal_or_name(test.left), _literal_or_name(test.comparisons[0].comparator)}
    return sides == {"__name__", "'__main__'"}


def _literal_or_name(node: cst.BaseExpression) -> Optional[str]:
    if type(node) is cst.Name:
        return node.value
    if type(node) is cst.SimpleString:
        return repr(node.evaluated_value)
    return None


def main_block(module: cst.Module) -> Optional[cst.If]:
    return next((statement for statement in module.body if is_main_guard(statement)), None)


def _is_string(node: cst.BaseExpression, value: str) -> bool:
    return type(node) is cst.SimpleString and node.evaluated_value == value


def sets_cuda_visible_devices(statement: cst.CSTNode) -> bool:
    """``os.environ["CUDA_VISIBLE_DEVICES"] = ...`` or ``os.environ.setdefault("CUDA_VISIBLE_DEVICES", ...)``."""
    if type(statement) is not cst.SimpleStatementLine:
        return False
    for small in statement.body:
        if type(small) is cst.Assign and any(_names_cuda_visible_devices(t.target) for t in small.targets):
            return True
        if type(small) is cst.Expr and type(small.value) is cst.Call:
            call = small.value
            if (
                type(call.func) is cst.Attribute
                and call.func.attr.value in ("setdefault", "putenv", "__setitem__")
                and call.args
                and _is_string(call.args[0].value, CUDA_VISIBLE_DEVICES)
            ):
                return True
    return False


def sets_them_in_the_project(analysis: ParsedFile, statement: cst.CSTNode) -> bool:
    """A statement that calls a function of the project's own modules which sets ``CUDA_VISIBLE_DEVICES``
    (pytorch-playground's ``args.gpu = misc.auto_select_gpu(..., selected_gpus=args.gpu)``)."""
    if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1:
        return False
    small = statement.body[0]
    call = small.value if type(small) in (cst.Expr, cst.Assign) else None
    if type(call) is not cst.Call:
        return False
    qualified = analysis.resolve(call.func)
    if not qualified or qualified.split(".")[0] in ("torch", "builtins", "os", "mgpu_runtime"):
        return False
    from mgpu_migrate.analysis.project import project_of

    project = project_of(analysis.path)
    found = project.find(qualified) if project is not None else None
    if found is None or not isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    for node in ast.walk(found.node):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("setdefault", "putenv"):
            targets = [node.args[0]] if node.args else []
        for target in targets:
            named = target.slice if isinstance(target, ast.Subscript) else target
            if isinstance(named, ast.Constant) and named.value == CUDA_VISIBLE_DEVICES:
                return True
    return False


def _names_cuda_visible_devices(target: cst.BaseExpression) -> bool:
    return (
        type(target) is cst.Subscript
        and len(target.slice) == 1
        and type(target.slice[0].slice) is cst.Index
        and _is_string(target.slice[0].slice.value, CUDA_VISIBLE_DEVICES)
    )


def touches_cuda(analysis: ParsedFile, statement: cst.CSTNode) -> bool:
    """Whether a statement may bind the process to a GPU: ``.cuda()``, ``.to(...)`` a device or a GPU's number,
    a tensor made with ``device=`` one, ``torch.cuda.*``."""

    def names_gpu(value: cst.BaseExpression) -> bool:
        return bool(_CUDA_WORDS.search(analysis.code_of(value))) or _names_gpu_number(value)

    def binds(node: cst.CSTNode) -> bool:
        if type(node) is not cst.Call:
            return False
        # `torch.zeros(n, device="cuda")`, `torch.randn(..., device=0)`: a tensor made on a GPU
        # (`torch.device("cuda")` itself only names one).
        made_on = next((arg.value for arg in node.args if arg.keyword and arg.keyword.value == "device"), None)
        if made_on is not None and names_gpu(made_on) and analysis.resolve(node.func) != "torch.device":
            return True
        if type(node.func) is not cst.Attribute:
            return False
        if node.func.attr.value == "cuda":
            return True
        if node.func.attr.value == "to":
            return any(names_gpu(arg.value) for arg in node.args)
        qualified = analysis.resolve(node.func) or ""
        return qualified.startswith("torch.cuda.") and qualified.rsplit(".", 1)[1] not in HARMLESS_CUDA

    return bool(contains(statement, binds))


def _names_gpu_number(value: cst.BaseExpression) -> bool:
    """``0``, ``0 if use_cuda else "cpu"``: a GPU by its number."""
    if type(value) is cst.IfExp:
        return _names_gpu_number(value.body) or _names_gpu_number(value.orelse)
    return type(value) is cst.Integer


def _is_docstring(statement: cst.CSTNode) -> bool:
    return (
        type(statement) is cst.SimpleStatementLine
        and len(statement.body) == 1
        and type(statement.body[0]) is cst.Expr
        and type(statement.body[0].value) in (cst.SimpleString, cst.ConcatenatedString)
    )


def _is_import(statement: cst.CSTNode) -> bool:
    return type(statement) is cst.SimpleStatementLine and all(
        type(small) in (cst.Import, cst.ImportFrom) for small in statement.body
    )


_PARSER_METHODS = {
    "add_argument",
    "add_argument_group",
    "add_mutually_exclusive_group",
    "set_defaults",
    "parse_args",
    "parse_known_args",
}
_PARSER_FUNCTIONS = {"parse_args", "get_args", "parse_arguments", "get_arguments", "get_parser", "build_parser"}


# -- the entry point -------------------------------------------------------------------------------
def _at_top(
    analysis: ParsedFile, body: list[cst.BaseStatement], place: str, skip_docstring: bool
) -> Optional[EntryPoint]:
    """Setup right after the block's last statement that sets ``CUDA_VISIBLE_DEVICES`` (also inside an ``if``
    or ``with`` there), else at its top, after the command line is parsed (so ``--help`` or a bad argument
    stops before any process starts)."""
    chosen = [statement for statement in body if _chooses_them(analysis, statement)]
    if chosen:
        return EntryPoint(chosen[-1], True, f"after CUDA_VISIBLE_DEVICES is set {place.replace('at the top of ', 'in ', 1)}")
    start = first = 1 if skip_docstring and body and _is_docstring(body[0]) else 0
    parsed = start
    while parsed < len(body):
        statement = body[parsed]
        if parses_arguments(analysis, statement) or _is_global(statement):
            start = parsed + 1
        elif not (_computes_a_path(analysis, statement) or _refuses_to_run(statement) or _is_docstring(statement)):
            # A path computed between two parser statements stays with them, and so does a string that heads a
            # group of arguments (deep-text-recognition's `""" Data processing """`); one after them goes below.
            break
        parsed += 1
    if parsed > first:
        place = f"{place.replace('at the top of ', 'in ', 1)}, after its command-line parser"
    if start < len(body):
        return EntryPoint(body[start], False, place)
    return EntryPoint(body[-1], True, place) if body else None


def _refuses_to_run(statement: cst.CSTNode) -> bool:
    """``if sys.version_info[0] < 3: raise Exception(...)`` before the parser (first-order-model's run.py): a check
    that calls nothing and only raises, which stays before the set-up with the parser after it."""
    if type(statement) is not cst.If or statement.orelse is not None or contains(statement.test, lambda node: type(node) is cst.Call):
        return False
    body = statement.body.body if type(statement.body) is cst.IndentedBlock else ()
    return bool(body) and all(
        type(line) is cst.SimpleStatementLine and all(type(small) is cst.Raise for small in line.body) for line in body
    )


def _computes_a_path(analysis: ParsedFile, statement: cst.CSTNode) -> bool:
    """``working_dir = osp.dirname(osp.abspath(__file__))`` among a parser's declarations (open-reid's examples):
    names and ``os.path`` functions only, which touch nothing."""
    if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1 or type(statement.body[0]) is not cst.Assign:
        return False
    calls = contains(statement.body[0].value, lambda node: type(node) is cst.Call)
    return bool(calls) and all((analysis.resolve(call.func) or "").startswith(("os.path.", "posixpath.")) for call in calls)


def _is_global(statement: cst.CSTNode) -> bool:
    return type(statement) is cst.SimpleStatementLine and all(type(small) is cst.Global for small in statement.body)


def _parses(analysis: ParsedFile, body: list[cst.BaseStatement]) -> set[str]:
    """The names the block's leading statements that parse the command line bind (``args``)."""
    bound: set[str] = set()
    start = 1 if body and _is_docstring(body[0]) else 0
    for statement in body[start:]:
        if _is_global(statement):
            continue
        if not parses_arguments(analysis, statement):
            break
        for small in statement.body:
            if type(small) is cst.Assign:
                bound |= {target.target.value for target in small.targets if type(target.target) is cst.Name}
    return bound


def parses_arguments(analysis: ParsedFile, statement: cst.CSTNode) -> bool:
    """A statement that only builds or runs the command-line parser (``args = parser.parse_args()``)."""
    if type(statement) is not cst.SimpleStatementLine:
        return False
    for small in statement.body:
        value = small.value if type(small) in (cst.Assign, cst.Expr) else None
        if type(value) is not cst.Call:
            return False
        func = value.func
        if type(func) is cst.Attribute and func.attr.value in _PARSER_METHODS:
            continue
        if type(func) is cst.Name and func.value in _PARSER_FUNCTIONS and not _shows_something(analysis, func.value):
            continue
        if analysis.resolve(func) != "argparse.ArgumentParser":
            return False
    return True


_SHOWING_CALLS = {"print", "pprint", "open", "info", "warning", "debug", "error", "write", "dump", "makedirs", "mkdir"}


def _shows_something(analysis: ParsedFile, name: str) -> bool:
    """Whether this file's own ``parse_args()``-named function also prints, logs or writes (Fast-SCNN's prints
    the arguments): then it is not parsing alone, and every process would do it before the set-up."""
    for statement in analysis.module.body:
        if type(statement) is cst.FunctionDef and statement.name.value == name:
            return bool(contains(statement, _is_showing_call))
    return False


def _is_showing_call(node: cst.CSTNode) -> bool:
    if type(node) is not cst.Call:
        return False
    func = node.func
    called = func.value if type(func) is cst.Name else func.attr.value if type(func) is cst.Attribute else None
    return called in _SHOWING_CALLS


def _chooses_them(analysis: ParsedFile, statement: cst.CSTNode) -> bool:
    """A statement of a function's block that sets ``CUDA_VISIBLE_DEVICES``, itself or through a helper of the
    project it calls (playground's ``misc.auto_select_gpu``)."""
    return chooses_visible_devices(statement) or sets_them_in_the_project(analysis, statement)


def chooses_visible_devices(statement: cst.CSTNode) -> bool:
    """A statement of a block that sets ``CUDA_VISIBLE_DEVICES``, also inside an ``if``, ``with`` or ``try`` there."""
    return sets_cuda_visible_devices(statement) or (
        type(statement) in (cst.If, cst.With, cst.Try) and bool(contains(statement, sets_cuda_visible_devices))
    )


def _after_imports(analysis: ParsedFile, device_names: frozenset[str] = frozenset()) -> Optional[EntryPoint]:
    body = list(analysis.module.body)
    index = 0
    while index < len(body) and (
        _is_docstring(body[index]) or _is_import(body[index]) or parses_arguments(analysis, body[index])
    ):
        index += 1
    chosen = [i for i, statement in enumerate(body) if sets_cuda_visible_devices(statement)]
    # ... or calls a helper of the project that sets it, after its command line is parsed (the helper may read it).
    chosen += [i for i in range(index, len(body)) if sets_them_in_the_project(analysis, body[i])]
    chosen.sort()
    place = "after the imports"
    if chosen and chosen[-1] >= index - 1:
        helper = not sets_cuda_visible_devices(body[chosen[-1]])
        return EntryPoint(body[chosen[-1]], True, f"after the {'project helper that' if helper else 'script'} sets CUDA_VISIBLE_DEVICES")
    read = _reads_the_gpus(analysis, body, index, device_names)
    if read is not None:
        return EntryPoint(body[read], True, "after the script reads the GPUs it uses")
    if index < len(body):
        return EntryPoint(body[index], False, place)
    return EntryPoint(body[-1], True, place) if body else None


def _reads_the_gpus(
    analysis: ParsedFile, body: list[cst.BaseStatement], start: int, device_names: frozenset[str]
) -> Optional[int]:
    """For a flat script whose wraps' ``device_ids`` read names it binds at module level (Person_reID's
    ``opt.gpu_ids``: parsed as a string, then ``opt.gpu_ids = gpu_ids``, the list of numbers made from it), the
    index of the last module-level statement that writes one of them, when every statement from ``start`` to it
    only computes values (``_only_computes``): the set-up goes after it and is given them. None otherwise."""
    from mgpu_migrate.analysis.devices import paths_read, related, written_path

    if not device_names:
        return None
    paths = paths_read(site.call for site in analysis.models.sites)
    last = None
    for position in range(start, len(body)):
        for target in _targets(body[position]):
            targets = [target.elements] if type(target) in (cst.Tuple, cst.List) else [[target]]
            for element in targets[0]:
                node = element.value if type(element) in (cst.Element, cst.StarredElement) else element
                if any(related(written_path(node), path) for path in paths):
                    last = position
    if last is None or not all(
        _is_import(statement) or parses_arguments(analysis, statement) or _only_computes(analysis, statement)
        for statement in body[start : last + 1]
    ):
        return None
    return last


def _targets(statement: cst.CSTNode) -> list[cst.BaseExpression]:
    """What a module-level statement assigns, in it and in the blocks under it (a loop's target too)."""
    found: list[cst.BaseExpression] = []
    for node in contains(statement, lambda node: type(node) in (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For)):
        if type(node) is cst.Assign:
            found += [target.target for target in node.targets]
        else:
            found.append(node.target)
    return found


# The calls a statement before the set-up may make: they compute values and touch nothing outside the process.
_COMPUTING = {
    "int", "float", "str", "bool", "len", "range", "list", "tuple", "dict", "set", "sorted", "enumerate", "zip",
    "map", "min", "max", "abs", "round", "isinstance", "getattr", "hasattr",
}
_COMPUTING_METHODS = {
    "split", "strip", "rstrip", "lstrip", "lower", "upper", "replace", "join", "format", "append", "extend",
    "get", "items", "keys", "values", "startswith", "endswith",
}
_COMPUTING_QUALIFIED = {
    "matplotlib.use", "warnings.filterwarnings", "warnings.simplefilter", "torch.manual_seed", "numpy.random.seed",
    "random.seed", "torch.set_default_dtype", *(f"torch.cuda.{name}" for name in HARMLESS_CUDA),
}


def _only_computes(analysis: ParsedFile, statement: cst.CSTNode) -> bool:
    """A statement that only computes values from what the script has (``fp16 = opt.fp16``, ``for s in
    str_ids: gpu_ids.append(int(s))``): every call it makes is one of a few builtins or string, list and dict
    methods, a seed, or a question to torch.cuda that binds no GPU (``device_count()``), and it has no ``print``,
    ``with``, ``try``, function or class. Such statements may run before the
    set-up: they print, write and touch no GPU, so running them also in the launching process changes nothing."""
    if type(statement) in (cst.FunctionDef, cst.ClassDef, cst.With, cst.Try, cst.While):
        return False
    if type(statement) is cst.SimpleStatementLine and not all(
        type(small) in (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Expr, cst.Pass) for small in statement.body
    ):
        return False
    for node in contains(statement, lambda node: type(node) in (cst.Call, cst.With, cst.Try, cst.Lambda, cst.Await)):
        if type(node) is not cst.Call:
            return False
        func = node.func
        if type(func) is cst.Name and func.value in _COMPUTING and func.value not in analysis.bindings.local:
            continue
        if type(func) is cst.Attribute and func.attr.value in _COMPUTING_METHODS:
            continue
        if analysis.resolve(func) in _COMPUTING_QUALIFIED:
            continue
        return False
    return True


def only_computes_or_refuses(analysis: ParsedFile, statement: cst.CSTNode) -> bool:
    """``_only_computes``, or an ``if`` or ``try`` whose statements only compute or raise, with tests that call
    nothing (pytorch-deeplab-xception's ``if args.cuda: try: args.gpu_ids = [int(s) for s in
    args.gpu_ids.split(',')] except ValueError: raise ValueError(...)``)."""
    if _only_computes(analysis, statement):
        return True
    if type(statement) not in (cst.If, cst.Try):
        return False
    tests = [node.test for node in contains(statement, lambda node: type(node) is cst.If)]
    tests += [handler.type for handler in contains(statement, lambda node: type(node) is cst.ExceptHandler) if handler.type]
    if any(contains(test, lambda node: type(node) is cst.Call) for test in tests):
        return False
    if contains(statement, lambda node: type(node) in (cst.FunctionDef, cst.ClassDef, cst.With, cst.While, cst.For)):
        return False
    lines = contains(statement, lambda node: type(node) is cst.SimpleStatementLine)
    return all(
        all(type(small) is cst.Raise for small in line.body) or _only_computes(analysis, line) for line in lines
    )


def _first_called_function(analysis: ParsedFile, block: cst.If) -> Optional[cst.FunctionDef]:
    """The function of this file that the main block calls first, after parsing the command line: ``main()``,
    ``sys.exit(main(args))``."""
    body = (
        [s for s in block.body.body if not parses_arguments(analysis, s)]
        if type(block.body) is cst.IndentedBlock
        else []
    )
    if not body or type(body[0]) is not cst.SimpleStatementLine:
        return None
    small = body[0].body[0]
    value = small.value if type(small) in (cst.Expr, cst.Assign) else None
    while type(value) is cst.Call:
        if type(value.func) is cst.Name:
            function = _top_level_function(analysis.module, value.func.value)
            if function is not None:
                return function
        value = value.args[0].value if value.args else None
    return None


def main_function(analysis: ParsedFile) -> Optional[cst.FunctionDef]:
    """The function the program runs as its main one: the first the main block calls (``main()``), or, without a
    main block, a top-level ``def main()``."""
    block = main_block(analysis.module)
    if block is not None:
        return _first_called_function(analysis, block)
    return _main_without_block(analysis)


def _top_level_function(module: cst.Module, name: str) -> Optional[cst.FunctionDef]:
    for statement in module.body:
        if type(statement) is cst.FunctionDef and statement.name.value == name:
            return statement
    return None


def find_entry_point(
    analysis: ParsedFile,
    training_loops: Sequence[cst.For | cst.Call],
    device_names: frozenset[str] = frozenset(),
    chosen_in_method: Optional[EntryPoint] = None,
) -> Optional[EntryPoint]:
    """The place for ``setup()`` (see the module doc); ``training_loops``: the file's (``LoaderFlow``), and the
    calls that run a training loop of the project's code (``analysis.handed``);
    ``device_names``: the names the wraps' ``device_ids`` read (``args`` of ``args.gpus``);
    ``chosen_in_method``: the place in a method of the wraps' class that chooses their GPUs, if any."""
    module = analysis.module
    main = main_block(module)
    tree = analysis.tree
    module_code = [
        statement
        for statement in module.body
        if statement is not main and type(statement) not in (cst.FunctionDef, cst.ClassDef)
    ]
    trains_at_module_level = any(
        tree.function(loop) is None and main not in tree.ancestors(loop) for loop in training_loops
    ) or _called_at_module_level(analysis, module_code, training_loops)
    if trains_at_module_level or any(touches_cuda(analysis, statement) for statement in module_code):
        return _after_imports(analysis, device_names)
    if chosen_in_method is not None and (
        main is not None or _main_without_block(analysis) is not None or not training_loops
    ):
        # Also in a module that trains nothing itself: its class hands the model on (st-gcn's IO to the processors
        # deriving from it), and the script that starts them leaves the set-up to this one.
        return chosen_in_method
    if main is not None and type(main.body) is not cst.IndentedBlock:
        return None
    function = _first_called_function(analysis, main) if main is not None else _main_without_block(analysis)
    group = _commands_that_wrap(analysis, function) if function is not None else None
    if group is not None:
        return group
    if function is not None and type(function.body) is cst.IndentedBlock:
        body = list(function.body.body)
        if any(_chooses_them(analysis, statement) for statement in body):
            return _at_top(analysis, body, f"in {function.name.value}()", skip_docstring=True)
        if _parses(analysis, body) & device_names:
            # (_at_top says "after its command-line parser")
            return _at_top(analysis, body, f"in {function.name.value}()", skip_docstring=True)
        filled = _config_filled(analysis, body, device_names)
        if filled is not None:
            return filled
    if main is not None:
        assigned = _devices_assigned(analysis, list(main.body.body), device_names)
        if assigned is not None:
            return assigned
        return _at_top(analysis, list(main.body.body), 'at the top of the `if __name__ == "__main__":` block', False)
    if function is not None and type(function.body) is cst.IndentedBlock:
        return _at_top(analysis, list(function.body.body), f"at the top of {function.name.value}()", skip_docstring=True)
    return None


def _devices_assigned(analysis: ParsedFile, body: list[cst.BaseStatement], device_names: frozenset[str]) -> Optional[EntryPoint]:
    """The place right after the block's statement that assigns the name the wraps read their GPUs from, when
    every statement up to it only imports, parses or computes (face.evoLVe's main block: ``cfg =
    configurations[1]``, ``GPU_ID = cfg['GPU_ID']``, then ``device_ids=GPU_ID``): the set-up there is given them
    (MGP150), and nothing before it prints, writes or binds a GPU. None otherwise."""
    if not device_names:
        return None
    last = None
    for index, statement in enumerate(body):
        if type(statement) is cst.SimpleStatementLine and any(
            type(small) is cst.Assign and any(type(target.target) is cst.Name and target.target.value in device_names for target in small.targets)
            for small in statement.body
        ):
            last = index
    if last is None or parses_arguments(analysis, body[last]):
        return None  # (the command line parsed: the set-up goes after the parser, ``_at_top``)
    if not all(_prepares(analysis, statement) for statement in body[: last + 1]):
        return None
    names = sorted(name for name in device_names if _binds_name(body[last], name))
    return EntryPoint(body[last], True, f"after `{names[0] if names else 'the GPUs'}` is set, in the `if __name__ == \"__main__\":` block")


def _config_filled(analysis: ParsedFile, body: list[cst.BaseStatement], device_names: frozenset[str]) -> Optional[EntryPoint]:
    """The main function's place after the call that fills the configuration the wraps read their GPUs from
    (HRNet's ``update_config(cfg, args)``, merging the YAML and the command line into the module-level ``cfg``
    that ``device_ids=cfg.GPUS`` reads), when nothing before it binds a GPU: the set-up goes right after the last
    such call of a project function, so it is given the GPUs the run chose."""
    project = project_of(analysis.path)
    if project is None:
        return None
    handed = [
        statement
        for statement in body
        if type(statement) is cst.SimpleStatementLine
        and len(statement.body) == 1
        and type(statement.body[0]) is cst.Expr
        and type(call := statement.body[0].value) is cst.Call
        and any(type(arg.value) is cst.Name and arg.value.value in device_names for arg in call.args)
        and (qualified := analysis.resolve(call.func)) is not None
        and project.find(qualified) is not None  # the project's own function (not `logger.info(cfg)`)
    ]
    if not handed:
        return None
    last = handed[-1]
    if any(touches_cuda(analysis, statement) for statement in body[: body.index(last) + 1]):
        return None
    call = last.body[0].value
    assert type(call) is cst.Call
    return EntryPoint(last, True, f"after `{analysis.code_of(call.func)}(...)` fills what the wraps read their GPUs from")


def _commands_that_wrap(analysis: ParsedFile, group: cst.FunctionDef) -> Optional[EntryPoint]:
    """A click group the main block runs (deeplab-pytorch's ``main``: ``@click.group()``, ``@click.pass_context``,
    then ``@main.command()`` for ``train``, ``test`` and ``crf``) whose commands are not all models' (``crf``
    post-processes on the CPU): the set-up goes at the top of the group, under a test of the command invoked
    (``if ctx.invoked_subcommand in ("train", "test"):``), so a command that wraps no model stays one process and
    nothing the group prints is printed again by a relaunch. None for anything else (every command wraps: the
    main block's set-up serves them all)."""
    if type(group.body) is not cst.IndentedBlock or not any(_decorator_name(analysis, d) in _CLICK_GROUPS for d in group.decorators):
        return None
    commands: dict[str, bool] = {}
    wraps = [site.call for site in analysis.models.sites]
    for statement in analysis.module.body:
        if type(statement) is not cst.FunctionDef:
            continue
        for decorator in statement.decorators:
            name = _command_name(decorator.decorator, group.name.value, statement.name.value)
            if name is not None:
                commands[name] = commands.get(name, False) or any(analysis.tree.function(wrap) is statement for wrap in wraps)
    wrapping = [name for name, wraps_a_model in commands.items() if wraps_a_model]
    if not wrapping or len(wrapping) == len(commands):
        return None
    params = group.params.params
    passed = any(_decorator_name(analysis, d) in _CLICK_PASS_CONTEXT for d in group.decorators)
    if passed and params:
        context = params[0].name.value
    elif (analysis.resolve(cst.Name("click")) or "") == "click":
        context = "click.get_current_context()"
    else:
        return None
    quote = '"' if analysis.source.count('"') >= analysis.source.count("'") else "'"  # the file's more usual quote
    names = ", ".join(f"{quote}{name}{quote}" for name in wrapping) + ("," if len(wrapping) == 1 else "")
    others = ", ".join(name for name in commands if name not in wrapping)
    body = list(group.body.body)
    start = 1 if body and _is_docstring(body[0]) else 0
    place = f"in {group.name.value}(), for its commands {', '.join(wrapping)} ({others}: one process)"
    anchor, after = (body[start], False) if start < len(body) else (body[-1], True)
    return EntryPoint(anchor, after, place, when=f"{context}.invoked_subcommand in ({names})")


_CLICK_GROUPS = frozenset({"click.group", "click.decorators.group"})
_CLICK_PASS_CONTEXT = frozenset({"click.pass_context", "click.decorators.pass_context"})


def _decorator_name(analysis: ParsedFile, decorator: cst.Decorator) -> str:
    target = decorator.decorator
    if type(target) is cst.Call:
        target = target.func
    return analysis.resolve(target) or ""


def _command_name(decorator: cst.BaseExpression, group: str, function: str) -> Optional[str]:
    """The name a ``@group.command(...)`` decorator gives its function's command (click's: the function's, ``_``
    as ``-``, unless named), else None."""
    if type(decorator) is not cst.Call or type(decorator.func) is not cst.Attribute:
        return None
    owner = decorator.func.value
    if decorator.func.attr.value != "command" or type(owner) is not cst.Name or owner.value != group:
        return None
    for arg in decorator.args:
        if (arg.keyword is None or arg.keyword.value == "name") and type(arg.value) is cst.SimpleString:
            value = arg.value.evaluated_value
            return value if isinstance(value, str) else None
    return function.lower().replace("_", "-")


def _called_at_module_level(
    analysis: ParsedFile, module_code: Sequence[cst.CSTNode], training_loops: Sequence[cst.For | cst.Call]
) -> bool:
    """Whether a top-level function holding a training loop is called by the module's own statements (the
    transfer-learning tutorial's flat script: ``model = train_model(model, ...)`` after the definitions)."""
    trainers = set()
    for loop in training_loops:
        function = analysis.tree.function(loop)
        if function is not None and function in analysis.module.body:
            trainers.add(function.name.value)
    if not trainers:
        return False
    return any(
        type(call.func) is cst.Name and call.func.value in trainers
        for statement in module_code
        for call in contains(statement, lambda node: type(node) is cst.Call)
    )


def _main_without_block(analysis: ParsedFile) -> Optional[cst.FunctionDef]:
    """The main function of a module without a main block: the one its project installs as a command
    (``started.console_function``: BERT-pytorch's ``train()`` in ``__main__.py``, the ``bert`` command), else a
    top-level ``def main()``."""
    from mgpu_migrate.started import console_function

    command = console_function(analysis.path) if "def " in analysis.source else None
    return _top_level_function(analysis.module, command or "main") or (
        _top_level_function(analysis.module, "main") if command else None
    )


def script_start(analysis: ParsedFile) -> Optional[EntryPoint]:
    """A flat script's start (no main block, no ``main()``): after its imports. For a script that starts a program
    of the project's modules (``started``), whose own statements run at module level."""
    if main_block(analysis.module) is not None or _main_without_block(analysis) is not None:
        return None
    return _after_imports(analysis)


def one_process_otherwise(analysis: ParsedFile, wraps: Sequence[cst.Call], anchor: cst.CSTNode) -> Optional[cst.If]:
    """The ``if`` under which every wrap runs, whose ``else`` runs without one (DeepLabv3's ``if args.train:`` ...
    ``else:`` an evaluation on the one GPU ``--gpu`` names), when the set-up at ``anchor`` (the module's top or its
    main block) can read its test: a module name or an attribute of one (``args.train``), bound at the top before
    ``anchor`` and not bound in the function holding the ``if``, and what runs before ``anchor`` only imports,
    parses and computes (no rewrite there calls the runtime, which would set up first: darts' module-level
    ``create_exp_dir``). The set-up then relaunches only when that test holds, and the ``else`` runs as one process,
    as it did (``setup(processes=1)``). None otherwise."""
    if not wraps or analysis.tree.function(anchor) is not None:
        return None
    guards = [next(iter(analysis.tree.enclosing_ifs(wrap)), None) for wrap in wraps]
    first = guards[0]
    if first is None or first[1] or type(first[0]) is not cst.If or type(first[0].orelse) is not cst.Else:
        return None
    guard = first[0]
    if any(found is None or found[0] is not guard or found[1] for found in guards):
        return None
    root = guard.test
    while type(root) is cst.Attribute:
        root = root.value
    if type(root) is not cst.Name or type(guard.test) not in (cst.Name, cst.Attribute):
        return None
    name = root.value
    holder = analysis.tree.function(guard)
    if holder is not None and (any(param.name.value == name for param in holder.params.params) or _binds_name(holder.body, name)):
        return None
    line = analysis.position(anchor)[0]
    bound = [
        statement
        for statement in analysis.module.body
        if type(statement) is cst.SimpleStatementLine and analysis.position(statement)[0] < line and _binds_name(statement, name)
    ]
    if not bound:
        return None
    # What runs before the set-up must not call the runtime (a rule's rewrite of a module-level write, a clock's
    # name: it would set up, relaunching, before the test is read): it only imports, parses and computes.
    before = [statement for statement in top_statements(analysis) if analysis.position(statement)[0] < line]
    return guard if all(_prepares(analysis, statement) for statement in before) else None


def _prepares(analysis: ParsedFile, statement: cst.CSTNode) -> bool:
    """A statement that may run before the set-up placed after it: a docstring, an import, the command line's
    parser, or one that only computes (``only_computes_or_refuses``)."""
    return (
        _is_docstring(statement) or _is_import(statement) or parses_arguments(analysis, statement)
        or only_computes_or_refuses(analysis, statement)
    )


def _binds_name(node: cst.CSTNode, name: str) -> bool:
    """Whether ``node`` (a statement, an assignment, a loop, a ``with``) assigns ``name`` itself."""
    targets: list[cst.BaseExpression] = []
    for found in contains(node, lambda inner: type(inner) in (cst.Assign, cst.For, cst.WithItem, cst.AugAssign, cst.AnnAssign)):
        if type(found) is cst.Assign:
            targets.extend(target.target for target in found.targets)
        elif type(found) is cst.For:
            targets.append(found.target)
        elif type(found) is cst.WithItem:
            if found.asname is not None:
                targets.append(found.asname.name)
        else:
            targets.append(found.target)
    return any(type(inner) is cst.Name and inner.value == name for target in targets for inner in contains(target, lambda n: type(n) is cst.Name))


def top_statements(analysis: ParsedFile) -> list[cst.BaseStatement]:
    """The statements of the module and of its main block that run code (not the definitions, nor the main
    block's ``if`` itself)."""
    statements: list[cst.BaseStatement] = []
    for statement in analysis.module.body:
        if type(statement) in (cst.FunctionDef, cst.ClassDef):
            continue
        if type(statement) is cst.If and type(statement.body) is cst.IndentedBlock and is_main_guard(statement):
            statements.extend(s for s in statement.body.body if type(s) not in (cst.FunctionDef, cst.ClassDef))
            continue
        statements.append(statement)
    return statements
