"""``mgpu-migrate verify SCRIPT.py --to ddp|balanced``: the proof that a migration trains as its original.

The original runs under the runtime's CPU emulation of ``nn.DataParallel`` on W devices, the migrated copy
at W processes (``torchrun``, gloo) or W CPU replicas (``MGPU_CPU_REPLICAS``), both in float64 for the same
optimizer steps; then the wrapped models' states and the printed lines are compared. torch runs only in the
subprocesses (``python -m mgpu_runtime.emulation`` and ``.compare``): this module never imports it.

``verify`` is a command only as the first argument, so a file or directory named ``verify`` is still
migrated when it is named otherwise (``./verify``) or after an option (``--to ddp verify``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import click

from mgpu_migrate.options import DDP, STYLES, TARGETS, TORCH_STYLE, Options

EXIT_VERIFIED, EXIT_APART, EXIT_ERROR = 0, 1, 2
ORIGINAL, MIGRATED = "original", "migrated"
# A number as printed: its fraction or exponent says it was rounded to its last digit.
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


@dataclass
class ScriptRun:
    """One of the two runs: where it works, what it runs, and what it left."""

    name: str
    directory: str
    command: list[str]
    environment: dict[str, str]
    process: subprocess.Popen | None = None
    status: int | None = None

    @property
    def state(self) -> str:
        return os.path.join(self.directory, ".mgpu-verify-state.pt")

    def output(self, stream: str) -> str:
        with open(os.path.join(self.directory, f".mgpu-verify.{stream}"), encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def start(self) -> None:
        with open(os.path.join(self.directory, ".mgpu-verify.stdout"), "wb") as stdout, open(
            os.path.join(self.directory, ".mgpu-verify.stderr"), "wb"
        ) as stderr:
            # A session of its own: a timeout ends the whole run, torchrun's workers included.
            self.process = subprocess.Popen(
                self.command, cwd=self.directory, env=self.environment, stdout=stdout, stderr=stderr, start_new_session=True
            )

    def wait(self, timeout: float) -> None:
        process = self.process
        assert process is not None, "wait() before start()"
        try:
            self.status = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            self.status = None


def _fail(message: str, output: str = "") -> None:
    click.echo(f"mgpu-migrate verify: {message}", err=True)
    if output:
        click.echo(output.rstrip("\n"), err=True)
    sys.exit(EXIT_ERROR)


def _migrate(script: str, target: str | None, style: str | None, sync_bn: bool | None, migrated: str | None) -> tuple[str, bytes, bytes]:
    """The target, the script's bytes, and the bytes of its migration: ``migrated``'s, else the tool's (in the
    script's encoding)."""
    from mgpu_migrate import files
    from mgpu_migrate.config import ConfigError, Resolver
    from mgpu_migrate.engine import migrate_source

    try:
        settings = Resolver().for_path(script)
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    target = target or settings.to
    if target is None:
        raise click.UsageError("choose a target with --to [balanced|ddp] (or set to = \"ddp\" under [tool.mgpu-migrate] in pyproject.toml)")
    style = settings.style if style is None else style
    if style == TORCH_STYLE and target != DDP:
        raise click.UsageError(f"--style torch is a style of --to ddp, not of --to {target}")
    options = Options(sync_bn=settings.sync_bn if sync_bn is None else sync_bn, style=style)
    try:
        data, _ = files.read(script)
        source = files.source_file(script, data)
        text = source.text
    except (OSError, SyntaxError, UnicodeDecodeError, LookupError) as error:
        _fail(f"cannot read {script}: {getattr(error, 'strerror', None) or error}")
    if migrated is not None:
        with open(migrated, "rb") as handle:
            return target, data, handle.read()
    result = migrate_source(text, target, script, options)
    for diagnostic in [*result.diagnostics, *([result.error] if result.error else [])]:
        click.echo(diagnostic.format(), err=True)
    if result.error is not None:
        sys.exit(EXIT_ERROR)
    if not result.changed:
        click.echo(f"{script}: the tool leaves it as it is (--to {target}): no migration to verify")
        sys.exit(EXIT_VERIFIED)
    return target, data, result.output.encode(source.encoding)


def _prepare(root: str, name: str, script: str, content: bytes, data_paths: tuple[str, ...]) -> str:
    """A run's directory: the script's copy (by its own name) and a link for each of ``data_paths``."""
    directory = os.path.join(root, name)
    os.makedirs(directory)
    with open(os.path.join(directory, os.path.basename(script)), "wb") as handle:
        handle.write(content)
    for path in data_paths:
        link = os.path.join(directory, path)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.abspath(path), link)
    return directory


def _environment(script: str, **overrides: str) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items() if key not in ("MGPU_CPU_REPLICAS", "MGPU_NPROC")}
    # The script's modules import from its own directory, after the copy's.
    paths = [os.path.dirname(os.path.abspath(script)), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    environment.update(
        CUDA_VISIBLE_DEVICES="",
        PYTHONHASHSEED=environment.get("PYTHONHASHSEED", "0"),
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(paths),
        **overrides,
    )
    return environment


def _runner(steps: int, state: str, script: str, script_args: tuple[str, ...], devices: int | None = None) -> list[str]:
    command = ["-m", "mgpu_runtime.emulation", "--float64", "--state", state]
    if devices is not None:
        command += ["--devices", str(devices)]
    if steps:
        command += ["--steps", str(steps)]
    return [*command, os.path.basename(script), *script_args]


def same_line(original: str, migrated: str) -> bool:
    """Equal, or apart only in numbers printed with a fraction or exponent by at most one unit of their last
    digit (a value within the bound can round either way); integers must be equal."""
    if original == migrated:
        return True
    if _NUMBER.split(original) != _NUMBER.split(migrated):
        return False
    for first, second in zip(_NUMBER.findall(original), _NUMBER.findall(migrated)):
        if first == second:
            continue
        units = [_last_digit_unit(number) for number in (first, second)]
        known = [unit for unit in units if unit is not None]
        if len(known) < len(units) or abs(float(first) - float(second)) > max(known) * (1 + 1e-9):
            return False
    return True


def _last_digit_unit(number: str) -> float | None:
    """What one unit of the last printed digit is worth; None for an integer."""
    mantissa, _, exponent = number.lower().partition("e")
    if "." not in mantissa and not exponent:
        return None
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def _first_difference(original: list[str], migrated: list[str]) -> int | None:
    for index in range(max(len(original), len(migrated))):
        if index >= len(original) or index >= len(migrated) or not same_line(original[index], migrated[index]):
            return index
    return None


def _count(count: int, word: str, words: str = "") -> str:
    return f"{count} {word if count == 1 else words or word + 's'}"


@click.command(name="verify", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT_ARGS...]")
@click.option("--to", "target", type=click.Choice(TARGETS), help="Migration target (or [tool.mgpu-migrate] to = ...).")
@click.option("--procs", type=click.IntRange(min=1), default=2, show_default=True, help="W: devices of the original, processes (ddp) or CPU replicas (balanced) of the migration.")
@click.option("--steps", type=click.IntRange(min=0), default=10, show_default=True, help="Optimizer steps each run makes before it is stopped; 0: run the script to its end.")
@click.option("--tolerance", type=click.FloatRange(min=0), default=1e-9, show_default=True, help="The largest absolute difference of any weight or buffer that still verifies.")
@click.option("--migrated", type=click.Path(exists=True, dir_okay=False), help="Verify this migration of SCRIPT (one edited by hand, say) instead of the tool's.")
@click.option("--data", "data_paths", multiple=True, metavar="PATH", help="A file or directory the script reads by this relative path: linked into each run's directory (repeatable).")
@click.option("--style", type=click.Choice(STYLES), default=None, help="With --to ddp: as mgpu-migrate --style.")
@click.option("--sync-bn/--no-sync-bn", default=None, help="With --to ddp: as mgpu-migrate --sync-bn.")
@click.option("--timeout", type=click.FloatRange(min=1), default=600, show_default=True, help="Seconds each run may take.")
@click.option("--keep", is_flag=True, help="Keep the runs' directories (their outputs, states and the migrated copy) and print where.")
def verify(script, script_args, target, procs, steps, tolerance, migrated, data_paths, style, sync_bn, timeout, keep):
    """Check that the migration of SCRIPT trains as the original does.

    Migrates a copy of SCRIPT, runs the original under nn.DataParallel emulated on W CPU devices and the
    migrated copy at W processes (--to ddp: torchrun, gloo) or W CPU replicas (--to balanced), both in
    float64 on the CPU for the same optimizer steps, and compares the wrapped models' final weights and
    buffers and the lines each printed (the migrated job prints its main process's). Numbers printed with a
    fraction may differ by one unit of their last digit.

    Each run works in a new temporary directory, its current directory, which holds its copy of SCRIPT and
    receives whatever the script writes there: neither run writes into your files by a relative path or
    beside the script. Files the script reads by relative paths are linked in with --data (a write into a
    link reaches your file). Modules beside SCRIPT are imported from its directory; only SCRIPT is
    migrated. Arguments after -- go to the script.

    Exit codes: 0 within the tolerance (or nothing to migrate); 1 past it, or the runs differ in models,
    steps or printed lines; 2 a usage error, or a run that failed (its output is shown).
    """
    if script.endswith(".ipynb"):
        raise click.UsageError("verify runs scripts; a notebook's cells cannot be run as one")
    for path in data_paths:
        if os.path.isabs(path) or ".." in path.split(os.sep) or not os.path.lexists(path):
            raise click.BadParameter(f"{path!r}: give an existing path inside the current directory, as the script opens it", param_hint="--data")
    for module in ("torch", "mgpu_runtime"):
        if importlib.util.find_spec(module) is None:
            _fail(f"verify runs {module}, which this Python ({sys.executable}) cannot import: pip install 'mgpu-migrate[runtime]'")
    target, original, migration = _migrate(script, target, style, sync_bn, migrated)

    root = tempfile.mkdtemp(prefix="mgpu-verify-")
    try:
        runs = _start(root, script, script_args, target, procs, steps, original, migration, data_paths)
        for run in runs:
            run.wait(timeout)
        for run in runs:
            if run.status != 0:
                how = f"did not finish in {timeout:g} s" if run.status is None else f"failed (exit {run.status})"
                _fail(f"the {run.name} run {how}: {' '.join(run.command)}", run.output("stdout") + run.output("stderr"))
        status = _report(runs, tolerance, target, procs)
    finally:
        if keep:
            click.echo(f"the runs' directories: {root}", err=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
    sys.exit(status)


def _start(root, script, script_args, target, procs, steps, original, migrated, data_paths) -> list[ScriptRun]:
    """Both runs started, side by side."""
    original_directory = _prepare(root, ORIGINAL, script, original, data_paths)
    migrated_directory = _prepare(root, MIGRATED, script, migrated, data_paths)
    python = sys.executable
    reference = ScriptRun(ORIGINAL, original_directory, [], _environment(script))
    reference.command = [python, *_runner(steps, reference.state, script, script_args, devices=procs)]
    if target == DDP:
        migration = ScriptRun(MIGRATED, migrated_directory, [], _environment(script))
        launcher = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"]
        migration.command = [*launcher, *_runner(steps, migration.state, script, script_args)]
    else:
        migration = ScriptRun(MIGRATED, migrated_directory, [], _environment(script, MGPU_CPU_REPLICAS=str(procs)))
        migration.command = [python, *_runner(steps, migration.state, script, script_args)]
    runs = [reference, migration]
    for run in runs:
        run.start()
    return runs


def _report(runs: list[ScriptRun], tolerance: float, target: str, procs: int) -> int:
    reference, migration = runs
    comparison = subprocess.run(
        [sys.executable, "-m", "mgpu_runtime.emulation.compare", reference.state, migration.state],
        capture_output=True,
        text=True,
        env=reference.environment,
    )
    if comparison.returncode != 0:
        _fail("the runs' states could not be compared", comparison.stdout + comparison.stderr)
    found = json.loads(comparison.stdout)
    lines = {run.name: run.output("stdout").splitlines() for run in runs}
    steps = dict(zip((ORIGINAL, MIGRATED), found["steps"]))
    way = f"{_count(procs, 'process', 'processes')} (torchrun, gloo)" if target == DDP else f"{_count(procs, 'CPU replica')}"
    click.echo(f"original: nn.DataParallel emulated on {_count(procs, 'device')}: {_count(steps[ORIGINAL], 'optimizer step')}, {_count(len(lines[ORIGINAL]), 'line')} printed")
    click.echo(f"migrated: --to {target} at {way}: {_count(steps[MIGRATED], 'optimizer step')}, {_count(len(lines[MIGRATED]), 'line')} printed")

    problems = list(found["mismatches"])
    if steps[ORIGINAL] != steps[MIGRATED]:
        problems.append(f"the runs made different numbers of optimizer steps ({steps[ORIGINAL]} and {steps[MIGRATED]})")
    largest = found["largest"]
    if largest is None:
        click.echo("largest difference: none measured (no wrapped model's tensor is in both runs)")
    else:
        where = f"model {largest['model']} {largest['name']!r}"
        click.echo(f"largest difference: {largest['difference']:.3g} in {where} (tolerance {tolerance:g})")
        if largest["difference"] > tolerance:
            problems.append(f"{where} is {largest['difference']:.3g} apart, past the tolerance {tolerance:g}")
    line = _first_difference(lines[ORIGINAL], lines[MIGRATED])
    if line is None:
        click.echo("printed lines: the same")
    else:
        shown = {name: repr(printed[line]) if line < len(printed) else "(no such line)" for name, printed in lines.items()}
        problems.append(f"printed line {line + 1} differs: original {shown[ORIGINAL]}, migrated {shown[MIGRATED]}")
    for problem in problems:
        click.echo(f"differs: {problem}")
    if problems:
        click.echo(f"not verified: the migration trains differently from the original on {_count(procs, 'device')}")
        return EXIT_APART
    click.echo(f"verified: the migration trains as the original on {_count(procs, 'device')}, within {tolerance:g}")
    return EXIT_VERIFIED


class CommandWithVerify(click.Command):
    """The migration command, which hands its arguments to ``verify`` when that is the first of them."""

    def main(self, args=None, prog_name=None, **extra):
        arguments = list(sys.argv[1:] if args is None else args)
        if arguments[:1] == ["verify"]:
            return verify.main(arguments[1:], prog_name=f"{prog_name or 'mgpu-migrate'} verify", **extra)
        return super().main(arguments, prog_name, **extra)
