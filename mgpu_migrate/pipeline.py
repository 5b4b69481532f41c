"""The rewrite pipeline: parse, analyse once, collect every rule's edits, apply, tidy imports, verify."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis import FileAnalysis
from mgpu_migrate.diagnostics import INTERNAL_ERROR, PARSE_ERROR, Diagnostic, error_summary
from mgpu_migrate.edits import Edits, apply
from mgpu_migrate.engine import MigrationResult
from mgpu_migrate.imports import add_import, name_uses, remove_orphaned
from mgpu_migrate.options import DEFAULT_OPTIONS, Options
from mgpu_migrate.rules import rules_for, settle


def _parse_error(path: str, source: str, error: Exception) -> Diagnostic:
    if isinstance(error, cst.ParserSyntaxError):
        line, col = error.raw_line, error.raw_column + 1
        message = str(error).splitlines()[0]
    elif isinstance(error, SyntaxError):
        line, col = error.lineno or 1, error.offset or 1
        message = error.msg
    else:
        line, col, message = 1, 1, str(error)
    return Diagnostic(path, line, col, PARSE_ERROR, f"cannot parse: {message}; file left unchanged")


def _parse(source: str) -> cst.Module:
    # libcst accepts some code CPython rejects (and the reverse on new syntax): require both to agree.
    compile(source, "<source>", "exec", dont_inherit=True)
    return cst.parse_module(source)


def run_pipeline(source: str, target: str, path: str, options: Options = DEFAULT_OPTIONS) -> MigrationResult:
    try:
        module = _parse(source)
    except (cst.ParserSyntaxError, SyntaxError, ValueError) as error:
        return MigrationResult(path, source, source, error=_parse_error(path, source, error))
    except (RecursionError, MemoryError):
        message = "cannot parse: the code is nested too deeply; file left unchanged"
        return MigrationResult(path, source, source, error=Diagnostic(path, 1, 1, PARSE_ERROR, message))
    try:
        return _migrate(module, source, target, path, options)
    except RecursionError:
        message = "file too deeply nested to analyse; file left unchanged"
    except Exception as error:  # noqa: BLE001 -- one odd file must never stop the run or lose data
        message = f"internal error ({error_summary(error)}); file left unchanged, please report"
    return MigrationResult(path, source, source, error=Diagnostic(path, 1, 1, INTERNAL_ERROR, message))


def _migrate(module: cst.Module, source: str, target: str, path: str, options: Options) -> MigrationResult:
    analysis = FileAnalysis(path, source, module)
    edits = Edits(path)
    for rule in rules_for(target):
        rule(target, analysis, edits, options).apply()
    settle(target, analysis, edits)
    diagnostics = sorted(edits.diagnostics)
    if edits.empty:
        return MigrationResult(path, source, source, diagnostics)
    if analysis.code() != source:
        # LibCST drops some blank lines and comments after the last statement when whitespace-only lines
        # are among them; writing its output would lose them. Checked only for files about to change.
        message = (
            "cannot rewrite without losing the comments or blank lines at the end of the file (the parser drops "
            "them after a whitespace-only line); file left unchanged"
        )
        return MigrationResult(path, source, source, error=Diagnostic(path, 1, 1, PARSE_ERROR, message))
    uses_before = name_uses(module)
    new_module = apply(module, edits, analysis.tree.parent)
    for name in edits.imports:
        new_module = add_import(new_module, name)
    new_module = remove_orphaned(new_module, analysis.bindings, uses_before)
    output = analysis.code(new_module)
    try:
        compile(output, path, "exec", dont_inherit=True)
    except SyntaxError as error:
        message = f"internal error: the rewrite did not parse ({error.msg}); file left unchanged, please report"
        return MigrationResult(path, source, source, diagnostics, Diagnostic(path, 1, 1, INTERNAL_ERROR, message))
    return MigrationResult(path, source, output, diagnostics)
