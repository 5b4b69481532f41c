"""The ``mgpu-migrate`` command line (design §1). Importing it never imports torch."""

from __future__ import annotations

import os
import sys

import click

from mgpu_migrate import __version__, notebook
from mgpu_migrate.config import SIZE_UNITS_SHOWN, ConfigError, Resolver, codes_option, parse_size
from mgpu_migrate.engine import TARGETS, migrate_source
from mgpu_migrate.options import DDP, STYLES, TORCH_STYLE, Options
from mgpu_migrate.output import DOCUMENT_FORMATS, FORMATS, TEXT_FORMATS, Run, markers, render, text
from mgpu_migrate.output.terminal import Progress
from mgpu_migrate.report import (
    CHANGED,
    DEFAULT_MAX_FILE_SIZE,
    FAILED,
    UNCHANGED,
    FileOutcome,
    outcome_of,
    outside_tree,
    process_files,
)
from mgpu_migrate.verify import CommandWithVerify

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


def _process_stdin(target: str, check: bool, diff: bool, filename: str, options: Options, document: bool) -> FileOutcome:
    """Migrate stdin. Stdout carries the code, or the diff (unless the report is a document there)."""
    from mgpu_migrate.diagnostics import READ_ERROR, Diagnostic
    from mgpu_migrate.files import source_file

    data = sys.stdin.buffer.read()
    try:
        stdin = source_file(filename, data)
        source = stdin.text
    except (SyntaxError, UnicodeDecodeError, LookupError) as error:
        if not document:
            sys.stdout.buffer.write(data)
        return FileOutcome(filename, FAILED, [Diagnostic(filename, 1, 1, READ_ERROR, f"cannot read: {error}")])
    result = migrate_source(source, target, filename, options)
    outcome = markers.review_notes(outcome_of(result, want_diff=diff or document), result, written=False)
    if diff and not document:
        sys.stdout.write(outcome.diff)
    elif not (check or diff):
        sys.stdout.buffer.write(result.output.encode(stdin.encoding))
    return outcome


@click.command(cls=CommandWithVerify, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, metavar="PATH...")
@click.option("--to", "target", type=click.Choice(TARGETS), help="Migration target (or [tool.mgpu-migrate] to = ...).")
@click.option("--diff", is_flag=True, help="Print a unified diff; write nothing.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if any file would change.")
@click.option("-q", "--quiet", is_flag=True, help="Print only sites left for review, errors and nothing else.")
@click.option(
    "--show-rewrites/--hide-rewrites",
    default=None,
    help="List each rewrite (MGP1xx) in every output format. Default: listed, except with --check, which reports "
    "what needs a person (sites left for review, errors) and names the files that would change.",
)
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
    "--style",
    type=click.Choice(STYLES),
    default=None,
    help="With --to ddp: 'runtime' calls the bundled mgpu_runtime; 'torch' writes plain PyTorch (init_process_group, "
    "DistributedSampler, torch's DistributedDataParallel) and leaves a file it cannot write so. "
    "Default: [tool.mgpu-migrate] style, else runtime.",
)
@click.option(
    "--max-file-size",
    metavar="SIZE",
    help="Leave files larger than this (e.g. 5MB; 0: no limit) with MGP006. "
    "Default: [tool.mgpu-migrate] max-file-size, else 2MB.",
)
@click.option(
    "--color",
    "color_choice",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Colour the diagnostics and diffs: auto colours a terminal (NO_COLOR turns it off, FORCE_COLOR on).",
)
@click.option("--stdin-filename", default="<stdin>", show_default=True, help="Name used for '-' in diagnostics.")
@click.option(
    "--output-format",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="text (or concise): diagnostics on stderr; full: with the line of code and a caret; json (schema: mgpu_migrate/schemas/report-v1.json), github (workflow "
    "annotations) or sarif (2.1.0): one report on stdout.",
)
@click.option(
    "--fail-on",
    type=click.Choice(["change", "review"]),
    default="change",
    show_default=True,
    help="change: exit 1 when --check/--diff find files that would change; review: also exit 1 (in any mode) "
    "when a site is left for a person (MGP2xx).",
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False),
    help="Also write a markdown report to this file: each change, every site left for a person, how to launch.",
)
@click.option(
    "--add-markers",
    is_flag=True,
    help="Write a '# mgpu-migrate: review CODE' comment above each site left for a person; later runs report "
    "it again until the comment is removed.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, exists=True),
    help="Settings for every file from this file (a pyproject.toml, or the [tool.mgpu-migrate] keys alone), "
    "instead of each file's nearest pyproject.toml.",
)
@click.option("--select", "select_codes", metavar="CODES", help="Report only these sites for a person (codes or prefixes, comma-separated).")
@click.option("--ignore", "ignore_codes", metavar="CODES", help="Do not report these sites for a person (codes or prefixes, comma-separated).")
@click.option(
    "--explain",
    metavar="CODE",
    is_flag=False,
    flag_value="",
    help="Print the page of a diagnostic code and exit (no CODE: list every code).",
)
@click.option("--list-codes", is_flag=True, help="List every diagnostic code (code, kind, summary) and exit.")
@click.version_option(__version__, prog_name="mgpu-migrate")
def main(
    paths, target, diff, check, quiet, show_rewrites, jobs, sync_bn, style, max_file_size, color_choice, stdin_filename, output_format, fail_on, report_path, add_markers,
    config_file, select_codes, ignore_codes, explain, list_codes,
):
    """Rewrite PyTorch scripts that use nn.DataParallel.

    PATH is a file or a directory (walked for *.py); '-' reads stdin and writes stdout.

    mgpu-migrate verify SCRIPT.py --to ddp checks that a migration trains as its original
    (mgpu-migrate verify --help); ./verify names a path called verify.

    Exit codes: 0 done or nothing to do; 1 --check/--diff found files that would change (or, with
    --fail-on review, a site is left for a person); 2 a usage error, or a file that could not be processed.
    """
    if explain is not None or list_codes:
        _explain(explain or "")
        return
    if not paths:
        raise click.UsageError("give at least one PATH (a file, a directory, or '-' for stdin)")
    if "-" in paths and len(paths) > 1:
        raise click.UsageError("'-' (stdin) cannot be combined with other paths")
    document = output_format in DOCUMENT_FORMATS
    if document and paths == ("-",) and not (check or diff):
        raise click.UsageError(f"--output-format {output_format} with '-' needs --check or --diff (stdout would carry the code)")
    if add_markers and (check or diff or paths == ("-",)):
        raise click.UsageError("--add-markers writes files: it cannot be combined with --check, --diff or '-'")
    try:
        choices = Choices(Resolver(config_file), target, sync_bn, select_codes, ignore_codes, max_file_size, style)
        if paths == ("-",):
            name = stdin_filename if stdin_filename != "<stdin>" else os.path.join(os.getcwd(), "-")
            file_target, options = choices.migration(name)
            if stdin_filename != "<stdin>" and choices.resolver.excluded(stdin_filename):
                # As a named file that `exclude` matches is skipped: the code goes through untouched.
                data = sys.stdin.buffer.read()
                if not (check or diff or document):
                    sys.stdout.buffer.write(data)
                outcomes = [FileOutcome(stdin_filename, UNCHANGED)]
            else:
                outcomes = [_process_stdin(file_target, check, diff, stdin_filename, options, document)]
            mode, targets = "stdin", {file_target}
        else:
            write = not (check or diff)
            outcomes, targets = _process_paths(paths, choices, write, diff or document or bool(report_path), jobs, quiet)
            if diff and not document:
                for outcome in outcomes:
                    click.echo(text.coloured_diff(outcome.diff), nl=False, color=_colour(color_choice))
            mode = "write" if write else "diff" if diff else "check"
        outcomes = [choices.reported(outcome) for outcome in outcomes]
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    if add_markers:
        outcomes = [_mark(outcome) for outcome in outcomes]
    rewrites_shown = not check if show_rewrites is None else show_rewrites
    if not rewrites_shown:
        outcomes = [_without_rewrites(outcome) for outcome in outcomes]
    elif check or diff:
        outcomes = [_not_written(outcome) for outcome in outcomes]

    target_name = ",".join(sorted(targets))
    run = Run(target_name, mode, outcomes)
    colour = _colour(color_choice)
    if output_format in TEXT_FORMATS:
        click.echo(text.render(run, quiet, full=output_format == "full"), err=True, nl=False, color=colour)
        if not (rewrites_shown or quiet):
            click.echo(text.changed_files(run), err=True, nl=False, color=colour)
    else:
        click.echo(render(output_format, run), nl=False)
    if not quiet:
        click.echo(summary(outcomes, target_name.replace(",", " and "), dry_run=check or diff), err=True)
    if report_path:
        from mgpu_migrate.output import markdown

        try:
            with open(report_path, "w", encoding="utf-8") as handle:
                handle.write(markdown.render(run))
        except OSError as error:
            click.echo(f"mgpu-migrate: cannot write the report {report_path}: {error.strerror or error}", err=True)
            sys.exit(EXIT_ERROR)

    if any(outcome.status == FAILED for outcome in outcomes):
        sys.exit(EXIT_ERROR)
    if (check or diff) and any(outcome.status == CHANGED for outcome in outcomes):
        sys.exit(EXIT_WOULD_CHANGE)
    if fail_on == "review" and any(diagnostic.needs_review for diagnostic in run.diagnostics):
        sys.exit(EXIT_WOULD_CHANGE)
    sys.exit(EXIT_OK)


def _colour(choice: str) -> bool | None:
    """click's ``color``: True or False as chosen; None lets click colour a terminal only."""
    if choice != "auto":
        return choice == "always"
    if os.environ.get("NO_COLOR"):
        return False
    return True if os.environ.get("FORCE_COLOR") else None


class Choices:
    """What each file is migrated with: the command line's choices over the file's own settings."""

    def __init__(self, resolver: Resolver, target, sync_bn, select_codes, ignore_codes, max_file_size=None, style=None) -> None:
        self.resolver = resolver
        self.target, self.sync_bn, self.style = target, sync_bn, style
        try:
            self.max_file_size = parse_size(max_file_size) if max_file_size is not None else None
        except ValueError:
            raise click.BadParameter(
                f"{max_file_size!r} is not a size (bytes, or like 5MB; units {SIZE_UNITS_SHOWN})",
                param_hint="--max-file-size",
            ) from None
        self.select = codes_option(select_codes, "--select")
        self.ignore = codes_option(ignore_codes, "--ignore")

    def migration(self, path: str) -> tuple[str, Options]:
        settings = self.resolver.for_path(path)
        target = self.target or settings.to
        if target is None:
            raise click.UsageError(
                "choose a target with --to [balanced|ddp] (or set to = \"ddp\" under [tool.mgpu-migrate] in pyproject.toml)"
            )
        style = settings.style if self.style is None else self.style
        if style == TORCH_STYLE and target != DDP:
            raise click.UsageError(f"--style torch is a style of --to ddp, not of --to {target}")
        sync_bn = settings.sync_bn if self.sync_bn is None else self.sync_bn
        if sync_bn and target != DDP:
            # One process, as DataParallel: each replica normalizes over its own chunk, and no SyncBatchNorm
            # runs without a process per device. Saying nothing would migrate without what was asked.
            where = "--sync-bn" if self.sync_bn else f"sync-bn = true ({settings.source})"
            raise click.UsageError(
                f"{where} is a choice of --to ddp; --to {target} keeps DataParallel's per-device BatchNorm statistics "
                "(pass --no-sync-bn)"
            )
        return target, Options(sync_bn=sync_bn, style=style)

    def size_limit(self, path: str) -> int:
        """Bytes over which a file is left (0: no limit): the command line's, the file's settings', the default."""
        if self.max_file_size is not None:
            return self.max_file_size
        configured = self.resolver.for_path(path).max_file_size
        return DEFAULT_MAX_FILE_SIZE if configured is None else configured

    def reported(self, outcome: FileOutcome) -> FileOutcome:
        """The outcome without the sites for a person that ``select``/``ignore`` leave out."""
        from dataclasses import replace

        settings = self.resolver.for_path(outcome.path)
        settings = replace(settings, select=self.select or settings.select, ignore=settings.ignore + self.ignore)
        kept = [d for d in outcome.diagnostics if settings.reports(d.code)]
        return outcome if len(kept) == len(outcome.diagnostics) else replace(outcome, diagnostics=kept)

    def excluded(self, named: set[str]):
        from mgpu_migrate.gitignore import GitIgnore

        git = GitIgnore()

        def excluded(path: str) -> bool:
            if self.resolver.excluded(path):
                return True
            # What git ignores is left out of walked directories; a file named explicitly is still processed.
            return path not in named and self.resolver.for_path(path).respect_gitignore and git.ignored(path)

        return excluded


def _is_python(path: str) -> bool:
    """A file to migrate when named explicitly: ``*.py``/``*.pyi``, or a script without a suffix whose first
    line runs Python (as pre-commit's ``types: [python]`` passes them)."""
    if path.endswith((".py", ".pyi", notebook.SUFFIX)) or os.path.isdir(path) or not os.path.lexists(path):
        return True
    if os.path.splitext(os.path.basename(path))[1]:
        return False
    from mgpu_migrate.files import head

    try:
        first = head(path, 200).split(b"\n", 1)[0]
    except OSError:
        return True  # reading it again reports why it cannot be read (a FIFO: not a regular file)
    return first.startswith(b"#!") and b"python" in first


def _process_paths(paths, choices: Choices, write: bool, want_diff: bool, jobs: int, quiet: bool):
    from mgpu_migrate.files import discover

    named = [path for path in paths if _is_python(path)]
    for path in paths:
        if path not in named and not quiet:
            click.echo(f"{path}: skipped: not a Python file", err=True)
    outside: list[str] = []
    from mgpu_migrate.started import name_roots

    name_roots(path for path in named if os.path.isdir(path))  # a project with no .git: the directory given is its top
    found, missing = discover(named, choices.excluded(set(named)), outside, suffixes=(".py", notebook.SUFFIX))
    # Files are migrated in groups of the same target, options and size limit (sub-projects may choose
    # differently).
    groups: dict[tuple[str, Options, int], list[int]] = {}
    for index, path in enumerate(found):
        groups.setdefault((*choices.migration(path), choices.size_limit(path)), []).append(index)
    if not found:
        first = named[0] if named else os.getcwd()
        groups.setdefault((*choices.migration(first), choices.size_limit(first)), [])
    outcomes: list[FileOutcome] = [None] * len(found)  # type: ignore[list-item]
    progress = Progress(enabled=not quiet)
    try:
        for (group_target, options, size_limit), indexes in groups.items():
            scripts = [index for index in indexes if not found[index].endswith(notebook.SUFFIX)]
            migrated = process_files(
                [found[i] for i in scripts], group_target, write, want_diff, jobs, options, progress, size_limit
            )
            for index, outcome in zip(scripts, migrated):
                outcomes[index] = outcome
            for index in set(indexes) - set(scripts):
                outcomes[index] = notebook.migrate_notebook(found[index], group_target, write, want_diff, options)
    finally:
        progress.close()
    outcomes += [outside_tree(path) for path in outside] + [_missing(path) for path in missing]
    return outcomes, {group_target for group_target, _, _ in groups}


def _mark(outcome: FileOutcome) -> FileOutcome:
    """The outcome of a file with review markers added (it is written again only when one is new)."""
    from dataclasses import replace

    from mgpu_migrate import files

    if outcome.status == FAILED or outcome.path.endswith(notebook.SUFFIX) or not any(d.needs_review for d in outcome.diagnostics):
        return outcome
    try:
        source = files.source_file(outcome.path, *files.read(outcome.path))
        text, diagnostics, added = markers.add_markers(outcome.path, source.text, outcome.diagnostics)
        if added:
            files.write_atomically(outcome.path, text, source.encoding, read_as=source)
    except (OSError, SyntaxError, UnicodeError, LookupError) as error:
        click.echo(f"{outcome.path}: no review markers added: {getattr(error, 'strerror', None) or error}", err=True)
        return outcome
    return replace(outcome, diagnostics=diagnostics)


def _without_rewrites(outcome: FileOutcome) -> FileOutcome:
    from dataclasses import replace

    kept = [diagnostic for diagnostic in outcome.diagnostics if not diagnostic.is_rewrite]
    return outcome if len(kept) == len(outcome.diagnostics) else replace(outcome, diagnostics=kept)


def _not_written(outcome: FileOutcome) -> FileOutcome:
    """A dry run's rewrites, said as what a run that writes would do (the rules say what they did)."""
    from dataclasses import replace

    if not any(diagnostic.is_rewrite for diagnostic in outcome.diagnostics):
        return outcome
    said = [replace(d, message=f"would be: {d.message}") if d.is_rewrite else d for d in outcome.diagnostics]
    return replace(outcome, diagnostics=said)


def _missing(path: str) -> FileOutcome:
    from mgpu_migrate.diagnostics import READ_ERROR, Diagnostic

    return FileOutcome(path, FAILED, [Diagnostic(path, 1, 1, READ_ERROR, "cannot read: no such file or directory")])


def summary(outcomes: list[FileOutcome], target: str, dry_run: bool) -> str:
    """The run's last line on stderr: how many files changed, stayed, failed, and the sites left for a person."""
    changed = sum(o.status == CHANGED for o in outcomes)
    unchanged = sum(o.status == UNCHANGED for o in outcomes)
    failed = sum(o.status == FAILED for o in outcomes)
    review = sum(d.needs_review for o in outcomes for d in o.diagnostics)

    def plural(count: int, word: str) -> str:
        return f"{count} {word}{'' if count == 1 else 's'}"

    verb = "would be migrated" if dry_run else "migrated"
    text = (
        f"mgpu-migrate: {plural(changed, 'file')} {verb} to {target}, {unchanged} unchanged, {failed} failed; "
        f"{plural(review, 'site')} left for a manual look"
    )
    if target == "ddp" and changed and not dry_run:
        text += "\nLaunch a migrated script with `torchrun --standalone --nproc_per_node=gpu SCRIPT.py`; "
        # MGP161 (TorchSetup): a --style torch set-up, which needs the launcher (no relaunch of its own).
        torch_style = any(d.code == "MGP161" for o in outcomes if o.status == CHANGED for d in o.diagnostics)
        text += "--style torch needs it." if torch_style else "plain `python SCRIPT.py` also uses every visible GPU."
    return text
