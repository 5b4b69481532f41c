"""A file's own distributed path, beside its DataParallel fallback: how a launch reaches it, and what it writes.

Some scripts set up distributed training themselves (``init_process_group``, torch's DDP, a
``DistributedSampler``) when a launcher chooses it (``LOCAL_RANK``, ``RANK`` or ``WORLD_SIZE`` read, or a
``--local_rank`` argument), and wrap their model in DataParallel otherwise. That path is launchable with the
original's global batch when a command-line option sets the batch its ``DistributedSampler`` loader loads per
process (``batch_size=args.train_batch_size``): the option at the original's value over the processes.

``own_path_batch`` finds that option (all its spellings) and its declared default; ``launch_point`` where a
call that relaunches a plain start must go (before the command line is parsed); ``own_path_launch`` both, when
a plain start can run the own path (MGP139; else the file is left with a command, MGP231); ``own_path_writes``
what the path writes on every process that the original wrote once (MGP325).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.entrypoint import (
    EntryPoint,
    _is_docstring,
    _is_import,
    chooses_visible_devices,
    is_main_guard,
    main_block,
    parses_arguments,
    sets_cuda_visible_devices,
    touches_cuda,
)
from mgpu_migrate.analysis.devices import device_ids, every_visible
from mgpu_migrate.analysis.file import FileAnalysis
from mgpu_migrate.analysis.guards import identifiers, main_process_caller, under_main_process_block
from mgpu_migrate.analysis.project import DATA_PARALLEL_CLASSES, Found, Project, project_of, returns_the_wrap
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.analysis.writers import LIBRARY_WRITING_METHODS
from mgpu_migrate.diagnostics import shorten

# What torchrun sets, read by a file whose own distributed path it chooses.
_LAUNCH_VARIABLES = frozenset({"LOCAL_RANK", "RANK", "WORLD_SIZE"})
_LOCAL_RANK_OPTIONS = frozenset({"--local_rank", "--local-rank"})
# What writes a file or a directory, by the resolved name of the call, or by the method's name.
_WRITERS = frozenset(
    {"torch.save", "numpy.save", "numpy.savez", "numpy.savetxt", "json.dump", "pickle.dump", "yaml.dump", "shutil.copy",
     "shutil.copyfile", "os.mkdir", "torch.utils.tensorboard.SummaryWriter", "tensorboardX.SummaryWriter"}
)
_WRITING_METHODS = LIBRARY_WRITING_METHODS | {"save_pretrained", "save_vocabulary"}
_OPENERS = frozenset({"open", "io.open", "builtins.open"})


@dataclass(frozen=True)
class BatchOption:
    """The command-line option that sets the own path's per-process batch: its spellings (``("-b",
    "--batch_size")``), its declared default (None when it declares none, or not a whole number), and the
    attribute of the parsed command line that holds it (``train_batch_size``)."""

    options: tuple[str, ...]
    default: Optional[int]
    declared_default: bool
    dest: str = ""

    @property
    def name(self) -> str:
        return max(self.options, key=len)


def is_add_argument(call: cst.Call) -> bool:
    return type(call.func) is cst.Attribute and call.func.attr.value == "add_argument"


def declared_options(call: cst.Call) -> tuple[str, ...]:
    """The option strings an ``add_argument`` call declares (``-b``, ``--batch_size``), in order."""
    return tuple(
        str(arg.value.evaluated_value)
        for arg in call.args
        if arg.keyword is None and type(arg.value) is cst.SimpleString and str(arg.value.evaluated_value).startswith("-")
    )


def _keyword(call: cst.Call, name: str) -> Optional[cst.Arg]:
    return next((arg for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)


def chosen_by_launcher(analysis: FileAnalysis) -> bool:
    """Whether a launcher's variables choose the file's own path (read, or a ``--local_rank`` argument)."""
    if any(set(declared_options(call)) & _LOCAL_RANK_OPTIONS for call in analysis.calls if is_add_argument(call)):
        return True
    return any(
        type(node) is cst.SimpleString and node.evaluated_value in _LAUNCH_VARIABLES
        for node in analysis.tree.nodes(cst.SimpleString)
    )


def own_path_batch(analysis: FileAnalysis) -> Optional[BatchOption]:
    """The option of the batch the own path's loader reads per process, when a launcher chooses that path: a
    loader with a ``DistributedSampler`` (``batch_size=args.train_batch_size``, ``--train_batch_size``), or a
    loader class of the project's own that says it is distributed and takes the rank or the number of processes
    (DialoGPT's ``DistributedBucketingDataLoader(get_rank(), get_world_size(), path, args.train_batch_size)``);
    None otherwise."""
    if not chosen_by_launcher(analysis):
        return None
    arguments = [call for call in analysis.calls if is_add_argument(call)]
    for size in _per_process_batches(analysis):
        dest = size.attr.value
        if _divided_by_the_processes(analysis, dest):
            return None
        for argument in arguments:
            declared = declared_options(argument)
            named = _keyword(argument, "dest")
            if (named is not None and type(named.value) is cst.SimpleString and named.value.evaluated_value == dest) or any(
                option.lstrip("-").replace("-", "_") == dest for option in declared
            ):
                shorts = [option for option in declared if not option.startswith("--")]
                others = {option for call in arguments for option in declared_options(call)} - set(declared)
                if any(other.startswith(short) for other in others for short in shorts):
                    # ``-b`` beside ``-b1``: a plain start could not tell the batch's ``-b12`` from the other option
                    return None
                default = _keyword(argument, "default")
                number = default.value if default is not None else None
                value = number.evaluated_value if type(number) is cst.Integer else None
                return BatchOption(declared, value if value is not None and value > 0 else None, default is not None, dest)
    return None


def _per_process_batches(analysis: FileAnalysis) -> Iterator[cst.Attribute]:
    """The ``args.<dest>`` each distributed loader of the file is given as its batch: a call given a
    ``DistributedSampler`` as ``sampler=`` and ``batch_size=args.<dest>`` (torch's ``DataLoader``, or a builder
    of the project's own that hands both on to one: seq2seq's ``train_data.get_loader(batch_size=args.batch_size,
    sampler=train_sampler)``), then a loader class of the project's own named ``Distributed...Loader``."""
    values = analysis.values
    for call in analysis.calls:
        sampler, size = _keyword(call, "sampler"), _keyword(call, "batch_size")
        if sampler is None or size is None or type(size.value) is not cst.Attribute:
            continue
        scope = values.scope_of(call)
        samplers = [sampler.value, *values.of(sampler.value, scope)]
        if any(
            type(value) is cst.Call and (analysis.resolve(value.func) or "").endswith("DistributedSampler")
            for value in samplers
            for value in ([value.body, value.orelse] if type(value) is cst.IfExp else [value])
        ):
            yield size.value
    for call in analysis.calls:
        held = _project_loader_batch(analysis, call)
        if held is not None:
            yield held


_DISTRIBUTED_LOADER = re.compile(r"Distributed\w*Loader")
_PROCESS_WORDS = re.compile(r"rank|world|replica|nproc", re.IGNORECASE)
_BATCH_PARAMETER = re.compile(r"batch_?size|bsz|batch", re.IGNORECASE)


def _project_loader_batch(analysis: FileAnalysis, call: cst.Call) -> Optional[cst.Attribute]:
    """For a call of a loader class of the project's own named ``Distributed...Loader`` that is given the rank
    or the number of processes: the ``args.<dest>`` it takes as its batch, by keyword (``batch_size=``) or at the
    position of its ``__init__``'s batch parameter (through ``*args`` handed on to the base class's)."""
    func = call.func
    name = func.value if type(func) is cst.Name else func.attr.value if type(func) is cst.Attribute else ""
    qualified = analysis.resolve(func) or ""
    if not _DISTRIBUTED_LOADER.fullmatch(name) or not qualified or qualified.startswith("torch."):
        return None
    if not any(_PROCESS_WORDS.search(word) for arg in call.args for word in identifiers(arg.value)):
        return None
    for arg in call.args:
        if arg.keyword is not None and _BATCH_PARAMETER.search(arg.keyword.value) and type(arg.value) is cst.Attribute:
            return arg.value
    project = project_of(analysis.path)
    found = project.find(qualified) if project is not None else None
    if project is None or found is None or not isinstance(found.node, ast.ClassDef):
        return None
    for index, arg in enumerate(call.args):
        if arg.keyword is not None or arg.star or type(arg.value) is not cst.Attribute:
            continue
        parameter = _parameter_at(project, found, index)
        if parameter is not None and _BATCH_PARAMETER.search(parameter):
            return arg.value
    return None


def _parameter_at(project: Project, cls: Found, index: int, depth: int = 0) -> Optional[str]:
    """The name of the parameter of ``cls(...)``'s ``__init__`` that the positional argument ``index`` binds,
    following ``*args`` handed on to a base class's ``__init__`` (``super().__init__(*args, **kwargs)``)."""
    if depth > 4:
        return None
    init = next(
        (node for node in cls.node.body if isinstance(node, ast.FunctionDef) and node.name == "__init__"), None
    ) if isinstance(cls.node, ast.ClassDef) else None
    if init is None:
        for base in getattr(cls.node, "bases", ()):
            _, inherited = project.resolve_in(cls, base)
            if inherited is not None and isinstance(inherited.node, ast.ClassDef) and inherited.node is not cls.node:
                return _parameter_at(project, inherited, index, depth + 1)
        return None
    parameters = [argument.arg for argument in (*init.args.posonlyargs, *init.args.args)][1:]
    if index < len(parameters):
        return parameters[index]
    rest = init.args.vararg.arg if init.args.vararg is not None else None
    if rest is None:
        return None
    for inner in ast.walk(init):
        if not (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "__init__"):
            continue
        starred = [i for i, a in enumerate(inner.args) if isinstance(a, ast.Starred) and isinstance(a.value, ast.Name) and a.value.id == rest]
        if len(starred) != 1 or any(isinstance(a, ast.Starred) for a in inner.args[: starred[0]]):
            continue
        before = starred[0]
        owner = inner.func.value
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            bases = cls.node.bases if isinstance(cls.node, ast.ClassDef) else []
            base = bases[0] if len(bases) == 1 else None
        else:
            base, before = owner, before - 1  # ``Base.__init__(self, *args)``: ``self`` is no parameter
        _, inherited = project.resolve_in(cls, base) if base is not None else (None, None)
        if inherited is None or not isinstance(inherited.node, ast.ClassDef) or inherited.node is cls.node:
            return None
        return _parameter_at(project, inherited, before + index - len(parameters), depth + 1)
    return None


def launch_point(analysis: FileAnalysis) -> Optional[EntryPoint]:
    """Where a call that relaunches a plain start goes: before the command line is parsed and anything touches
    CUDA, after ``CUDA_VISIBLE_DEVICES`` is set. After the imports of a script that parses or touches CUDA at
    module level (or has no main block), else at the top of its ``if __name__ == "__main__":`` block."""
    module = analysis.module
    main = main_block(module)
    module_code = [
        statement for statement in module.body if statement is not main and type(statement) not in (cst.FunctionDef, cst.ClassDef)
    ]
    flat = main is None or any(parses_arguments(analysis, s) or touches_cuda(analysis, s) for s in module_code)
    if flat:
        if not module_code:
            return None
        body = list(module.body)
        index = 0
        while index < len(body) and (_is_docstring(body[index]) or _is_import(body[index]) or sets_cuda_visible_devices(body[index])):
            index += 1
        if index < len(body):
            return EntryPoint(body[index], False, "after the imports")
        return EntryPoint(body[-1], True, "after the imports")
    assert main is not None
    if type(main.body) is not cst.IndentedBlock or not main.body.body:
        return None
    block = list(main.body.body)
    chosen = [statement for statement in block if chooses_visible_devices(statement)]
    if chosen:
        return EntryPoint(chosen[-1], True, "after CUDA_VISIBLE_DEVICES is set in the main block")
    return EntryPoint(block[0], False, 'at the top of the `if __name__ == "__main__":` block')


def own_path_writes(analysis: FileAnalysis) -> Iterator[tuple[cst.Call, str]]:
    """The calls that write a file or make a directory, outside a main-process-only block (and outside a
    function called only from one), with what they are: each process of the own path makes them."""
    for call in analysis.calls:
        what = _writes(analysis, call)
        if what is None or under_main_process_block(analysis, call) or main_process_caller(analysis, call) is not None:
            continue
        yield call, what


def _writes(analysis: FileAnalysis, call: cst.Call) -> Optional[str]:
    resolved = analysis.resolve(call.func) or ""
    if not resolved and type(call.func) is cst.Name and call.func.value == "open":
        resolved = "open"  # the builtin, which the file's own names do not resolve
    if resolved in _WRITERS:
        return resolved
    if resolved == "os.makedirs":
        ok = _keyword(call, "exist_ok")
        return None if ok is not None and type(ok.value) is cst.Name and ok.value.value == "True" else resolved
    if resolved in _OPENERS:
        mode = _keyword(call, "mode") or (call.args[1] if len(call.args) > 1 and call.args[1].keyword is None else None)
        text = mode.value.evaluated_value if mode is not None and type(mode.value) is cst.SimpleString else ""
        return "open(..., {!r})".format(text) if set(str(text)) & set("wax") else None
    if type(call.func) is cst.Attribute and call.func.attr.value in _WRITING_METHODS:
        return f".{call.func.attr.value}()"
    return None


@dataclass(frozen=True)
class Launch:
    """Where a plain start relaunches the own path, with which option: before the command line is parsed
    (``held`` None: the call is given the option's default), or right after a configuration file overrides the
    parsed command line (``held``: the expression of the batch the script then holds, ``args.train_batch_size``)."""

    batch: BatchOption
    point: EntryPoint
    held: Optional[str] = None


def own_path_launch(analysis: FileAnalysis) -> Optional[Launch]:
    """The batch option of the own path and where its launch goes, when a plain start can run that path with
    the original's global batch (MGP139); None when the file is left with the command that runs it (MGP231)."""
    batch = own_path_batch(analysis)
    if batch is None or unlaunchable_fallback(analysis) is not None:
        return None
    override = config_override(analysis)
    if override is not None:
        if override.why_not or override.point is None:
            return None
        return Launch(batch, override.point, f"{override.namespace}.{batch.dest}")
    if batch.declared_default and batch.default is None:
        return None
    point = launch_point(analysis)
    return None if point is None else Launch(batch, point)


def own_path_refusal(analysis: FileAnalysis) -> Optional[str]:
    """Why a plain start cannot launch the own path, where a configuration file overrides the parsed command
    line (the words of MGP231's message); None otherwise."""
    if own_path_batch(analysis) is None:
        return None
    fallback = unlaunchable_fallback(analysis)
    if fallback is not None:
        return fallback
    override = config_override(analysis)
    return override.why_not if override is not None and override.why_not else None


def unlaunchable_fallback(analysis: FileAnalysis) -> Optional[str]:
    """Why the file's DataParallel fallback keeps a plain start from launching its own path, in a diagnostic's
    words; None when nothing does.

    * The fallback runs on GPUs it chooses (``device_ids=args.gpus``, seq2seq's ``self.device_ids`` from its
      ``--device-ids 0`` option): a plain start launches one process per visible GPU (or ``MGPU_NPROC``), not on
      those, and where the option chose one (no DataParallel at all), several where the original ran one.
    * The fallback is held by a class of another module (its ``__init__`` wraps the model on ``self``): that
      module is not left as the fallback of a launching script (``launches_own_path`` follows builder
      functions), so it could be migrated on its own while the script launches."""
    for site in analysis.models.sites:
        chosen = device_ids(site.call)
        if analysis.resolve(site.call.func) in DATA_PARALLEL_CLASSES and chosen is not None and not every_visible(analysis, chosen):
            line, _ = analysis.position(site.call)
            return f"its fallback's GPUs are chosen (`{shorten(analysis.code_of(chosen), 30)}`, line {line})"
    fallbacks = fallback_builders(analysis)
    for fallback in fallbacks:
        if fallback.devices is not None and "device_count" not in fallback.devices:
            return f"its fallback's GPUs are chosen (`{shorten(fallback.devices, 30)}`, {fallback.where})"
    held = next((fallback for fallback in fallbacks if isinstance(fallback.builder.node, ast.ClassDef)), None)
    if held is not None:
        return f"its fallback is held by the class `{held.builder.name}` ({held.where})"
    return None


@dataclass(frozen=True)
class Override:
    """Where the values of the parsed command line (``namespace``) are overridden by a configuration file
    (``setattr(args, k, v)`` over a loaded dict): the launch goes right after that statement (``point``), or
    cannot follow it (``why_not``)."""

    namespace: str
    point: Optional[EntryPoint]
    why_not: str = ""


# What may run before a launch that follows the parse: calls that read (the file, the environment, the command
# line) and build values, none that writes, prints or touches CUDA; by the resolved name, the builtin's, or the
# method's.
_READING_FUNCTIONS = frozenset(
    {"json.load", "json.loads", "yaml.load", "yaml.safe_load", "yaml.full_load", "os.getenv", "os.environ.get",
     "os.path.join", "os.path.exists", "os.path.isfile", "os.path.isdir", "os.path.abspath", "os.path.dirname",
     "os.path.basename", "os.path.expanduser", "os.path.splitext", "argparse.ArgumentParser", "logging.getLogger",
     "logging.basicConfig", "copy.copy", "copy.deepcopy", "warnings.filterwarnings", "warnings.simplefilter"}
)
_READING_BUILTINS = frozenset(
    {"setattr", "getattr", "hasattr", "isinstance", "vars", "len", "int", "str", "float", "bool", "dict", "list",
     "tuple", "set", "sorted", "range", "enumerate", "zip", "min", "max", "type", "open", "repr", "any", "all"}
)
_READING_METHODS = frozenset(
    {"add_argument", "add_argument_group", "add_mutually_exclusive_group", "set_defaults", "parse_args",
     "parse_known_args", "items", "keys", "values", "get", "replace", "split", "strip", "lower", "upper",
     "startswith", "endswith", "format", "copy", "update", "read", "append", "extend", "insert", "pop", "setdefault"}
)


def config_override(analysis: FileAnalysis) -> Optional[Override]:
    """Where a configuration file overrides the command line the script parsed (DialoGPT's ``--config``:
    ``setattr(args, k, v)`` for each key of a loaded JSON, ``vars(args).update(...)``,
    ``args.__dict__.update(...)``); None when nothing does. The launch can follow the last such statement of the
    block that parses (the module's, or the main block's), when what runs up to it only reads."""
    parsed = _parses(analysis)
    if not parsed:
        return None
    overrides = [call for call in analysis.calls if _overridden(call, {name for name, _, _ in parsed})]
    if not overrides:
        return None
    last = overrides[-1]
    line = analysis.position(last)[0]
    for name, statement, block in parsed:
        if not _overridden(last, {name}):
            continue
        at = next((i for i, top in enumerate(block) if top is statement), -1)
        held = next((i for i, top in enumerate(block) if i > at and _within(analysis, last, top)), None)
        if held is None:
            continue
        if any(_within(analysis, call, top) for call in overrides for top in block[held + 1 :]) or any(
            analysis.tree.function(call) is not None for call in overrides
        ):
            break
        if not _parsed_again(analysis, last, block[held], name):
            break
        for top in block[:held + 1]:
            if type(top) in (cst.FunctionDef, cst.ClassDef) or _is_import(top) or _is_docstring(top) or is_main_guard(top):
                continue
            harmful = _first_harmful_call(analysis, top)
            if harmful is not None:
                what = shorten(analysis.code_of(harmful.func), 30)
                return Override(name, None, f"`{what}` (line {analysis.position(harmful)[0]}) runs before the config file (line {line})")
        return Override(name, EntryPoint(block[held], True, "after the configuration file overrides the command line"))
    return Override(parsed[0][0], None, f"the config file sets the options at line {line}, where no launch can follow")


def _parses(analysis: FileAnalysis) -> list[tuple[str, cst.BaseStatement, list[cst.BaseStatement]]]:
    """The statements of the module's body, or of its main block, that parse the command line (``args =
    parser.parse_args()``, ``args, _ = parser.parse_known_args()``): the name bound, the statement, its block."""
    module = analysis.module
    main = main_block(module)
    blocks: list[list[cst.BaseStatement]] = [list(module.body)]
    if main is not None and type(main.body) is cst.IndentedBlock:
        blocks.append(list(main.body.body))
    found: list[tuple[str, cst.BaseStatement, list[cst.BaseStatement]]] = []
    for block in blocks:
        for statement in block:
            if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1:
                continue
            assign = statement.body[0]
            if type(assign) is not cst.Assign or len(assign.targets) != 1 or type(assign.value) is not cst.Call:
                continue
            func = assign.value.func
            if type(func) is not cst.Attribute or func.attr.value not in ("parse_args", "parse_known_args"):
                continue
            target: cst.BaseExpression = assign.targets[0].target
            if type(target) is cst.Tuple and target.elements:
                target = target.elements[0].value
            if type(target) is cst.Name:
                found.append((target.value, statement, block))
    return found


def _overridden(call: cst.Call, namespaces: set[str]) -> bool:
    """``setattr(args, k, v)`` with a key that is no literal, ``vars(args).update(...)``,
    ``args.__dict__.update(...)``, for ``args`` one of ``namespaces``; or ``parser.set_defaults(**loaded)``
    (seq2seq's ``--config-file``: the file's values become the defaults of a second parse, which the command
    line overrides)."""
    func = call.func
    if type(func) is cst.Attribute and func.attr.value == "set_defaults":
        return any(arg.star == "**" for arg in call.args)
    if type(func) is cst.Name and func.value == "setattr" and len(call.args) == 3:
        target, key = call.args[0].value, call.args[1].value
        return type(target) is cst.Name and target.value in namespaces and type(key) is not cst.SimpleString
    if type(func) is cst.Attribute and func.attr.value == "update":
        owner = func.value
        if type(owner) is cst.Call and type(owner.func) is cst.Name and owner.func.value == "vars" and len(owner.args) == 1:
            owner = owner.args[0].value
        elif type(owner) is cst.Attribute and owner.attr.value == "__dict__":
            owner = owner.value
        else:
            return False
        return type(owner) is cst.Name and owner.value in namespaces
    return False


def _parsed_again(analysis: FileAnalysis, override: cst.Call, statement: cst.CSTNode, name: str) -> bool:
    """For ``parser.set_defaults(**loaded)``: whether ``statement`` parses the command line into ``name`` again
    after it (``args = parser.parse_args()``), so that ``name`` holds the file's values once it has run. Any
    other override sets ``name`` itself."""
    if type(override.func) is not cst.Attribute or override.func.attr.value != "set_defaults":
        return True
    line = analysis.position(override)[0]
    for call in contains(statement, lambda node: type(node) is cst.Call):
        if type(call.func) is not cst.Attribute or call.func.attr.value not in ("parse_args", "parse_known_args"):
            continue
        assign = analysis.tree.parent(call)
        if type(assign) is not cst.Assign or len(assign.targets) != 1 or analysis.position(call)[0] <= line:
            continue
        target: cst.BaseExpression = assign.targets[0].target
        if type(target) is cst.Tuple and target.elements:
            target = target.elements[0].value
        if type(target) is cst.Name and target.value == name:
            return True
    return False


def _within(analysis: FileAnalysis, node: cst.CSTNode, statement: cst.CSTNode) -> bool:
    return node is statement or any(ancestor is statement for ancestor in analysis.tree.ancestors(node))


def _first_harmful_call(analysis: FileAnalysis, statement: cst.CSTNode) -> Optional[cst.Call]:
    """The first call of ``statement`` that may do more than read: write, print, log, touch CUDA, or run code
    this file cannot see (a function of its own, a library's)."""
    for call in contains(statement, lambda node: type(node) is cst.Call):
        func = call.func
        resolved = analysis.resolve(func)
        if resolved is not None:
            if resolved in _OPENERS and _writes(analysis, call) is not None:
                return call
            if resolved in _READING_FUNCTIONS or resolved in _OPENERS:
                if resolved == "logging.basicConfig" and _keyword(call, "filename") is not None:
                    return call
                continue
            if type(func) is cst.Attribute and func.attr.value in _READING_METHODS and not resolved.startswith("torch"):
                continue
            return call
        if type(func) is cst.Name:
            if func.value in _READING_BUILTINS and func.value not in analysis.bindings.local:
                if func.value == "open" and _writes(analysis, call) is not None:
                    return call
                continue
            return call
        if type(func) is cst.Attribute and func.attr.value in _READING_METHODS:
            continue
        return call
    return None


def launched(analysis: FileAnalysis) -> bool:
    """Whether the file already calls ``mgpu_runtime.launch_own_path`` (a file this rule migrated)."""
    return any(analysis.resolve(call.func) == "mgpu_runtime.launch_own_path" for call in analysis.calls)


def rank_namespace(analysis: FileAnalysis, node: cst.CSTNode) -> Optional[str]:
    """The name of the parsed command line that holds ``local_rank`` (a ``--local_rank`` option), as ``node``'s
    function sees it once parsed: assigned from ``parse_args()`` earlier in that function, or at module level
    (and not bound in the function). None where there is none."""
    declares = any(
        set(declared_options(call)) & _LOCAL_RANK_OPTIONS and _keyword(call, "dest") is None
        for call in analysis.calls
        if is_add_argument(call)
    )
    if not declares:
        return None
    here = analysis.tree.function(node)
    line, _ = analysis.position(node)
    found: Optional[str] = None
    for call in analysis.calls:
        if type(call.func) is not cst.Attribute or call.func.attr.value != "parse_args":
            continue
        assign = analysis.tree.parent(call)
        if type(assign) is not cst.Assign or len(assign.targets) != 1 or type(assign.targets[0].target) is not cst.Name:
            continue
        name = assign.targets[0].target.value
        scope = analysis.tree.function(call)
        earlier = scope is here and analysis.position(call)[0] < line
        if earlier or (scope is None and here is not None and found is None and not _binds(here, name)):
            found = name
    return found


def _binds(function: cst.FunctionDef, name: str) -> bool:
    """Whether ``function`` binds ``name`` itself (a parameter, or an assignment in its body)."""
    if any(param.name.value == name for param in function.params.params):
        return True
    return any(
        type(target.target) is cst.Name and target.target.value == name
        for node in _walk(function.body)
        if type(node) is cst.Assign
        for target in node.targets
    )


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for child in node.children:
        yield from _walk(child)


_PROCESS_COUNT = re.compile(r"world|gpu|nproc|device_count|ranks", re.IGNORECASE)


def _divided_by_the_processes(analysis: FileAnalysis, dest: str) -> bool:
    """Whether the script sets ``<args>.<dest>`` from the number of processes or GPUs itself (pytorch/examples'
    ``args.batch_size = int(args.batch_size / ngpus_per_node)``): its option is then the global batch already,
    and a share of it would be divided twice."""
    for node in analysis.tree.nodes(cst.Assign):
        targets = [target.target for target in node.targets]
        if any(type(target) is cst.Attribute and target.attr.value == dest for target in targets) and any(
            _PROCESS_COUNT.search(name) for name in identifiers(node.value)
        ):
            return True
    for augmented in analysis.tree.nodes(cst.AugAssign):
        target = augmented.target
        if type(target) is cst.Attribute and target.attr.value == dest and any(
            _PROCESS_COUNT.search(name) for name in identifiers(augmented.value)
        ):
            return True
    return False


# -- a DataParallel fallback in a helper module -------------------------------------------------------------------
@dataclass(frozen=True)
class Fallback:
    """A call of this file that gets its model from a function of another module of the project (a builder)
    that returns it wrapped in torch's DataParallel (DialoGPT's ``load_model`` in ``gpt2_training/train_utils.py``,
    when ``args.n_gpu > 1``), or that builds a project class of another module whose ``__init__`` wraps it so on
    ``self`` (seq2seq's ``Seq2SeqTrainer``, reached through ``getattr(trainers, args.trainer)(...)``): the file's
    DataParallel fallback, held there. ``devices``: the wrap's ``device_ids`` as written, when it is given any
    (the GPUs it runs on are then chosen, not every visible one)."""

    call: cst.Call
    builder: Found
    wrap_line: int
    devices: Optional[str] = None

    @property
    def module(self) -> str:
        return os.path.abspath(self.builder.module.path)

    @property
    def where(self) -> str:
        return f"{os.path.basename(self.builder.module.path)}:{self.wrap_line}"


def fallback_builders(analysis: FileAnalysis, modules: Optional[Collection[str]] = None) -> list[Fallback]:
    """The calls of this file to a function of another module of the project (of ``modules``, absolute paths,
    when given) that returns the model wrapped in torch's DataParallel, or to a class of one whose ``__init__``
    wraps it on ``self``."""
    project = project_of(analysis.path)
    if project is None:
        return []
    here = os.path.abspath(analysis.path)
    found: list[Fallback] = []
    for call in analysis.calls:
        for builder in _built(analysis, project, call):
            module = os.path.abspath(builder.module.path)
            if module == here or (modules is not None and module not in modules):
                continue
            wrap = _wrap_of(project, builder)
            if wrap is not None:
                found.append(Fallback(call, wrap[0], wrap[1].lineno, _devices(wrap[1])))
                break
    return found


def _built(analysis: FileAnalysis, project: Project, call: cst.Call) -> Iterator[Found]:
    """The project definitions a call may run: the function or class its callee names, or, for
    ``getattr(module, name)(...)`` with ``module`` a project module and ``name`` no literal, each class that
    module exports (its literal ``__all__``, else its public classes)."""
    qualified = analysis.resolve(call.func)
    if qualified:
        builder = project.find(qualified)
        if builder is not None:
            yield builder
        return
    func = call.func
    if not (type(func) is cst.Call and type(func.func) is cst.Name and func.func.value == "getattr" and len(func.args) == 2):
        return
    owner = analysis.resolve(func.args[0].value)
    module = project.module(owner) if owner else None
    if module is None:
        return
    exported = module.exports if module.exports is not None and "?" not in module.exports else None
    for name, node in module.definitions.items():
        if isinstance(node, ast.ClassDef) and (name in exported if exported is not None else not name.startswith("_")):
            yield Found(module, node, os.path.dirname(os.path.abspath(analysis.path)))


def _wrap_of(project: Project, builder: Found, depth: int = 0) -> Optional[tuple[Found, ast.Call]]:
    """The call of torch's DataParallel that a builder function returns, or that a class's ``__init__`` (its own,
    or the one it inherits from a project class) assigns to an attribute of ``self``; with the definition that
    holds it."""
    node = builder.node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for inner in ast.walk(node):
            if isinstance(inner, ast.Call) and builder.module.qualified(inner.func) in DATA_PARALLEL_CLASSES and returns_the_wrap(node, inner):
                return builder, inner
        return None
    if not isinstance(node, ast.ClassDef) or depth > 4:
        return None
    init = next((item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"), None)
    if init is None:
        for base in node.bases:
            _, inherited = project.resolve_in(builder, base)
            if inherited is not None and isinstance(inherited.node, ast.ClassDef) and inherited.node is not node:
                return _wrap_of(project, inherited, depth + 1)
        return None
    if not init.args.args:
        return None
    owner = init.args.args[0].arg
    for inner in ast.walk(init):
        if not (isinstance(inner, ast.Assign) and isinstance(inner.value, ast.Call)):
            continue
        if builder.module.qualified(inner.value.func) in DATA_PARALLEL_CLASSES and any(
            isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == owner
            for target in inner.targets
        ):
            return builder, inner.value
    return None


def _devices(wrap: ast.Call) -> Optional[str]:
    """The ``device_ids`` a DataParallel call is given (second positional, or by keyword), as written; None when
    it is given none, or ``None``."""
    given = wrap.args[1] if len(wrap.args) > 1 else next((k.value for k in wrap.keywords if k.arg == "device_ids"), None)
    if given is None or (isinstance(given, ast.Constant) and given.value is None):
        return None
    return ast.unparse(given)


def launches_own_path(path: str, module: str, builder: str) -> bool:
    """Whether ``--to ddp`` makes a plain start of the script at ``path`` launch its own distributed path (MGP139),
    its DataParallel fallback being the model the function ``builder`` of ``module`` returns wrapped: the script
    has a distributed set-up of its own and no DataParallel of its own, calls that builder, and a plain start can
    launch its own path. Read from the script alone (no migration of it), so the module holding the wrap and the
    script, each deciding from this, decide the same in either order."""
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return False
    return _launches_own_path(os.path.abspath(path), stamp, os.path.abspath(module), builder)


def _script(path: str) -> Optional[FileAnalysis]:
    """The analysis of the script at ``path`` read alone (its caller releases it), or None where it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        parsed = cst.parse_module(source)
    except (OSError, UnicodeDecodeError, cst.ParserSyntaxError, RecursionError, ValueError):
        return None
    return FileAnalysis(path, source, parsed)


@lru_cache(maxsize=64)
def _launches_own_path(path: str, stamp: int, module: str, builder: str) -> bool:
    from mgpu_migrate.program import existing_setup

    analysis = _script(path)
    if analysis is None:
        return False
    try:
        if not existing_setup(analysis) or analysis.models.sites:
            return False
        if not any(found.builder.name == builder for found in fallback_builders(analysis, (module,))):
            return False
        if launched(analysis):
            return True  # migrated already (the project rewritten in place, this script first)
        launch = own_path_launch(analysis)
        return launch is not None and not analysis.silenced(launch.point.anchor, "MGP139")
    finally:
        analysis.release()


def wraps_beside(path: str) -> bool:
    """Whether the script at ``path`` starts its own distributed path itself beside a DataParallel fallback that
    ``--to ddp`` migrates (``program.started_beside``; SimCLR's main.py), or has been so migrated (it calls
    ``mgpu_runtime.leave_to_own_path``). Read from the script alone, as ``launches_own_path``."""
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return False
    return _wraps_beside(os.path.abspath(path), stamp)


@lru_cache(maxsize=64)
def _wraps_beside(path: str, stamp: int) -> bool:
    from mgpu_migrate.program import existing_setup, started_beside

    analysis = _script(path)
    if analysis is None:
        return False
    try:
        existing = existing_setup(analysis)
        wraps = [site.call for site in analysis.models.sites]
        left = any(analysis.resolve(call.func) == "mgpu_runtime.leave_to_own_path" for call in analysis.calls)
        return bool(existing) and bool(wraps or left) and started_beside(analysis, existing, wraps) is not None
    finally:
        analysis.release()


def own_path_gradient_sums(analysis: FileAnalysis) -> list[cst.Call]:
    """The calls of the file's own gradient reduction that add up the processes' gradients without dividing by
    their number (DialoGPT's ``all_reduce_and_rescale_tensors(grads, float(1))``, a bare ``dist.all_reduce(p.grad)``):
    an all-reduce given the parameters' ``.grad`` (directly or through a name bound to them), none of whose
    arguments names the number of processes, and after which its block divides nothing by it."""
    found = []
    for call in analysis.calls:
        func = call.func
        name = func.attr.value if type(func) is cst.Attribute else func.value if type(func) is cst.Name else ""
        if "all_reduce" not in name or not call.args:
            continue
        scope = analysis.values.scope_of(call)
        if not any(_gradients(analysis, arg.value, scope) for arg in call.args):
            continue
        if any(_PROCESS_COUNT.search(name) for arg in call.args for name in identifiers(arg.value)):
            continue
        if not _divided_after(analysis, call):
            found.append(call)
    return found


def _gradients(analysis: FileAnalysis, expr: cst.BaseExpression, scope) -> bool:
    """Whether ``expr`` is the parameters' gradients: it reads ``.grad``, or is a name bound to something that does."""
    if ".grad" in analysis.code_of(expr):
        return True
    if type(expr) is not cst.Name:
        return False
    return any(".grad" in analysis.code_of(value) for value in analysis.values.of(expr, scope))


def _divided_after(analysis: FileAnalysis, call: cst.Call) -> bool:
    """Whether a statement after the call's, in its block, divides by the number of processes."""
    statement = analysis.tree.statement(call)
    block = analysis.tree.parent(statement) if statement is not None else None
    body = list(getattr(block, "body", ()))
    if statement not in body:
        return False
    for later in body[body.index(statement) + 1 :]:
        text = analysis.code_of(later)
        if ("/" in text or "div" in text) and any(_PROCESS_COUNT.search(name) for name in identifiers(later)):
            return True
    return False
