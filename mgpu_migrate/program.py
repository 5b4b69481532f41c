"""Phase 2 of the pipeline: the verdict on the file as a whole, decided once, after the wrap rules.

The pipeline runs the rules in three phases (``rules.base.WRAPS``, ``PROGRAM``, ``CHECKS``):

1. the wrap rules decide each wrap and criterion site on its own (rewrite it, or leave it with a reason);
2. :func:`decide` reads what they decided and gives the file one :class:`Program` verdict: which wraps
   became the runtime's, which DataParallel wraps stay, whether the file runs distributed training of its own;
3. the program rules (``--to ddp`` set-up, data, saves, guards ...) and then the checks receive that verdict;
   none of them recomputes it, and none decides from another rule's edits.

Last, :func:`settle` applies what holds for the file as a whole: ``--to ddp`` migrates a file entirely or
not at all, so when one wrap stays, or a program rule found that the file must not become a distributed
program (a *veto*: an evaluation script, a loss that compares the rows of a batch, a wrap switched off),
every rewrite is dropped and the file is left as it is, with the diagnostics that say why.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import cast

import libcst as cst

from mgpu_migrate import files
from mgpu_migrate.analysis import FileAnalysis, names
from mgpu_migrate.analysis.devices import argument_given, device_ids, every_visible, what_they_are, why_unknown
from mgpu_migrate.analysis.entrypoint import RUNTIME_SETUP, one_process_otherwise, top_statements
from mgpu_migrate.analysis.models import RUNTIME, SUBCLASS
from mgpu_migrate.analysis.own_path import Fallback, chosen_by_launcher, fallback_builders
from mgpu_migrate.analysis.rebased import rebased_classes
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.analysis.writers import LOGGING_METHODS
from mgpu_migrate.analysis.project import constructor, importers_through_packages, project_of
from mgpu_migrate.diagnostics import Rewrite
from mgpu_migrate.edits import Edits
from mgpu_migrate.started import is_script

# The rewrite that calls ``mgpu_runtime.setup()`` at the entry point (``EntryPointSetup.CODE``). Its code is the
# verdict's because where the set-up runs is a fact of the program other rules need (``Program.setup_statement``).
SETUP = Rewrite("MGP120")

# A file that calls one of these already runs as a distributed program of its own making.
_EXISTING_DISTRIBUTED = {
    names.TORCH_DDP,
    names.APEX_DDP,
    "torch.distributed.init_process_group",
    "torch.distributed.distributed_c10d.init_process_group",
    "torch.utils.data.DistributedSampler",
    "torch.utils.data.distributed.DistributedSampler",
    "torch.multiprocessing.spawn",
}
# What starts a script's own processes from inside it (torch.multiprocessing's ``spawn``, as ``mp.spawn``).
SPAWNS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes", "torch.multiprocessing.spawn.spawn"})
# What joins a script's own process group (the own path an option chooses, with no start of its own).
_JOINS = frozenset({"torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group"})
_RUNTIME_MODULE = "mgpu_runtime"
# Calls that print or log: what runs before a set-up placed late runs in the process it relaunches too.
_SAYING = frozenset({"print", "builtins.print", "pprint.pprint"})
_SAYING_METHODS = LOGGING_METHODS | {"write"}


@dataclass(frozen=True)
class ChosenDevices:
    """The GPUs the file's DataParallel wraps chose (``device_ids=args.gpus``), which ``--to ddp`` hands to
    ``mgpu_runtime.setup(devices=...)``: ``passed``, the expression the set-up takes, or why it cannot take it
    (``unknown``, in a diagnostic's words). ``sites``: each wrap that chose, with its ``device_ids``."""

    sites: tuple[tuple[cst.Call, cst.BaseExpression], ...]
    passed: cst.BaseExpression | None
    unknown: str | None


@dataclass(frozen=True)
class Program:
    """What ``--to ddp`` makes of a file, once the wrap rules have decided each wrap.

    ``wraps``: the wrap sites rewritten to the runtime's ``DistributedDataParallel`` or ``data_parallel``, and the
    calls of torch's ``data_parallel`` written by hand, whose function calls the runtime's (MGP107).
    ``kept``: DataParallel sites left as they are (``dim != 0``, a subclass, the functional form, ``# noqa``):
    then the file is not made a distributed program. A DataParallel that wraps no model (an optimizer kept in
    one, MGP252) is no site (``ModelFlow.not_modules``): it parallelizes nothing, each process holds it as the
    one original process did, so it neither counts as a wrap nor keeps the file from being migrated.
    ``existing``: the file's own distributed set-up (``init_process_group``, torch's or apex's DDP,
    ``DistributedSampler``, ``mp.spawn``): then only its DataParallel fallback is migrated.
    ``already_set_up``: the file calls ``mgpu_runtime.setup()`` itself (a partly migrated file).
    ``starts``: for a script with no DataParallel of its own, the project modules it imports that become
    distributed programs with no entry point of their own (``engine.started_programs``): the script is their
    entry point, and the program rules make its set-up and its side effects.
    ``holds``: for a module with no DataParallel of its own, the project modules holding the wrap (in a class
    this module's classes derive from) whose model it trains (``engine.held_programs``): those modules migrate
    with it, and this one's training loaders are split and its side effects made once.
    ``handed``: for a module with no DataParallel of its own whose training code (a trainer class, a function
    that runs the backward pass) is handed a wrapped model by scripts of the project that migrate
    (``engine.handed_programs``; Conv-TasNet's ``solver.py``, whose ``Solver`` ``train.py`` builds): its code runs on
    every process, so its side effects are made once; its data is split in those scripts.
    ``beside``: the ``if`` of the main block that starts the file's own distributed path itself, whose ``else``
    runs the DataParallel fallback (SimCLR's ``if args.nodes > 1: mp.spawn(main, ...)``, ``else: main(0, args)``),
    when every call of that path runs under the same condition (``started_beside``): the fallback migrates, set
    up in that ``else``, and the own path stays the script's (``mgpu_runtime.leave_to_own_path()`` before its
    start); None otherwise. ``beside_refused``: why not, where the file starts such a path (for MGP231's message).
    ``one_process``: the ``if`` every wrap runs under whose ``else`` wraps nothing, when the set-up at the file's
    entry point relaunches only under its test and that ``else`` stays one process (``one_process_branch``).
    ``fallback``: for a script with no DataParallel of its own and a distributed set-up of its own
    (``existing``), the calls that get its model from a builder of another module of the project that wraps it
    in DataParallel (DialoGPT's ``load_model``): its DataParallel fallback, held there. The script is then
    migrated as one whose fallback is its own: a plain start launches its own path (MGP139), or it is left
    (MGP231); the builder's module stays as it is (``analysis.own_path.launches_own_path``).
    """

    wraps: tuple[cst.Call, ...]
    kept: tuple[cst.Call, ...]
    existing: tuple[cst.Call, ...]
    already_set_up: bool
    starts: tuple[str, ...] = ()
    holds: tuple[str, ...] = ()
    fallback: tuple[Fallback, ...] = ()
    handed: tuple[str, ...] = ()
    beside: cst.If | None = None
    beside_refused: str | None = None
    one_process: cst.If | None = None

    @property
    def migrates(self) -> bool:
        """True when the rules that make a file a distributed program (set-up, data, side effects) apply."""
        return bool(self.wraps) and not self.kept and (not self.existing or self.beside is not None)

    @property
    def runs_distributed(self) -> bool:
        """True when every process runs this file: it migrates, or it is the entry point of programs it starts
        (``starts``). The rules of the set-up and of side effects (directories, files, writers) apply to both."""
        return self.migrates or (bool(self.starts or self.holds or self.handed) and not self.kept and not self.existing)

    @property
    def own_path(self) -> bool:
        """The file has a distributed set-up of its own beside a DataParallel fallback (its own wraps, or a
        builder's of another module): a plain start may launch that path (MGP139), or the file is left (MGP231);
        not when the file starts that path itself under a condition whose ``else`` runs the fallback (``beside``)."""
        return bool(self.existing) and bool(self.wraps or self.fallback) and self.beside is None

    @property
    def left_whole(self) -> bool:
        """A wrap stays DataParallel: nothing is rewritten (also in a file with a distributed set-up of its own,
        whose fallback the relaunched processes would not provably leave for that set-up)."""
        return bool(self.kept)

    def setup_statement(self, analysis: FileAnalysis) -> tuple[cst.CSTNode, str] | None:
        """Where the migrated file calls ``mgpu_runtime.setup()``: the statement the call is inserted next to
        ("inserted before", "inserted after"), or the one that already calls it ("called at"). None when none is
        inserted (no entry point, or a ``# noqa`` there silences the set-up)."""
        if self.already_set_up:
            statement = analysis.tree.statement(_setup_call(analysis))
            return (statement, "called at") if statement is not None else None
        entry = analysis.entry_point
        if entry is None or analysis.silenced(entry.anchor, SETUP.code):
            return None
        return entry.anchor, "inserted after" if entry.after else "inserted before"

    def chosen_devices(self, analysis: FileAnalysis) -> ChosenDevices | None:
        """The GPUs the DataParallel wraps chose, and whether the set-up can take them; None when no wrap chose
        (no ``device_ids``, or every visible GPU). The set-up takes the wraps' one expression when every wrap
        chose it and it holds, where ``setup()`` runs, what it holds at each wrap (``analysis.devices``)."""
        sites = []
        for call in self.wraps:
            if analysis.resolve(call.func) not in (names.DATA_PARALLEL, names.CALLBACK_DATA_PARALLEL):
                continue
            chosen = device_ids(call)
            if chosen is not None and not every_visible(analysis, chosen):
                sites.append((call, chosen))
        if not self.wraps and self.starts:
            sites = [site for site in handed_device_ids(analysis, self.starts) if not every_visible(analysis, site[1])]
        if not sites:
            return None
        return ChosenDevices(tuple(sites), *self._setup_takes(analysis, sites))

    def _setup_takes(
        self, analysis: FileAnalysis, sites: list[tuple[cst.Call, cst.BaseExpression]]
    ) -> tuple[cst.BaseExpression | None, str | None]:
        """What ``setup(devices=...)`` is given, or why it cannot be."""
        value = sites[0][1]
        text = analysis.code_of(value)
        chosen = {call: analysis.code_of(expression) for call, expression in sites}
        if any(chosen.get(call) != text for call in self.wraps):
            lines = ", ".join(str(analysis.position(call)[0]) for call in self.wraps)
            every = " or every visible one" if len(chosen) < len(self.wraps) else ""
            return None, f"the wraps (lines {lines}) choose different GPUs{every}"
        placed = self.setup_statement(analysis)
        if placed is None:
            described = what_they_are(analysis, value, sites[0][0])
            return None, f"{described + ', and ' if described else ''}no set-up here takes them"
        anchor, how = placed
        entry = analysis.entry_point
        if how != "called at" and entry is not None and entry.devices is not None:
            return entry.devices, None  # where a method of the wraps' class chooses them (``chosen_in_method``)
        if how == "called at":
            given = next((arg.value for arg in _setup_call(analysis).args if arg.keyword and arg.keyword.value == "devices"), None)
            if given is not None and analysis.code_of(given) == text:
                return given, None
            line, _ = analysis.position(anchor)
            return None, f"the `mgpu_runtime.setup()` at line {line} is not given them"
        for call, expression in sites:
            reason = why_unknown(analysis, expression, call, anchor, how == "inserted after")
            if reason is not None:
                return None, reason
        return value, None


def handed_device_ids(analysis: FileAnalysis, started: Collection[str] | None) -> list[tuple[cst.Call, cst.BaseExpression]]:
    """The calls of a script that hand the GPUs to a function (or a class's constructor) of a module it starts
    (any project module, for ``started=None``) whose wraps take them as ``device_ids`` (run.py's ``train(...,
    opt.device_ids)``, BERT-pytorch's ``BERTTrainer(..., cuda_devices=args.cuda_devices)``), with what each hands."""
    project = project_of(analysis.path)
    if project is None:
        return []
    modules = {os.path.abspath(path) for path in started} if started is not None else None
    sites = []
    for call in analysis.calls:
        qualified = analysis.resolve(call.func)
        found = project.find(qualified) if qualified and "." in qualified else None
        if found is None or (modules is not None and os.path.abspath(found.module.path) not in modules):
            continue
        parameter = project.device_parameter(found)
        node = constructor(found.node) if isinstance(found.node, ast.ClassDef) else found.node
        functions = (ast.FunctionDef, ast.AsyncFunctionDef)
        given = (
            _argument_for(node, call, parameter, bound=node is not found.node)
            if parameter is not None and isinstance(node, functions)
            else None
        )
        if given is not None:
            sites.append((call, given))
    return sites


def _argument_for(
    function: ast.FunctionDef | ast.AsyncFunctionDef, call: cst.Call, parameter: str, bound: bool = False
) -> cst.BaseExpression | None:
    """What ``call`` gives ``function``'s ``parameter`` (by keyword or position), None when it cannot be told;
    ``bound``: the function is a class's ``__init__``, called through the class (its ``self`` is not given)."""
    positional = [arg.arg for arg in [*function.args.posonlyargs, *function.args.args]][1 if bound else 0 :]
    return argument_given(call, positional, parameter)


def handed_to_a_setup(analysis: FileAnalysis, wrap: cst.Call) -> str | None:
    """For a wrap whose ``device_ids`` are a parameter of its function, in a module with no entry point of its own:
    the script that starts it and gives those GPUs to its ``mgpu_runtime.setup(devices=...)`` (``run.py:86``,
    the call that hands them), as that script's own migration does (``Program.chosen_devices``); else None."""
    here = os.path.dirname(os.path.abspath(analysis.path))
    function = analysis.tree.function(wrap)
    if function is None:
        return None
    # A class's constructor is called by the class's name (``BERTTrainer(..., cuda_devices=...)``).
    owner = next((node for node in analysis.tree.ancestors(function) if type(node) in (cst.ClassDef, cst.FunctionDef)), None)
    called = owner.name.value if function.name.value == "__init__" and type(owner) is cst.ClassDef else function.name.value
    for importer in importers_through_packages(analysis.path, called):
        try:
            source = files.read(importer.path)[0].decode("utf-8")
            script = FileAnalysis(importer.path, source, cst.parse_module(source))
        except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
            continue
        try:
            if not is_script(source.encode("utf-8", "surrogateescape"), importer.path):
                continue
            starting = Program((), (), existing_setup(script), False, (os.path.abspath(analysis.path),))
            chosen = starting.chosen_devices(script)
            if chosen is not None and chosen.passed is not None:
                call = chosen.sites[0][0]
                return f"{os.path.relpath(importer.path, here)}:{script.position(call)[0]}"
        finally:
            script.release()
    return None


def _setup_call(analysis: FileAnalysis) -> cst.Call:
    """The file's own call of ``mgpu_runtime.setup()`` (a file that makes one)."""
    return next(call for call in analysis.calls if analysis.resolve(call.func) == RUNTIME_SETUP)


def existing_setup(analysis: FileAnalysis) -> tuple[cst.Call, ...]:
    """The calls of the file's own distributed set-up (``init_process_group``, torch's or apex's DDP ...)."""
    return tuple(call for call in analysis.calls if analysis.resolve(call.func) in _EXISTING_DISTRIBUTED)


def decide(
    analysis: FileAnalysis,
    rewritten: Collection[cst.CSTNode],
    starts: Callable[[], tuple[str, ...]] = tuple,
    holds: tuple[str, ...] = (),
    fallbacks: Callable[[], tuple[str, ...]] = tuple,
    handed: tuple[str, ...] = (),
    beside: bool = False,
) -> Program:
    """The program the file becomes, given the nodes the wrap rules rewrote (the keys of their edits) and what
    gives the modules it starts as distributed programs (asked only of a script with no site of its own);
    ``fallbacks``: gives the modules that may hold its DataParallel fallback (``Program.fallback``), asked only of
    a file with a distributed set-up of its own and no site; ``beside``: whether a fallback may migrate beside an
    own path the file starts itself, and whether the set-up may stay one process under a test (``one_process``;
    ``--to ddp``, the runtime's style: ``leave_to_own_path`` and ``setup(processes=1)`` are the runtime's)."""
    wraps: list[cst.Call] = []
    kept: list[cst.Call] = []
    models = analysis.models
    # A call of a subclass of this file is a wrap when its class is rebased (a call of one of another module that
    # rebases it is rewritten as it is, MGP106: in ``rewritten``).
    rebased_names = {cls.name.value for cls in rebased_classes(analysis, rewritten)} if models.subclasses else set()
    for site in models.sites:
        if site.kind == RUNTIME or analysis.resolve(site.call.func) == names.RUNTIME_DATA_PARALLEL_FUNCTION:
            continue
        # A call of torch's data_parallel written by hand is the wrap: its function calls the runtime's (MGP107); so is
        # a call of a subclass of this file rebased on the runtime's wrapper (MGP106).
        rebased = site.kind == SUBCLASS and type(site.call.func) is cst.Name and site.call.func.value in rebased_names
        (wraps if site.call in rewritten or site.call in models.by_hand or rebased else kept).append(site.call)
    existing = existing_setup(analysis)
    starting, refused = _beside(analysis, existing, wraps) if beside and existing and wraps else (None, None)
    already = any(analysis.resolve(call.func) == RUNTIME_SETUP for call in analysis.calls)
    sites = bool(analysis.models.sites)
    modules = fallbacks() if existing and not sites else ()
    fallback = tuple(fallback_builders(analysis, modules)) if modules else ()
    program = Program(
        tuple(wraps),
        tuple(kept),
        existing,
        already,
        starts() if not sites else (),
        holds if not sites else (),
        fallback,
        handed if not sites else (),
        None if kept else starting,
        refused,
    )
    # (``setup(processes=1)`` is the runtime's: under ``--style torch`` every process runs the whole program)
    alone = one_process_branch(analysis, program) if beside else None
    return replace(program, one_process=alone) if alone is not None else program


def started_beside(analysis: FileAnalysis, existing: tuple[cst.Call, ...], wraps: Collection[cst.Call]) -> cst.If | None:
    """The ``if`` that starts the file's own distributed path (its one ``mp.spawn``) under a condition, with an
    ``else`` that does not (SimCLR's main.py: ``if args.nodes > 1: mp.spawn(main, args=(args,), nprocs=args.gpus)``,
    ``else: main(0, args)``), when every other call of that path (``init_process_group``, ``DistributedSampler``,
    torch's DDP) runs under an ``if`` of the same condition, no wrap does, and what the main block runs before
    that ``if`` prints nothing (it also runs in the process the set-up in the ``else`` relaunches). Then the own
    path is one the fallback's processes never take: the fallback migrates beside it. None otherwise."""
    return _beside(analysis, existing, wraps)[0]


def _beside(
    analysis: FileAnalysis, existing: tuple[cst.Call, ...], wraps: Collection[cst.Call]
) -> tuple[cst.If | None, str | None]:
    spawns = [call for call in existing if analysis.resolve(call.func) in SPAWNS]
    joins = [call for call in existing if analysis.resolve(call.func) in _JOINS]
    if len(spawns) == 1:
        start = spawns[0]
    elif not spawns and len(joins) == 1 and not chosen_by_launcher(analysis):
        # No start of its own: an option chooses the path (``--world-size 2 --rank r``, each process launched by
        # hand), which joins its group under an ``if``; a plain start (the option's default) runs the fallback, and
        # so does every process the set-up relaunches, with the same command line (none reads a launcher's variable).
        start = joins[0]
    else:
        return None, None
    guard = next(iter(analysis.tree.enclosing_ifs(start)), None)
    if guard is None:
        return None, "it starts whatever the options" if spawns else None
    if guard[1] or type(guard[0]) is not cst.If:
        return None, "no `else` of that `if` runs the fallback"
    starting = guard[0]
    if spawns:
        if type(starting.orelse) is not cst.Else:
            return None, "no `else` of that `if` runs the fallback"
    elif starting.orelse is not None:
        return None, "its `if` has another branch"
    holder = next((a for a in analysis.tree.ancestors(starting) if type(a) in (cst.FunctionDef, cst.ClassDef, cst.Lambda)), None)
    if holder is not None:
        why = _run_from_the_top(analysis, starting, holder)
        if why is not None:
            return None, why
    for call in existing:
        if not on_own_path(analysis, starting, call):
            line, _ = analysis.position(call)
            return None, f"line {line} runs under another condition"
    for wrap in wraps:
        if on_own_path(analysis, starting, wrap):
            line, _ = analysis.position(wrap)
            return None, f"the wrap (line {line}) runs under it"
    # A set-up placed after the ``if`` that joins the own path says what printed before it (MGP337); one in the
    # ``else`` of a start could not say it there.
    said = _says_before(analysis, starting) if spawns else None
    if said is None and holder is not None:
        said = _says_before_call(analysis, cast(cst.FunctionDef, holder))
    if said is not None:
        line, _ = analysis.position(said)
        return None, f"line {line} prints before it"
    return starting, None


def _run_from_the_top(analysis: FileAnalysis, starting: cst.If, holder: cst.CSTNode) -> str | None:
    """Why the set-up beside the own path could not go in ``holder``, the function whose body holds ``starting``
    (mobilenetv2's and semseg's ``main()``); None when it can: a function of the module's top, called once in the
    file, by a statement of its own in the main block (or at the top), so that every process the set-up
    relaunches runs it again to the same place."""
    name = holder.name.value if type(holder) is cst.FunctionDef or type(holder) is cst.ClassDef else "lambda"
    if type(holder) is not cst.FunctionDef or holder not in analysis.module.body:
        return f"its `if` is in `{name}()`, not at the top"
    if type(holder.body) is not cst.IndentedBlock or starting not in holder.body.body:
        return f"its `if` is inside another statement of `{name}()`"
    calls = [call for call in analysis.calls if type(call.func) is cst.Name and call.func.value == name]
    statements = top_statements(analysis)
    if len(calls) != 1 or not any(
        type(statement) is cst.SimpleStatementLine and contains(statement, lambda node: node is calls[0]) for statement in statements
    ):
        return f"`{name}()` is not called once from the top"
    return None


def _says_before_call(analysis: FileAnalysis, holder: cst.FunctionDef) -> cst.Call | None:
    """The first call that prints or logs in the statements of the module's top and main block that run before the
    one calling ``holder`` (``_run_from_the_top``)."""
    for statement in top_statements(analysis):
        if any(type(call.func) is cst.Name and call.func.value == holder.name.value for call in contains(statement, lambda node: type(node) is cst.Call)):
            return None
        for call in contains(statement, lambda node: type(node) is cst.Call):
            if _says(analysis, call):
                return call
    return None


def one_process_branch(analysis: FileAnalysis, program: Program) -> cst.If | None:
    """The ``if`` of every wrap whose ``else`` runs without one, when the set-up at the file's entry point relaunches
    only under its test and the ``else`` stays one process (``analysis.entrypoint.one_process_otherwise``; DeepLabv3's
    evaluation on ``--gpu``): that branch is the original's one process, whose GPU choice stays its own. None
    otherwise (a file with a distributed path of its own, set up already, or with no entry point of its own)."""
    entry = analysis.entry_point
    if not program.migrates or program.existing or program.already_set_up or entry is None or entry.when is not None:
        return None
    return one_process_otherwise(analysis, program.wraps, entry.anchor)


def on_own_path(analysis: FileAnalysis, starting: cst.If, node: cst.CSTNode) -> bool:
    """Whether ``node`` runs only under the condition that starts the own path (``started_beside``): inside the
    branch of an ``if`` with the same condition (the ``if`` that starts it included)."""
    condition = analysis.code_of(starting.test)
    negated = f"not {condition}"
    return any(
        analysis.code_of(found.test) == (negated if orelse else condition) for found, orelse in analysis.tree.enclosing_ifs(node)
    )


def runtime_before(analysis: FileAnalysis, starting: cst.If, edits: Edits) -> cst.CSTNode | None:
    """A node where the edits call the runtime in code that runs before ``starting`` (``Program.beside``): at
    module level or in its main block before that ``if``, or in a function of the file called there. In the
    process that starts the own path such a call would set up the runtime's job (``setup()``, which relaunches a
    plain start) before ``leave_to_own_path()`` runs; None when there is none."""
    line, _ = analysis.position(starting)
    early = [statement for statement in top_statements(analysis) if analysis.position(statement)[0] < line]
    called = {
        call.func.value
        for statement in early
        for call in contains(statement, lambda node: type(node) is cst.Call)
        if type(call.func) is cst.Name
    }
    module = cst.Module([])

    def calls_runtime(made: object) -> bool:
        if isinstance(made, cst.FlattenSentinel):
            return any(calls_runtime(node) for node in made.nodes)
        return isinstance(made, cst.CSTNode) and f"{_RUNTIME_MODULE}." in module.code_for_node(made)

    def replaced_by_runtime(node: cst.CSTNode, replacements: list) -> bool:
        try:
            return any(calls_runtime(replacement(node)) for replacement in replacements)
        except Exception:  # noqa: BLE001 -- a replacement written for the node its children's edits made: taken as calling it
            return True

    # The function whose body holds ``starting`` (``_run_from_the_top``): its statements before it run first too.
    own = next((a for a in analysis.tree.ancestors(starting) if type(a) in (cst.FunctionDef, cst.ClassDef, cst.Lambda)), None)

    def early_node(node: cst.CSTNode) -> bool:
        holder = next((a for a in analysis.tree.ancestors(node) if type(a) in (cst.FunctionDef, cst.ClassDef, cst.Lambda)), None)
        if holder is None or holder is own:
            return analysis.position(node)[0] < line
        return type(holder) is cst.FunctionDef and holder.name.value in called

    for node, replacements in edits.replacements.items():
        if early_node(node) and replaced_by_runtime(node, replacements):
            return node
    for insertions in (edits.before, edits.after):
        for anchor, statements in insertions.items():
            if early_node(anchor) and any(calls_runtime(statement) for statement in statements):
                return anchor
    return None


def _says_before(analysis: FileAnalysis, starting: cst.If) -> cst.Call | None:
    """The first call of a statement of the block holding ``starting``, before it, that prints or logs."""
    block = next((a for a in analysis.tree.ancestors(starting) if type(a) in (cst.IndentedBlock, cst.Module)), None)
    if block is None:
        return None
    for statement in cast("cst.IndentedBlock | cst.Module", block).body:
        if statement is starting:
            return None
        for call in contains(statement, lambda node: type(node) is cst.Call):
            if _says(analysis, call):
                return call
    return None


def _says(analysis: FileAnalysis, call: cst.Call) -> bool:
    """Whether ``call`` prints or logs."""
    resolved = analysis.resolve(call.func)
    named = call.func.value if type(call.func) is cst.Name else None
    return resolved in _SAYING or named in _SAYING or (type(call.func) is cst.Attribute and call.func.attr.value in _SAYING_METHODS)


def settle(program: Program, edits: Edits) -> None:
    """Leave the whole ``--to ddp`` file as it is when a wrap stays or a program rule vetoed it.

    A kept wrap keeps every review diagnostic (its isinstance checks and criteria stay as they are too). A
    veto (a code with ``veto`` reported) keeps only the vetoes reported and what the wrap rules said about the
    wraps (``kept_when_left``): what was said about the distributed program the file would have become no longer
    applies. The edits a rule kept for the file's own way of running stay (``Edits.keep_if_left``: the
    ``--local_rank`` default of a file that launches its own distributed path, MGP131).

    A file with a distributed set-up of its own (``existing``) never becomes the runtime's program: its
    DataParallel fallback stays as it is, and only what serves its own path stays (MGP131, and the launch of
    that path from a plain start, MGP139), with what was said about them (``kept_when_left``). A module whose
    wraps are the fallback of scripts that launch their own path (``Edits.leave_as_fallback``) stays as it is.
    """
    if program.left_whole:
        edits.discard_rewrites()
        return
    if edits.left_as_fallback:
        edits.discard_rewrites(keep=lambda code: code.kept_when_left)
    elif any(code.veto for code in edits.reported()):
        edits.discard_rewrites(keep=lambda code: code.veto or code.kept_when_left, survivors=True)
    elif program.own_path:
        edits.discard_rewrites(keep=lambda code: code.kept_when_left, survivors=True)
