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

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.entrypoint import (
    EntryPoint,
    _is_docstring,
    _is_import,
    chooses_visible_devices,
    main_block,
    parses_arguments,
    sets_cuda_visible_devices,
    touches_cuda,
)
from mgpu_migrate.analysis.file import FileAnalysis
from mgpu_migrate.analysis.guards import identifiers, main_process_caller, under_main_process_block

# What torchrun sets, read by a file whose own distributed path it chooses.
_LAUNCH_VARIABLES = frozenset({"LOCAL_RANK", "RANK", "WORLD_SIZE"})
_LOCAL_RANK_OPTIONS = frozenset({"--local_rank", "--local-rank"})
# What writes a file or a directory, by the resolved name of the call, or by the method's name.
_WRITERS = frozenset(
    {"torch.save", "numpy.save", "numpy.savez", "numpy.savetxt", "json.dump", "pickle.dump", "yaml.dump", "shutil.copy",
     "shutil.copyfile", "os.mkdir", "torch.utils.tensorboard.SummaryWriter", "tensorboardX.SummaryWriter"}
)
_WRITING_METHODS = frozenset({"save_pretrained", "save_vocabulary", "savefig", "to_csv", "write_text", "write_bytes"})
_OPENERS = frozenset({"open", "io.open", "builtins.open"})


@dataclass(frozen=True)
class BatchOption:
    """The command-line option that sets the own path's per-process batch: its spellings (``("-b",
    "--batch_size")``) and its declared default (None when it declares none, or not a whole number)."""

    options: tuple[str, ...]
    default: Optional[int]
    declared_default: bool

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
    """The option of the batch a loader with a ``DistributedSampler`` reads (``batch_size=args.train_batch_size``,
    ``--train_batch_size``), when a launcher chooses the own path; None otherwise."""
    if not chosen_by_launcher(analysis):
        return None
    arguments = [call for call in analysis.calls if is_add_argument(call)]
    values = analysis.values
    for call in analysis.calls_to("torch.utils.data.DataLoader"):
        sampler, size = _keyword(call, "sampler"), _keyword(call, "batch_size")
        if sampler is None or size is None or type(size.value) is not cst.Attribute:
            continue
        scope = values.scope_of(call)
        samplers = [sampler.value, *values.of(sampler.value, scope)]
        if not any(
            type(value) is cst.Call and (analysis.resolve(value.func) or "").endswith("DistributedSampler")
            for value in samplers
            for value in ([value.body, value.orelse] if type(value) is cst.IfExp else [value])
        ):
            continue
        dest = size.value.attr.value
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
                return BatchOption(declared, value if value is not None and value > 0 else None, default is not None)
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


def own_path_launch(analysis: FileAnalysis) -> Optional[tuple[BatchOption, EntryPoint]]:
    """The batch option of the own path and where its launch goes, when a plain start can run that path with
    the original's global batch (MGP139); None when the file is left with the command that runs it (MGP231)."""
    batch = own_path_batch(analysis)
    if batch is None or (batch.declared_default and batch.default is None):
        return None
    point = launch_point(analysis)
    return None if point is None else (batch, point)


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
