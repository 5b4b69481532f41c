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
import time
from dataclasses import dataclass

import click

from mgpu_migrate.options import DDP, STYLES, TARGETS, TORCH_STYLE, Options

EXIT_VERIFIED, EXIT_APART, EXIT_ERROR = 0, 1, 2
ORIGINAL, MIGRATED = "original", "migrated"
CPU_REPLICAS = "MGPU_CPU_REPLICAS"
NPROC = "MGPU_NPROC"
DRIVER = "driver.py"  # the jobs' driver, in the runs' root
# A number as printed: its fraction or exponent says it was rounded to its last digit.
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


@dataclass
class ScriptRun:
    """One of a script's two runs: where it works, what it runs, and what it left (a file each, written by the
    job's driver: rank 0's, another rank's beside it with ``.rankN``)."""

    name: str
    directory: str
    script: str
    home: str
    args: tuple[str, ...]
    steps: int
    devices: int | None = None
    launcher: tuple[str, ...] = ()  # what launches it alone: python, torchrun, python with CPU replicas
    timed_out: bool = False
    ended_job: int | None = None  # the exit status of a job that ended while this run was being made (or before)
    job_output: str = ""  # that job's own output (torchrun's)

    @property
    def state(self) -> str:
        return os.path.join(self.directory, ".mgpu-verify-state.pt")

    @property
    def command(self) -> list[str]:
        """The command that makes this run alone, in its directory (what a person would run to see it again)."""
        return [*self.launcher, *_runner(self.steps, self.state, self.script, self.args, self.devices)]

    def _files(self, kind: str) -> list[str]:
        """This run's files of one kind, rank 0's first."""
        names = sorted(name for name in os.listdir(self.directory) if name.startswith(f".mgpu-verify.{kind}.rank"))
        found = [f".mgpu-verify.{kind}", *names]
        return [os.path.join(self.directory, name) for name in found if os.path.exists(os.path.join(self.directory, name))]

    @property
    def started(self) -> float | None:
        """When the job began this run (None: not yet)."""
        files = self._files("started")
        return os.path.getmtime(files[0]) if files else None

    @property
    def status(self) -> int | None:
        """Its exit status: a rank's failure, else rank 0's 0; None while it has none (not made, or the job
        ended in it)."""
        statuses = []
        for path in self._files("status"):
            with open(path, encoding="utf-8") as handle:
                statuses.append(int(handle.read()))
        failed = [status for status in statuses if status]
        return failed[0] if failed else (statuses[0] if statuses else self.ended_job)

    def output(self, stream: str) -> str:
        """Rank 0's ``stream``; of ``stderr``, every rank's."""
        files = self._files(stream)[: None if stream == "stderr" else 1]
        texts = []
        for path in files:
            with open(path, encoding="utf-8", errors="replace") as handle:
                texts.append(handle.read())
        return "".join(texts)

    def plan(self) -> dict:
        return {"directory": self.directory, "script": self.script, "home": self.home, "args": list(self.args),
                "devices": self.devices, "steps": self.steps or None, "state": self.state}


# Makes the runs of a plan (a JSON list, argv[1]) one after the other, each as `python -m mgpu_runtime.emulation`
# makes one alone (runner.run), in its directory, with the user's script's directory first on sys.path after
# the copy's; what it prints goes to the directory's files, then its exit status as python gives it (a
# SystemExit's code, its message printed, or 1 with the traceback). The modules it imported from those two
# directories go after it (another script may have modules of the same names). In a job of several processes
# a failure ends the job: the other ranks may wait in a collective of the failed script; verify starts the
# runs it did not reach in a new job.
_DRIVER = """
import contextlib, gc, json, os, sys, traceback
from mgpu_runtime.emulation import runner

gc.freeze()  # torch's objects: out of the collection after each run, which would walk them all (0.14 s a run)
rank = os.environ.get("RANK", "0")
suffix = "" if rank == "0" else f".rank{rank}"
with open(sys.argv[1], encoding="utf-8") as plan:
    runs = json.load(plan)
for run in runs:
    os.chdir(run["directory"])
    open(".mgpu-verify.started" + suffix, "w").close()
    before = set(sys.modules)
    sys.path.insert(1, run["home"])
    status = 0
    with open(".mgpu-verify.stdout" + suffix, "w") as out, open(".mgpu-verify.stderr" + suffix, "w") as err:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runner.run(run["script"], run["args"], run["devices"], True, run["steps"], run["state"])
            except SystemExit as exit:
                if exit.code is None or isinstance(exit.code, int):
                    status = exit.code or 0
                else:
                    print(exit.code, file=sys.stderr)
                    status = 1
            except BaseException:
                traceback.print_exc()
                status = 1
    sys.path.remove(run["home"])
    own = tuple(os.path.join(place, "") for place in (run["home"], run["directory"]))
    for name in set(sys.modules) - before:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(own):
            del sys.modules[name]
    gc.collect()
    gc.freeze()
    with open(".mgpu-verify.status.partial" + suffix, "w") as written:
        written.write(str(status))
    os.replace(".mgpu-verify.status.partial" + suffix, ".mgpu-verify.status" + suffix)  # read while the job runs
    if status and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.exit(status)
"""


@dataclass
class Job:
    """A process (or a torchrun job) that makes its runs one after the other with the driver, so torch is
    imported, and a process group set up, once for them all."""

    name: str
    launcher: list[str]
    runs: list[ScriptRun]
    environment: dict[str, str]
    root: str
    process: subprocess.Popen | None = None
    attempts: int = 0
    planned: int = 0

    def _waiting(self) -> list[ScriptRun]:
        return [run for run in self.runs if run.started is None]

    def start(self) -> None:
        """Start the job on the runs not yet begun."""
        self.attempts += 1
        self.planned = len(self._waiting())
        plan = os.path.join(self.root, f"{self.name}-{self.attempts}.json")
        with open(plan, "w", encoding="utf-8") as handle:
            json.dump([run.plan() for run in self._waiting()], handle)
        with open(os.path.join(self.root, f"{self.name}-{self.attempts}.log"), "wb") as log:
            # A session of its own: a timeout ends the whole job, torchrun's workers included.
            self.process = subprocess.Popen(
                [*self.launcher, os.path.join(self.root, DRIVER), plan],
                cwd=self.root, env=self.environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def log(self) -> str:
        with open(os.path.join(self.root, f"{self.name}-{self.attempts}.log"), encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def stop(self) -> None:
        """End the job if it still runs (verify was interrupted, or ended early)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def check(self, timeout: float) -> bool:
        """Whether the job still works, after ending a run past ``timeout`` seconds, and starting the job again
        on the runs it did not reach when it ended in one (each start ends at least one run, or all)."""
        process = self.process
        assert process is not None, "check() before start()"
        begun = [run for run in self.runs if run.started is not None and run.status is None]
        if process.poll() is None:
            if begun and time.time() - max(run.started or 0 for run in begun) > timeout:
                begun[-1].timed_out = True
                self.stop()
            else:
                return True
        waiting = self._waiting()
        made_none = len(waiting) == self.planned
        for run in [*begun, *(waiting if made_none else [])]:
            run.ended_job, run.job_output = process.returncode, self.log()
        if waiting and not made_none:
            self.start()
            return True
        return False


@dataclass
class Migration:
    """A script to verify: its original and migrated bytes, how it was migrated, and the arguments of its
    migrated run (its own distributed path's may differ: MGP231)."""

    script: str
    target: str
    style: str
    original: bytes
    migrated: bytes
    migrated_args: tuple[str, ...]
    own_process_group: bool = False
    # A file whose plain start runs its own distributed path (MGP139): launched as `python SCRIPT` with
    # MGPU_NPROC=W, as its user starts it, not under torchrun.
    plain_launch: bool = False


def _fail(message: str, output: str = "") -> None:
    click.echo(f"mgpu-migrate verify: {message}", err=True)
    if output:
        click.echo(output.rstrip("\n"), err=True)
    sys.exit(EXIT_ERROR)


def _migrate(script: str, options: VerifyOptions) -> Migration | None:
    """The script's migration (``--migrated``'s bytes, else the tool's, in the script's encoding); None when the
    tool leaves the script as it is."""
    from mgpu_migrate import files
    from mgpu_migrate.config import ConfigError, Resolver
    from mgpu_migrate.engine import migrate_source

    try:
        settings = Resolver().for_path(script)
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    target = options.target or settings.to
    if target is None:
        raise click.UsageError("choose a target with --to [balanced|ddp] (or set to = \"ddp\" under [tool.mgpu-migrate] in pyproject.toml)")
    style = settings.style if options.style is None else options.style
    if style == TORCH_STYLE and target != DDP:
        raise click.UsageError(f"--style torch is a style of --to ddp, not of --to {target}")
    sync_bn = settings.sync_bn if options.sync_bn is None else options.sync_bn
    try:
        data, _ = files.read(script)
        source = files.source_file(script, data)
        text = source.text
    except (OSError, SyntaxError, UnicodeDecodeError, LookupError) as error:
        _fail(f"cannot read {script}: {getattr(error, 'strerror', None) or error}")
    if options.migrated is not None:
        with open(options.migrated, "rb") as handle:
            return Migration(script, target, style, data, handle.read(), options.script_args, style == TORCH_STYLE)
    result = migrate_source(text, target, script, Options(sync_bn=sync_bn, style=style))
    for diagnostic in [*result.diagnostics, *([result.error] if result.error else [])]:
        click.echo(diagnostic.format(), err=True)
    if result.error is not None:
        sys.exit(EXIT_ERROR)
    if not result.changed:
        click.echo(f"{script}: the tool leaves it as it is (--to {target}): no migration to verify")
        return None
    own_path = next((d.message for d in result.diagnostics if d.code == _own_path_code()), None)
    arguments = options.script_args if own_path is None else _own_path_arguments(script, own_path, options)
    migrated = result.output.encode(source.encoding)
    plain = any(d.code == _own_path_launch_code() for d in result.diagnostics)
    return Migration(script, target, style, data, migrated, arguments, own_path is not None or style == TORCH_STYLE, plain)


def _own_path_code() -> str:
    # The rules (and libcst) load only when a script is verified: the CLI imports this module for every run.
    from mgpu_migrate.rules.entry_point import EXISTING_DISTRIBUTED_SETUP

    return EXISTING_DISTRIBUTED_SETUP.code


def _own_path_launch_code() -> str:
    from mgpu_migrate.rules.own_path_launch import OwnPathLaunch

    return OwnPathLaunch.CODE.code


def _own_path_arguments(script: str, message: str, options: VerifyOptions) -> tuple[str, ...]:
    """The arguments of a file's own distributed path, launched as its MGP231 message says: the option of the
    per-process batch at the original's batch (given after ``--``) over the processes."""
    code = _own_path_code()
    command = message.split("`")[-2].split() if message.count("`") >= 2 else []  # the last quoted: the command
    if command[-1:] != ["B/N"]:
        _fail(f"{script}: the tool leaves its training to the file's own distributed path ({code}), launched by a command of your own: no migration verify can launch")
    option, arguments = command[-2], list(options.script_args)
    given = [index for index, argument in enumerate(arguments) if argument == option or argument.startswith(f"{option}=")]
    if not given:
        raise click.UsageError(f"{script} trains on its own distributed path ({code}), launched with `{option} B/N`: give the original's batch B after --, as in: -- {option} B")
    at = given[-1]
    inline = arguments[at].startswith(f"{option}=")
    value = arguments[at].partition("=")[2] if inline else (arguments[at + 1] if at + 1 < len(arguments) else "")
    if not value.isdigit() or int(value) % options.procs:
        raise click.UsageError(f"{option} {value}: the original's batch must split evenly over the {options.procs} processes ({code})")
    per_process = str(int(value) // options.procs)
    if inline:
        arguments[at] = f"{option}={per_process}"
    else:
        arguments[at + 1] = per_process
    return tuple(arguments)


def _prepare(root: str, name: str, script: str, content: bytes, data_paths: tuple[str, ...]) -> str:
    """A run's directory: the script's copy (by its own name) and a link for each of ``data_paths``."""
    directory = os.path.join(root, name)
    os.makedirs(directory)
    with open(os.path.join(directory, os.path.basename(script)), "wb") as handle:
        handle.write(content)
    for path in dict.fromkeys(data_paths):
        link = os.path.join(directory, path)
        if os.path.lexists(link):
            continue  # the script itself (its copy is there), or a path inside a directory already linked
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.abspath(path), link)
    return directory


def _environment(homes: list[str], **overrides: str) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items() if key not in (CPU_REPLICAS, NPROC)}
    # The scripts' modules import from their own directories (the driver puts each run's first).
    paths = [*dict.fromkeys(homes), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
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


def same_line(original: str, migrated: str, tolerance: float = 0.0) -> bool:
    """Equal, or apart only in numbers printed with a fraction or exponent by at most one unit of their last
    digit (a value within the bound can round either way), or by at most ``tolerance`` relative to the larger
    (a full-precision ``repr`` of a float, whose last digits follow the order of a sum); integers must be
    equal."""
    if original == migrated:
        return True
    if _NUMBER.split(original) != _NUMBER.split(migrated):
        return False
    for first, second in zip(_NUMBER.findall(original), _NUMBER.findall(migrated)):
        if first == second:
            continue
        units = [_last_digit_unit(number) for number in (first, second)]
        known = [unit for unit in units if unit is not None]
        if len(known) < len(units):
            return False
        a, b = float(first), float(second)
        if abs(a - b) > max(max(known) * (1 + 1e-9), tolerance * max(abs(a), abs(b))):
            return False
    return True


def _last_digit_unit(number: str) -> float | None:
    """What one unit of the last printed digit is worth; None for an integer."""
    mantissa, _, exponent = number.lower().partition("e")
    if "." not in mantissa and not exponent:
        return None
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def _first_difference(original: list[str], migrated: list[str], tolerance: float) -> int | None:
    for index in range(max(len(original), len(migrated))):
        if index >= len(original) or index >= len(migrated) or not same_line(original[index], migrated[index], tolerance):
            return index
    return None


def _count(count: int, word: str, words: str = "") -> str:
    return f"{count} {word if count == 1 else words or word + 's'}"


@dataclass(frozen=True)
class VerifyOptions:
    """What the command line asked, for every script."""

    target: str | None
    style: str | None
    sync_bn: bool | None
    migrated: str | None
    script_args: tuple[str, ...]
    procs: int
    steps: int
    data_paths: tuple[str, ...]


class _VerifyCommand(click.Command):
    """``verify``, whose arguments after ``--`` go to the scripts, whatever they look like (click would take
    them for more scripts)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            args, ctx.meta[_SCRIPT_ARGS] = args[:at], tuple(args[at + 1 :])
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "[-- SCRIPT_ARGS...]"]


_SCRIPT_ARGS = "mgpu_migrate.verify.script_args"


@click.command(name="verify", cls=_VerifyCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("scripts", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False), metavar="SCRIPT...")
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
def verify(scripts, target, procs, steps, tolerance, migrated, data_paths, style, sync_bn, timeout, keep):
    """Check that the migration of each SCRIPT trains as the original does.

    Migrates a copy of SCRIPT, runs the original under nn.DataParallel emulated on W CPU devices and the
    migrated copy at W processes (--to ddp: torchrun, gloo) or W CPU replicas (--to balanced), both in
    float64 on the CPU for the same optimizer steps, and compares the wrapped models' final weights and
    buffers (and the parameters the optimizers trained outside them) and the lines each printed (the
    migrated job prints its main process's). Numbers printed with a fraction may differ by one unit of
    their last digit, or by the tolerance relative to their size.

    Each run works in a new temporary directory, its current directory, which holds its copy of SCRIPT and
    receives whatever the script writes there: neither run writes into your files by a relative path or
    beside the script. Files the script reads by relative paths are linked in with --data (a write into a
    link reaches your file). Modules beside SCRIPT are imported from its directory; only SCRIPT is
    migrated. Arguments after -- go to the script (to each SCRIPT).

    Several scripts are verified together, each as it runs alone: the originals one after the other in one
    process, and so do the migrations (in one torchrun job, or one process of replicas), so torch starts once.

    Exit codes: 0 within the tolerance (or nothing to migrate); 1 past it, or the runs differ in models,
    steps or printed lines; 2 a usage error, or a run that failed (its output is shown). Of several
    scripts, the highest of theirs.
    """
    if any(script.endswith(".ipynb") for script in scripts):
        raise click.UsageError("verify runs scripts; a notebook's cells cannot be run as one")
    if migrated is not None and len(scripts) > 1:
        raise click.UsageError("--migrated is the migration of one SCRIPT: give that one alone")
    for path in data_paths:
        if os.path.isabs(path) or ".." in path.split(os.sep) or not os.path.lexists(path):
            raise click.BadParameter(f"{path!r}: give an existing path inside the current directory, as the script opens it", param_hint="--data")
    for module in ("torch", "mgpu_runtime"):
        if importlib.util.find_spec(module) is None:
            _fail(f"verify runs {module}, which this Python ({sys.executable}) cannot import: pip install 'mgpu-migrate[runtime]'")
    script_args = click.get_current_context().meta.get(_SCRIPT_ARGS, ())
    options = VerifyOptions(target, style, sync_bn, migrated, script_args, procs, steps, data_paths)
    found = {script: _migrate(script, options) for script in scripts}
    migrations = [migration for migration in found.values() if migration is not None]
    statuses: list[int] = []
    jobs: list[Job] = []
    root = tempfile.mkdtemp(prefix="mgpu-verify-")
    try:
        pairs, jobs = _start(root, migrations, options)
        while [job for job in jobs if job.check(timeout)]:
            time.sleep(0.1)
        several = len(scripts) > 1
        failures = [_failed(runs, timeout) for runs in pairs]
        if not several and failures and failures[0] is not None:
            _fail(*failures[0])
        compared = iter(_compare([runs for runs, failure in zip(pairs, failures) if failure is None]))
        for index, (migration, runs, failure) in enumerate(zip(migrations, pairs, failures)):
            if several:
                click.echo(f"{chr(10) if index else ''}{migration.script}:")
            if failure is None:
                statuses.append(_report(runs, next(compared), tolerance, migration.target, procs, migration.plain_launch))
                continue
            message, output = failure
            click.echo(f"mgpu-migrate verify: {migration.script}: {message}", err=True)
            click.echo(output.rstrip("\n"), err=True)
            click.echo(f"error: {message.partition(':')[0]}")
            statuses.append(EXIT_ERROR)
        if several:
            verified = statuses.count(EXIT_VERIFIED)
            left = len(scripts) - len(migrations)
            click.echo(f"\n{verified} of {_count(len(migrations), 'migration')} verified, {_count(left, 'script')} left by the tool")
    finally:
        for job in jobs:
            job.stop()
        if keep:
            click.echo(f"the runs' directories: {root}", err=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
    sys.exit(max(statuses, default=EXIT_VERIFIED))


def _start(root: str, migrations: list[Migration], options: VerifyOptions) -> tuple[list[list[ScriptRun]], list[Job]]:
    """Every run, started: the originals in one process, the migrations in one job per target, and a torchrun
    job of its own for each migration that sets up its process group itself (--style torch, its own path)."""
    with open(os.path.join(root, DRIVER), "w", encoding="utf-8") as handle:
        handle.write(_DRIVER)
    python = (sys.executable,)
    torchrun = (*python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={options.procs}")
    replicas = (f"{CPU_REPLICAS}={options.procs}", *python)
    plain = (f"{NPROC}={options.procs}", *python)
    pairs = []
    for index, migration in enumerate(migrations):
        # Each script's runs have directories of their own (two scripts may have one name).
        place = os.path.join(root, str(index)) if len(migrations) > 1 else root
        script, home = os.path.basename(migration.script), os.path.dirname(os.path.abspath(migration.script))
        original = _prepare(place, ORIGINAL, migration.script, migration.original, options.data_paths)
        migrated = _prepare(place, MIGRATED, migration.script, migration.migrated, options.data_paths)
        launcher = plain if migration.plain_launch else torchrun if migration.target == DDP else replicas
        pairs.append(
            [
                ScriptRun(ORIGINAL, original, script, home, options.script_args, options.steps, options.procs, python),
                ScriptRun(MIGRATED, migrated, script, home, migration.migrated_args, options.steps, None, launcher),
            ]
        )
    homes = [os.path.dirname(os.path.abspath(migration.script)) for migration in migrations]
    ddp = [(migration, runs[1]) for migration, runs in zip(migrations, pairs) if migration.target == DDP and not migration.plain_launch]
    # A plain start of its own: the runtime relaunches the driver under torchrun, on the file's own path.
    started = [[runs[1]] for migration, runs in zip(migrations, pairs) if migration.plain_launch]
    shared = [run for migration, run in ddp if not migration.own_process_group]
    alone = [[run] for migration, run in ddp if migration.own_process_group]
    balanced = [runs[1] for migration, runs in zip(migrations, pairs) if migration.target != DDP]
    jobs = [Job("originals", [*python], [runs[0] for runs in pairs], _environment(homes), root)] if pairs else []
    jobs += [Job(f"torchrun-{index}", [*torchrun], runs, _environment(homes), root) for index, runs in enumerate([shared, *alone]) if runs]
    nproc = {NPROC: str(options.procs)}
    jobs += [Job(f"plain-{index}", [*python], runs, _environment(homes, **nproc), root) for index, runs in enumerate(started)]
    if balanced:
        jobs.append(Job("balanced", [*python], balanced, _environment(homes, **{CPU_REPLICAS: str(options.procs)}), root))
    for job in jobs:
        job.start()
    return pairs, jobs


def _failed(runs: list[ScriptRun], timeout: float) -> tuple[str, str] | None:
    """What went wrong with a script's runs, and the failed run's output; None when both ended well."""
    for run in runs:
        if run.status == 0:
            continue
        how = f"did not finish in {timeout:g} s" if run.timed_out else f"failed (exit {run.status})"
        where = f" under nn.DataParallel emulated on {_count(run.devices, 'device')}" if run.devices else ""
        message = f"the {run.name} run {how}{where}: {' '.join(run.command)}"
        return message, run.output("stdout") + run.output("stderr") + run.job_output
    return None


# Compares the states of each pair of runs (a JSON list, argv[1]) in one process: a JSON document a line.
_COMPARE = """
import json, sys, torch
from mgpu_runtime.emulation.compare import compare

for original, migrated in json.loads(sys.argv[1]):
    states = [torch.load(path, map_location="cpu", weights_only=True) for path in (original, migrated)]
    print(json.dumps(compare(*states)))
"""


def _compare(pairs: list[list[ScriptRun]]) -> list[dict]:
    if not pairs:
        return []
    comparison = subprocess.run(
        [sys.executable, "-c", _COMPARE, json.dumps([[original.state, migrated.state] for original, migrated in pairs])],
        capture_output=True,
        text=True,
        env=_environment([]),
    )
    if comparison.returncode != 0:
        _fail("the runs' states could not be compared", comparison.stdout + comparison.stderr)
    return [json.loads(line) for line in comparison.stdout.splitlines()]


def _report(runs: list[ScriptRun], found: dict, tolerance: float, target: str, procs: int, plain: bool = False) -> int:
    lines = {run.name: run.output("stdout").splitlines() for run in runs}
    steps = dict(zip((ORIGINAL, MIGRATED), found["steps"]))
    way = f"{_count(procs, 'process', 'processes')} (torchrun, gloo)" if target == DDP else f"{_count(procs, 'CPU replica')}"
    if plain:
        # MGP139: started plainly, the file relaunched itself on its own path, or said why it ran its DataParallel branch.
        fallback = [line for line in runs[1].output("stderr").splitlines() if line.startswith("mgpu_runtime: ") and "DataParallel branch" in line]
        if fallback:
            # Its DataParallel branch is the original's, on the GPUs of one process: none here, so nothing to compare.
            why = fallback[0].removeprefix("mgpu_runtime: ").partition(":")[0]
            click.echo(f"not verified: {why}, so the migration ran its DataParallel branch (the original's) in one process; give a batch the {procs} processes divide after --")
            return EXIT_ERROR
        way = f"{_count(procs, 'process', 'processes')} (a plain start, relaunched under torchrun on its own distributed path, gloo)"
    click.echo(f"original: nn.DataParallel emulated on {_count(procs, 'device')}: {_count(steps[ORIGINAL], 'optimizer step')}, {_count(len(lines[ORIGINAL]), 'line')} printed")
    click.echo(f"migrated: --to {target} at {way}: {_count(steps[MIGRATED], 'optimizer step')}, {_count(len(lines[MIGRATED]), 'line')} printed")

    problems = list(found["mismatches"])
    if steps[ORIGINAL] != steps[MIGRATED]:
        problems.append(f"the runs made different numbers of optimizer steps ({steps[ORIGINAL]} and {steps[MIGRATED]})")
    largest = found["largest"]
    if largest is None:
        click.echo("largest difference: none measured (no wrapped model's tensor is in both runs)")
    else:
        model = largest["model"]
        where = f"model {model} {largest['name']!r}" if model is not None else f"{largest['name']} (trained outside the wrapped models)"
        click.echo(f"largest difference: {largest['difference']:.3g} in {where} (tolerance {tolerance:g})")
        if largest["difference"] > tolerance:
            problems.append(f"{where} is {largest['difference']:.3g} apart, past the tolerance {tolerance:g}")
    line = _first_difference(lines[ORIGINAL], lines[MIGRATED], tolerance)
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
