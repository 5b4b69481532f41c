"""The rewrite pipeline: parse, analyse once, plan the edits phase by phase, apply, tidy imports, verify.

Planning runs the rules in three phases (``rules.base``): the wrap rules decide each wrap; the file's one
verdict is decided from what they did (``program.decide``); the program rules and then the checks run with
that verdict; last, ``program.settle`` drops every rewrite of a ``--to ddp`` file that must stay as it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
import gc
import warnings

import libcst as cst

from mgpu_migrate import form_feeds, old_keywords
from mgpu_migrate.analysis import FileAnalysis
from mgpu_migrate.diagnostics import INTERNAL_ERROR, PARSE_ERROR, Diagnostic, error_summary, shorten
from mgpu_migrate.edits import Edits, apply
from mgpu_migrate.imports import add_import, name_uses, remove_orphaned
from mgpu_migrate.options import DEFAULT_OPTIONS, RUNTIME_STYLE, TORCH_STYLE, Options
from mgpu_migrate.program import decide, runtime_before, settle
from mgpu_migrate.results import MigrationResult
from mgpu_migrate.rules import rules_for
from mgpu_migrate.rules.base import CHECKS, DDP, PROGRAM, WRAPS, Rule
from mgpu_migrate.rules.entry_point import EXISTING_DISTRIBUTED_SETUP
from mgpu_migrate.rules.syntax import RUNTIME
from mgpu_migrate.rules.torch_style import NEEDS_RUNTIME


def _parse_error(path: str, source: str, error: Exception) -> Diagnostic:
    if isinstance(error, cst.ParserSyntaxError):
        line, col = error.raw_line, error.raw_column + 1
        message = str(error).splitlines()[0]
    elif isinstance(error, SyntaxError):
        line, col = error.lineno or 1, error.offset or 1
        message = error.msg
    else:
        line, col, message = 1, 1, str(error)
    return Diagnostic(path, line, col, PARSE_ERROR, f"cannot parse: {shorten(message, 100)}; file left unchanged")


def _parse(source: str) -> cst.Module:
    # libcst accepts some code CPython rejects (and the reverse on new syntax): require both to agree.
    _compile(source, "<source>")
    return cst.parse_module(source)


def _compile(code: str, name: str) -> None:
    """Raise the ``SyntaxError`` that CPython would; its warnings (``"x" is "y"``, invalid escapes) are the
    user's to see when the script runs, not one line of this tool's output per compile (nor errors under -W)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile(code, name, "exec", dont_inherit=True)


def run_pipeline(
    source: str,
    target: str,
    path: str,
    options: Options = DEFAULT_OPTIONS,
    only: tuple[type[Rule], ...] | None = None,
    starts: Callable[[], tuple[str, ...]] = tuple,
    holds: tuple[str, ...] = (),
    fallbacks: Callable[[], tuple[str, ...]] = tuple,
    handed: tuple[str, ...] = (),
) -> MigrationResult:
    """Migrate one file's text (``only``: run the wrap rules and these rules alone, as a rule's examples do;
    ``starts``: gives the project modules this script starts as distributed programs, ``engine.started_programs``; ``holds``: the modules whose wrapped model it trains, ``engine.held_programs``; ``fallbacks``: gives the
    modules that may hold its DataParallel fallback beside a distributed path of its own, ``engine.own_path_fallbacks``;
    ``handed``: the scripts that hand its training code a wrapped model, ``engine.handed_programs``)."""
    readable, renamed = old_keywords.set_aside(source)  # PyTorch's `async=`, a syntax error (old_keywords.py)
    parsed, aside = form_feeds.set_aside(readable)  # what LibCST would misread (form_feeds.py)
    with _collector_paused():
        result = form_feeds.put_back(_run_pipeline(parsed, target, path, options, only, starts, holds, fallbacks, handed), readable, aside)
    return old_keywords.put_back(result, source) if renamed else result


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector paused while one file is migrated, and its young objects collected
    after. What a migration allocates (the tree, its index, the flows) lives until the file is done and is then
    freed by reference counting (``FileAnalysis.release``), so every collection during the file walked tens of
    thousands of live objects for nothing: 0.4 s of the 100 benchmark scripts' 5 s (benchmarks/RESULTS.md).
    A caller who turned the collector off keeps it off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)


def _run_pipeline(
    source: str,
    target: str,
    path: str,
    options: Options,
    only: tuple[type[Rule], ...] | None,
    starts: Callable[[], tuple[str, ...]] = tuple,
    holds: tuple[str, ...] = (),
    fallbacks: Callable[[], tuple[str, ...]] = tuple,
    handed: tuple[str, ...] = (),
) -> MigrationResult:
    try:
        module = _parse(source)
    except (cst.ParserSyntaxError, SyntaxError, ValueError) as error:
        return MigrationResult(path, source, source, error=_parse_error(path, source, error))
    except (RecursionError, MemoryError):
        message = "cannot parse: the code is nested too deeply; file left unchanged"
        return MigrationResult(path, source, source, error=Diagnostic(path, 1, 1, PARSE_ERROR, message))
    try:
        return _migrate(module, source, target, path, options, only, starts, holds, fallbacks, handed)
    except RecursionError:
        message = "file too deeply nested to analyse; file left unchanged"
    except Exception as error:  # noqa: BLE001 -- one odd file must never stop the run or lose data
        message = f"internal error ({error_summary(error)}); file left unchanged, please report"
    return MigrationResult(path, source, source, error=Diagnostic(path, 1, 1, INTERNAL_ERROR, message))


def plan(
    analysis: FileAnalysis,
    target: str,
    options: Options,
    only: tuple[type[Rule], ...] | None = None,
    starts: Callable[[], tuple[str, ...]] = tuple,
    holds: tuple[str, ...] = (),
    fallbacks: Callable[[], tuple[str, ...]] = tuple,
    handed: tuple[str, ...] = (),
) -> Edits:
    """Every rule's edits and diagnostics for the file, phase by phase.

    ``only`` (a rule's examples): the wrap rules and these rules alone, with the program phase too for a check
    (a check reviews the program the earlier phases made).
    """
    edits = Edits(analysis.path)
    style = options.style if target == DDP else RUNTIME_STYLE
    needs_runtime: list[tuple[type[Rule], int]] = []
    for rule in rules_for(target, WRAPS, style):
        _run(rule(target, analysis, edits, options), needs_runtime)
    program = decide(analysis, edits.replacements, starts, holds, fallbacks, handed, beside=target == DDP and style == RUNTIME_STYLE)
    whole_program = only is None or any(rule.PHASE == CHECKS for rule in only)
    for phase in (PROGRAM, CHECKS):
        rewritten = frozenset(edits.replacements)
        # The checks review what the earlier phases did: also what they reported (their codes).
        reported = edits.reported() if phase == CHECKS else frozenset()
        for rule in rules_for(target, phase, style):
            if rule in (only or ()) or (whole_program and (only is None or phase == PROGRAM)):
                _run(rule(target, analysis, edits, options, program, rewritten, reported), needs_runtime)
    if target == DDP:
        if program.beside is not None:
            early = runtime_before(analysis, program.beside, edits)
            if early is not None:
                line, _ = analysis.position(early)
                edits.report_at(
                    program.beside,
                    EXISTING_DISTRIBUTED_SETUP,
                    f"own distributed path, started here, left: the migration would call the runtime before it (line {line})",
                )
        settle(program, edits)
    edits.place(analysis.position)
    if style == TORCH_STYLE and needs_runtime and not edits.empty:
        _leave_for_runtime(edits, *needs_runtime[0])
    if style == TORCH_STYLE and edits.empty:
        # What the torch rules said about the program the file would have become: it stays as it was.
        edits.discard_diagnostics(lambda code: code.void_if_left)
    return edits


def _run(rule: Rule, needs_runtime: list[tuple[type[Rule], int]]) -> None:
    """Apply one rule; note the first that asks for the runtime (and its first diagnostic's index)."""
    asked, first = RUNTIME in rule.edits.imports, len(rule.edits.diagnostics)
    rule.apply()
    if not asked and RUNTIME in rule.edits.imports:
        needs_runtime.append((type(rule), first))


def _leave_for_runtime(edits: Edits, rule: type[Rule], first: int) -> None:
    """``--style torch``: a rewrite that only the runtime can make leaves the whole file as it is (MGP295)."""
    said = [d for d in edits.diagnostics[first:] if d.is_rewrite] or edits.diagnostics[first:] or edits.diagnostics
    where = said[0] if said else None
    # As for a veto (``program.settle``): what was said about the program the file would have become goes.
    edits.discard_rewrites(keep=lambda code: code.kept_when_left)
    edits.report(
        where.line if where else 1,
        where.col if where else 1,
        NEEDS_RUNTIME,
        f"--style torch has no plain-PyTorch form for {rule.CODE.code} ({shorten(rule.DESCRIPTION, 50)}): file left as it "
        "is; use the default style",
    )


def _migrate(
    module: cst.Module,
    source: str,
    target: str,
    path: str,
    options: Options,
    only: tuple[type[Rule], ...] | None,
    starts: Callable[[], tuple[str, ...]] = tuple,
    holds: tuple[str, ...] = (),
    fallbacks: Callable[[], tuple[str, ...]] = tuple,
    handed: tuple[str, ...] = (),
) -> MigrationResult:
    analysis = FileAnalysis(path, source, module)
    try:
        return _migrated(analysis, module, source, target, path, options, only, starts, holds, fallbacks, handed)
    finally:
        analysis.release()


def _migrated(
    analysis: FileAnalysis,
    module: cst.Module,
    source: str,
    target: str,
    path: str,
    options: Options,
    only: tuple[type[Rule], ...] | None,
    starts: Callable[[], tuple[str, ...]] = tuple,
    holds: tuple[str, ...] = (),
    fallbacks: Callable[[], tuple[str, ...]] = tuple,
    handed: tuple[str, ...] = (),
) -> MigrationResult:
    edits = plan(analysis, target, options, only, starts, holds, fallbacks, handed)
    diagnostics = sorted(edits.diagnostics)
    if edits.empty:
        return MigrationResult(path, source, source, diagnostics)
    if analysis.code() != source:
        # LibCST drops some blank lines and comments after the last statement when whitespace-only lines
        # are among them; writing its output would lose them. Checked only for files about to change.
        message = "cannot rewrite without losing the comments or blank lines at the end of the file; file left unchanged"
        return MigrationResult(path, source, source, error=Diagnostic(path, 1, 1, PARSE_ERROR, message))
    uses_before = name_uses(module)
    new_module = apply(module, edits, analysis.tree.parent)
    for name in edits.imports:
        new_module = add_import(new_module, name)
    new_module = remove_orphaned(new_module, analysis.bindings, uses_before)
    output = analysis.code(new_module)
    try:
        _compile(output, path)
    except SyntaxError as error:
        message = f"internal error: the rewrite did not parse ({shorten(error.msg, 60)}); file left unchanged, please report"
        return MigrationResult(path, source, source, diagnostics, Diagnostic(path, 1, 1, INTERNAL_ERROR, message))
    return MigrationResult(path, source, output, diagnostics)
