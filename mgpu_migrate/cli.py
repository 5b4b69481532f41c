"""The ``mgpu-migrate`` command line. Importing it never imports torch."""

from __future__ import annotations

import os
import sys

import click

from mgpu_migrate import __version__
from mgpu_migrate.config import ConfigError, load_settings, parse_size
from mgpu_migrate.engine import TARGETS, migrate_source
from mgpu_migrate.options import Options
from mgpu_migrate.report import (
    CHANGED,
    DEFAULT_MAX_FILE_SIZE,
    FAILED,
    FileOutcome,
    outcome_of,
    outside_tree,
    process_files,
    summary,
)

EXIT_OK, EXIT_WOULD_CHANGE, EXIT_ERROR = 0, 1, 2


def _cores() -> int:
    """The cores this process may run on (a container's CPU set, not the whole machine's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _explain(code: str) -> None:
    """Print a code's page, or (no code) the list of every code."""
    from mgpu_migrate.codes import CODES, lookup

    if not code:
        for info in CODES.values():
            click.echo(f"{info.code}  {info.kind:<7}  {info.summary}")
        return
    info = lookup(code)
    if info is None:
        raise click.UsageError(f"unknown code {code!r} (--list-codes lists them)")
    click.echo(info.page, nl=False)


def _process_stdin(target: str, check: bool, diff: bool, filename: str, options: Options) -> FileOutcome:
    from mgpu_migrate.diagnostics import READ_ERROR, Diagnostic
    from mgpu_migrate.files import source_file

    data = sys.stdin.buffer.read()
    try:
        stdin = source_file(filename, data)
        source = stdin.text
    except (SyntaxError, UnicodeDecodeError, LookupError) as error:
        sys.stdout.buffer.write(data)
        return FileOutcome(filename, FAILED, [Diagnostic(filename, 1, 1, READ_ERROR, f"cannot read: {error}")])
    result = migrate_source(source, target, filename, options)
    outcome = outcome_of(result, want_diff=diff)
    if diff:
        sys.stdout.write(outcome.diff)
    elif not check:
        sys.stdout.buffer.write(result.output.encode(stdin.encoding))
    return outcome


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, metavar="PATH...")
@click.option("--to", "target", type=click.Choice(TARGETS), help="Migration target (or [tool.mgpu-migrate] to = ...).")
@click.option("--diff", is_flag=True, help="Print a unified diff; write nothing.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if any file would change.")
@click.option("-q", "--quiet", is_flag=True, help="Print only sites left for review, errors and nothing else.")
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=_cores,
    show_default="the number of cores",
    help="Processes to migrate files on (started only when enough files need migrating).",
)
@click.option(
    "--sync-bn/--no-sync-bn",
    default=None,
    help="With --to ddp: convert BatchNorm layers to SyncBatchNorm (statistics over the whole global batch). "
    "Default: [tool.mgpu-migrate] sync-bn, else off.",
)
@click.option(
    "--max-file-size",
    metavar="SIZE",
    help="Leave files larger than this (e.g. 5MB; 0: no limit) with MGP006. "
    "Default: [tool.mgpu-migrate] max-file-size, else 2MB.",
)
@click.option("--stdin-filename", default="<stdin>", show_default=True, help="Name used for '-' in diagnostics.")
@click.option(
    "--explain",
    metavar="CODE",
    is_flag=False,
    flag_value="",
    help="Print the page of a diagnostic code and exit (no CODE: list every code).",
)
@click.option("--list-codes", is_flag=True, help="List every diagnostic code (code, kind, summary) and exit.")
@click.version_option(__version__, prog_name="mgpu-migrate")
def main(paths, target, diff, check, quiet, jobs, sync_bn, max_file_size, stdin_filename, explain, list_codes):
    """Rewrite PyTorch scripts that use nn.DataParallel.

    PATH is a file or a directory (walked for *.py); '-' reads stdin and writes stdout.

    Exit codes: 0 done or nothing to do; 1 --check/--diff found files that would change;
    2 a usage error, or a file that could not be processed.
    """
    if explain is not None or list_codes:
        _explain(explain or "")
        return
    if not paths:
        raise click.UsageError("give at least one PATH (a file, a directory, or '-' for stdin)")
    if "-" in paths and len(paths) > 1:
        raise click.UsageError("'-' (stdin) cannot be combined with other paths")
    try:
        settings = load_settings(list(paths))
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    if target is None:
        target = settings.to
        if target not in TARGETS:
            raise click.UsageError(
                "choose a target with --to [balanced|ddp] (or set to = \"ddp\" under [tool.mgpu-migrate] in pyproject.toml)"
            )

    options = Options(sync_bn=settings.sync_bn if sync_bn is None else sync_bn)
    try:
        size_limit = parse_size(max_file_size) if max_file_size is not None else settings.max_file_size
    except ValueError:
        raise click.BadParameter(f"{max_file_size!r} is not a size (bytes, or like 5MB)", param_hint="--max-file-size")
    if size_limit is None:
        size_limit = DEFAULT_MAX_FILE_SIZE
    if paths == ("-",):
        outcomes = [_process_stdin(target, check, diff, stdin_filename, options)]
        missing: list[str] = []
    else:
        from mgpu_migrate.files import discover

        outside: list[str] = []
        found, missing = discover(list(paths), settings.excluded, outside)
        write = not (check or diff)
        outcomes = process_files(found, target, write, diff, jobs, options, size_limit)
        outcomes += [outside_tree(path) for path in outside]
        for outcome in outcomes:
            if outcome.diff:
                click.echo(outcome.diff, nl=False)

    diagnostics = sorted(d for outcome in outcomes for d in outcome.diagnostics)
    for path in missing:
        click.echo(f"{path}:1:1: MGP001 cannot read: no such file or directory", err=True)
    for diagnostic in diagnostics:
        if quiet and diagnostic.is_rewrite:
            continue
        click.echo(diagnostic.format(), err=True)
    if not quiet:
        click.echo(summary(outcomes, target, dry_run=check or diff), err=True)

    if missing or any(outcome.status == FAILED for outcome in outcomes):
        sys.exit(EXIT_ERROR)
    if (check or diff) and any(outcome.status == CHANGED for outcome in outcomes):
        sys.exit(EXIT_WOULD_CHANGE)
    sys.exit(EXIT_OK)
