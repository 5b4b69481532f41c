"""Relaunching a plainly started script under torchrun, so ``python train.py`` uses every GPU as before.

The DataParallel original used all visible GPUs from one process. Its migration needs one process per GPU,
so when a script is started without a launcher and more than one process is wanted, ``setup()`` replaces
the process (``exec``) with ``torchrun --standalone --nproc_per_node=N`` running the same command line.
Exec rather than a child process: the exit status, signals (Ctrl-C, SLURM's SIGTERM) and the process id
are torchrun's own, with nothing in between to forward them or to outlive them. torchrun runs through
``agent.py``, which ends a failed job with the failing rank's exception and line, and a Ctrl-C with one line.

How many processes: ``MGPU_NPROC=N`` if set (also on CPU; 1 keeps one process), else the number of visible
CUDA devices. N is at most four processes per core (more GPUs than that are never visible to one
machine; a larger N is a typo that would have torchrun start thousands of processes). The relaunched command carries ``MGPU_RELAUNCHED=1``, and a process that carries it yet finds
no launcher variables stops with an error instead of relaunching again.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping, Sequence

import torch

from mgpu_runtime.distributed.environment import LaunchEnvironmentError

NPROC_VARIABLE = "MGPU_NPROC"
_PROCESSES_PER_CORE = 4
RELAUNCHED_VARIABLE = "MGPU_RELAUNCHED"
# Set by ``leave_to_own_path()`` (own_path.py) in a process about to start the script's own distributed path, and
# so inherited by the processes it starts: there the runtime stands aside (``own_path_runs``).
OWN_PATH_VARIABLE = "MGPU_OWN_PATH_RUNS"


def own_path_runs(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs the script's own distributed path, started by the script itself (see
    ``own_path.leave_to_own_path``): ``setup()`` then joins no job and relaunches nothing."""
    return bool((os.environ if environ is None else environ).get(OWN_PATH_VARIABLE))


def requested_process_count(environ: Mapping[str, str], chosen: Sequence[int] | None = None) -> int:
    """Processes wanted for a plainly started script: ``MGPU_NPROC``, else one per GPU the script chose
    (``setup(devices=...)``), else one per visible CUDA device."""
    text = environ.get(NPROC_VARIABLE, "").strip()
    if not text:
        # device_count() asks the driver without creating a context, so the device is still unchosen. Only real
        # GPUs count: devices emulated on the CPU (MGPU_CPU_REPLICAS, a test's) are no reason to relaunch.
        if not torch.cuda.is_available():
            return 1
        return len(chosen) if chosen else max(1, torch.cuda.device_count())
    if not text.isdigit() or int(text) < 1:
        raise LaunchEnvironmentError(f"{NPROC_VARIABLE}={text!r} must be a whole number of processes, 1 or more")
    wanted = int(text)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if wanted > _PROCESSES_PER_CORE * cores:
        raise LaunchEnvironmentError(
            f"{NPROC_VARIABLE}={wanted} is more processes than this machine can run "
            f"({cores} cores: at most {_PROCESSES_PER_CORE * cores}); lower it"
        )
    return wanted


def torchrun_command(process_count: int, interpreter: str, original_argv: Sequence[str]) -> list[str]:
    """The command that reruns ``original_argv`` (``sys.orig_argv``) as ``process_count`` torchrun workers.

    ``--no-python`` with the interpreter's own flags kept (``-m module``, ``-c code``, ``-X``, ``-W`` ...) runs
    exactly the original command line in each worker; ``-u`` is what torchrun adds for Python scripts.
    """
    return [
        interpreter,
        "-m",
        "mgpu_runtime.distributed.agent",  # torchrun, ending a failed or interrupted job with one line
        "--standalone",
        f"--nproc_per_node={process_count}",
        "--no-python",
        interpreter,
        "-u",
        *original_argv[1:],
    ]


def relaunch_notice(process_count: int, environ: Mapping[str, str], chosen: Sequence[int] | None = None) -> str:
    """The one line said before relaunching: how many processes, on which devices, and how to choose."""
    if torch.cuda.is_available() and chosen:
        devices = "GPUs " + ",".join(map(str, chosen)) + f" of the {torch.cuda.device_count()} visible"
    elif torch.cuda.is_available():
        visible = environ.get("CUDA_VISIBLE_DEVICES")
        devices = f"GPUs {visible}" if visible else f"GPUs 0-{torch.cuda.device_count() - 1}"
        devices += f" ({torch.cuda.device_count()} visible)" if process_count != torch.cuda.device_count() else ""
    else:
        devices = "the CPU (gloo)"
    how = (
        f"{NPROC_VARIABLE}={process_count}"
        if environ.get(NPROC_VARIABLE)
        else "one per GPU the script chose" if chosen else "one per visible GPU"
    )
    return (
        f"mgpu_runtime: relaunching under torchrun as {process_count} processes on {devices} ({how}); "
        f"{NPROC_VARIABLE}=N chooses N, {NPROC_VARIABLE}=1 keeps one process, MGPU_LOG=all|prefix shows every rank's output"
    )


def relaunch_wanted(environ: Mapping[str, str]) -> bool:
    """Whether ``setup()`` in a plainly started process would not return as this process: it would relaunch it
    under torchrun (more than one process wanted, a command line to rerun), or stop it (``MGPU_RELAUNCHED`` set
    with no launcher variables). The GPUs a later ``setup(devices=...)`` would choose are not known here."""
    if own_path_runs(environ) or requested_process_count(environ) == 1:
        return False
    return bool(environ.get(RELAUNCHED_VARIABLE)) or can_rerun_command_line()


def relaunch_if_requested(
    chosen: Sequence[int] | None = None, detail: str = "", arguments: Sequence[str] | None = None
) -> None:
    """Exec torchrun when a plainly started script wants more than one process; return when it wants one.
    ``detail``: what the processes run, said after the notice (a script's own path: ``own_path.py``);
    ``arguments``: the script's arguments the processes get, in place of its own (``sys.argv[1:]``)."""
    process_count = requested_process_count(os.environ, chosen)
    if process_count == 1:
        return
    if os.environ.get(RELAUNCHED_VARIABLE):
        raise LaunchEnvironmentError(
            f"this process was relaunched under torchrun ({RELAUNCHED_VARIABLE} is set) but finds no RANK or "
            "WORLD_SIZE; something between torchrun and the script dropped them. Not relaunching again."
        )
    if not can_rerun_command_line():
        warnings.warn(
            f"mgpu_runtime: {process_count} processes wanted, but an interactive session cannot be relaunched "
            "under torchrun; running as a single process",
            stacklevel=3,
        )
        return
    original = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    if arguments is not None:
        original = with_arguments(original, sys.argv[1:], arguments)
    command = torchrun_command(process_count, sys.executable, original)
    notice = relaunch_notice(process_count, os.environ, chosen)
    print(f"{notice}; {detail}" if detail else notice, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, command, {**os.environ, RELAUNCHED_VARIABLE: "1"})


def with_arguments(original_argv: Sequence[str], script_arguments: Sequence[str], arguments: Sequence[str]) -> list[str]:
    """``original_argv`` (the interpreter's, ``sys.orig_argv``) with the script's arguments, its last
    ``len(script_arguments)`` words, replaced by ``arguments``. A script that changed ``sys.argv`` itself has
    no such words: that is an error, since the processes would not rerun its command line."""
    count = len(script_arguments)
    if list(original_argv[len(original_argv) - count :]) != list(script_arguments) or count >= len(original_argv):
        raise LaunchEnvironmentError(
            "the script changed sys.argv before it was relaunched under torchrun: its processes cannot be given "
            f"its command line; start it with {NPROC_VARIABLE}=1, or under torchrun yourself"
        )
    return [*original_argv[: len(original_argv) - count], *arguments]


def can_rerun_command_line() -> bool:
    # A REPL, stdin, `python -i` or a notebook kernel has no command line that would redo the same work.
    return sys.argv[0] not in ("", "-") and not sys.flags.interactive and "ipykernel" not in sys.modules
