"""A plain ``python train.py`` of a script with a distributed path of its own runs that path, with the global batch.

Some scripts train two ways: their own distributed path, chosen when a launcher sets ``LOCAL_RANK`` (or
``RANK``, ``WORLD_SIZE``, or passes ``--local_rank``), which loads a per-process batch through a
``DistributedSampler``; and a DataParallel fallback, which splits the batch it is given over the GPUs of one
process. The codemod migrates such a script by calling ``launch_own_path(option, default)`` where the program
starts, before its command line is parsed and before anything touches CUDA:

* started plainly on W devices (W > 1: the visible GPUs, or ``MGPU_NPROC``, as ``setup()`` counts them), it
  relaunches the same command line under torchrun as W processes (``launch.relaunch_if_requested``), each
  given the batch option at the original's value divided by W: the script's own path then loads W shares of
  the batch the DataParallel fallback was given, the same global batch;
* in those processes it sets the batch option in ``sys.argv`` (the original command line is rerun as it was;
  the per-process value comes in ``MGPU_OWN_PATH_BATCH``) and has the main process alone print, as
  ``setup()`` does (``MGPU_LOG``); at its first optimizer step a process that is not in a process group of the
  W processes (the script did not take its own path after all) stops, saying so, instead of training its
  DataParallel branch on a share of the batch;
* it does nothing under a launcher the user chose (torchrun, SLURM), nor on one device; and where the batch
  does not split evenly over W, or cannot be read from the command line (an abbreviated option, a value that
  is no whole number, no value and no default, arguments read from an ``@file``), it says so in one line on stderr and returns: the script
  runs its DataParallel fallback in one process, as the original did.

A script whose command line a configuration file may override after parsing (``--config`` loaded, then
``setattr(args, k, v)`` for each key) knows the batch it really uses only after that block. There the call
comes after it, given that value: ``launch_own_path("--train_batch_size", batch=args.train_batch_size)``. A
plain start then splits that value (the command line's, or the file's), and since the script has parsed its
command line already, the relaunched processes get their share on theirs: the option, spelled out as two
words (``--train_batch_size 6``), replaces each of its occurrences, or comes first when absent (a script that
lets the command line override its file, as such scripts do, then uses it). Each relaunched process checks, at
the call, that the batch the script now holds is its share, and stops otherwise (its file overrode the
command line), rather than train on another batch.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Sequence

import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

from mgpu_runtime.distributed import rank_output
from mgpu_runtime.distributed.environment import TORCHRUN, detect_environment
from mgpu_runtime.distributed.process_group import current_job
from mgpu_runtime.distributed.leaving import let_the_gloo_threads_finish, meet_the_others, the_store
from mgpu_runtime.distributed.launch import (
    OWN_PATH_VARIABLE,
    RELAUNCHED_VARIABLE,
    can_rerun_command_line,
    relaunch_if_requested,
    requested_process_count,
)

BATCH_VARIABLE = "MGPU_OWN_PATH_BATCH"
_NOT_GIVEN = object()  # ``batch`` not given: the call comes before the command line is parsed
_FALLBACK = "running the script's DataParallel branch in one process"


def launch_own_path(
    batch_option: str | Sequence[str], batch_default: int | None = None, *, batch: object = _NOT_GIVEN
) -> None:
    """Relaunch a plainly started script as one process per device on its own distributed path, each with
    ``batch_option`` (one option string, or all of them: ``("-b", "--batch_size")``) at the batch it was given
    (``batch_default`` when it was given none) divided by the processes. Called after the script has parsed its
    command line (and let a configuration file override it), ``batch`` is the batch it holds: that value is
    split, and the relaunched processes get their share on their command line. See the module doc."""
    options = (batch_option,) if isinstance(batch_option, str) else tuple(batch_option)
    parsed = batch is not _NOT_GIVEN
    environment = detect_environment(os.environ)
    if environment.world_size != 1 or environment.launcher == TORCHRUN:
        per_process = os.environ.get(BATCH_VARIABLE)
        if per_process is not None and os.environ.get(RELAUNCHED_VARIABLE) and environment.launcher == TORCHRUN:
            if parsed:
                _check_the_share(batch, per_process, options)
            else:
                sys.argv[1:] = with_batch(sys.argv[1:], options, per_process)
            rank_output.apply(environment)
            _check_at_the_first_step(environment.world_size)
            atexit.register(_leave_the_process_group)
        return
    processes = requested_process_count(os.environ)
    if processes == 1 or not can_rerun_command_line():
        relaunch_if_requested()  # stops a relaunched process that lost its launcher; warns in a REPL
        return
    if parsed:
        given, why_not = batch_held(sys.argv[1:], options, batch)
    else:
        given, why_not = batch_given(sys.argv[1:], options, batch_default)
    if given is not None and given % processes:
        why_not = f"{options[-1]} {given} does not split evenly over {processes} processes"
    if given is None or why_not:
        print(f"mgpu_runtime: {why_not}: {_FALLBACK}", file=sys.stderr)
        return
    per_process = str(given // processes)
    os.environ[BATCH_VARIABLE] = per_process
    relaunch_if_requested(
        detail=f"the script's own distributed path, {options[-1]} {per_process} per process ({given} over {processes})",
        arguments=with_batch(sys.argv[1:], options, per_process, spelled_out=True) if parsed else None,
    )


def batch_held(arguments: Sequence[str], options: Sequence[str], batch: object) -> tuple[int | None, str]:
    """The batch a script holds once it has parsed its command line (``batch``), with why it cannot be split
    (an empty string when it can): not a whole number, or a command line whose option the relaunched processes'
    share could not replace (an abbreviation, an ``@file``)."""
    why = _unreadable(arguments, options)
    if why:
        return None, why
    if type(batch) is not int or batch < 1:
        return None, f"{_longest(options)} {batch!r} is not a whole number of rows"
    return batch, ""


def _unreadable(arguments: Sequence[str], options: Sequence[str]) -> str:
    """Why the command line's batch option cannot be read or replaced (an ``@file`` that may hold it, a word that
    may abbreviate it); an empty string when it can."""
    from_file = next((word for word in _before_the_end(arguments) if word.startswith("@")), None)
    if from_file is not None:
        return f"{from_file} may hold {_longest(options)} (arguments read from a file)"
    for at, value in _occurrences(arguments, options):
        if at is None:
            return f"{value} may abbreviate {_longest(options)}: spell the option out to run on several processes"
    return ""


def _check_the_share(batch: object, per_process: str, options: Sequence[str]) -> None:
    """In a relaunched process, after the script parsed its command line: the batch it holds must be the share
    its command line gave it, or its configuration file overrode that share."""
    if str(batch) != per_process:
        raise RuntimeError(
            f"mgpu_runtime: this process was relaunched with {_longest(options)} {per_process} (its share of the "
            f"batch), but the script holds {batch!r}: its configuration file overrides the command line. Give the "
            f"batch on the command line, or start it with MGPU_NPROC=1 to run its DataParallel branch as before."
        )


def batch_given(
    arguments: Sequence[str], options: Sequence[str], default: int | None
) -> tuple[int | None, str]:
    """The batch the command line gives (its last occurrence, as argparse reads it), else ``default``; with
    why it cannot be read (an empty string when it can)."""
    why = _unreadable(arguments, options)
    if why:
        return None, why
    text: str | None = None
    for _, value in _occurrences(arguments, options):
        text = value
    if text is None:
        if default is None:
            return None, f"no {_longest(options)} given, and it has no default"
        return default, ""
    if not text.strip().isdigit() or int(text) < 1:
        return None, f"{_longest(options)} {text!r} is not a whole number of rows"
    return int(text), ""


def with_batch(arguments: Sequence[str], options: Sequence[str], per_process: str, spelled_out: bool = False) -> list[str]:
    """``arguments`` with every value of the batch option set to ``per_process`` (the option added first when
    absent, where options of the script's own parser go before a sub-command). ``spelled_out``: each occurrence
    becomes the longest option and its value as two words (``--train_batch_size 6``), as a script that lets its
    command line override a configuration file (``if f"--{k}" in argv``) finds it."""
    changed: list[str | list[str]] = list(arguments)
    found = False
    for at, _ in _occurrences(arguments, options):
        if at is None:
            continue
        found = True
        word = arguments[at]
        if word in options:
            changed[at + 1] = per_process
            if spelled_out:
                changed[at] = _longest(options)
        elif spelled_out:
            changed[at] = [_longest(options), per_process]
        elif word.startswith("--"):
            changed[at] = f"{word.partition('=')[0]}={per_process}"
        else:  # a short option with its value attached: -b12
            changed[at] = word[:2] + per_process
    flat = [part for entry in changed for part in ([entry] if isinstance(entry, str) else entry)]
    return flat if found else [_longest(options), per_process, *flat]


def _occurrences(arguments: Sequence[str], options: Sequence[str]):
    """``(index, value)`` of each occurrence of the option, up to ``--``; ``(None, word)`` for a word that may be
    an abbreviation of it (argparse accepts unique prefixes of long options)."""
    longs = [option for option in options if option.startswith("--")]
    shorts = [option for option in options if not option.startswith("--")]
    index = 0
    while index < len(arguments):
        word = arguments[index]
        if word == "--":
            return
        name, equals, value = word.partition("=")
        if word in options and index + 1 < len(arguments):
            yield index, arguments[index + 1]
            index += 2
            continue
        if equals and name in longs:
            yield index, value
        elif word.startswith("--") and len(name) > 2 and name not in longs and any(long.startswith(name) for long in longs):
            yield None, name
        elif any(word.startswith(short) and len(word) > len(short) for short in shorts):
            yield index, word[2:].lstrip("=")
        index += 1


def _before_the_end(arguments: Sequence[str]) -> Sequence[str]:
    """The arguments before ``--``, where options are read."""
    return arguments[: list(arguments).index("--")] if "--" in arguments else arguments


def _longest(options: Sequence[str]) -> str:
    return max(options, key=len)


def _leave_the_process_group() -> None:
    """At the exit of a process this call relaunched: the process group the script's own path made is destroyed
    (its gloo threads joined), as the runtime's own set-up does. A script that leaves it to the interpreter's
    end may die there with ``terminate called without an active exception`` (SIGABRT), when a peer has
    closed its side first: a job that trained well would end with a failure. The processes first wait for each
    other through the job's store, at most ``_EXIT_WAIT_S`` seconds, so that none closes its side while a slower
    peer still finishes the script's last collective (under load such a peer's gloo thread saw its connection
    reset, and aborted). Not a barrier: a process leaving mid-training (``sys.exit()``) would wait there for peers
    waiting for it in a gradient reduction, until the process group's timeout. A process whose script ended with an
    uncaught exception waits for nobody: the job fails anyway, and its peers may be waiting for it."""
    if dist.is_available() and dist.is_initialized():
        store, everyone = the_store()
        if getattr(sys, "last_value", None) is not None:  # set by Python when an uncaught exception ended the script
            store = None
        meet_the_others(store, everyone, "own_path/leaving")
        dist.destroy_process_group()
        # ... and again once each has destroyed its group: none ends its process (closing its connections)
        # while a peer is still taking its own down.
        meet_the_others(store, everyone, "own_path/left")
        let_the_gloo_threads_finish(everyone)


def _check_at_the_first_step(processes: int) -> None:
    """Stop at the first optimizer step of a relaunched process that is not on the script's own path (no
    process group of ``processes``): it would train its DataParallel branch on a share of the batch."""
    handle: RemovableHandle | None = None

    def check(optimizer: object, args: object, kwargs: object) -> None:
        assert handle is not None
        handle.remove()
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() == processes):
            raise RuntimeError(
                f"mgpu_runtime: this script was relaunched as {processes} processes to run its own distributed path, "
                "but it trains without a process group of them: torchrun's variables (LOCAL_RANK, RANK, WORLD_SIZE) "
                "did not choose that path. Start it with MGPU_NPROC=1 to run its DataParallel branch as before."
            )

    handle = register_optimizer_step_pre_hook(check)


def leave_to_own_path() -> None:
    """Called where a migrated script starts its own distributed path itself (SimCLR's ``mp.spawn(main, ...,
    nprocs=args.gpus)`` under ``if args.nodes > 1:``), beside a DataParallel fallback that migrated, whose branch
    calls ``setup()`` instead: this process and the processes it starts then run that path as the original ran it.
    The runtime stands aside there: ``setup()`` relaunches nothing and joins no process group (the script makes
    its own), each process is a job of one plain process (``world_size()`` 1, ``is_main_process()`` True,
    ``barrier()`` returns, ``distribute_loader`` gives the loader as it is, and printing is the script's own), and
    a wrap the migration made ``DistributedDataParallel`` is the original's ``nn.DataParallel``."""
    job = current_job()
    if job is not None and job.environment.world_size > 1:
        raise RuntimeError(
            "leave_to_own_path() in a process of the runtime's job: the script's own distributed path is started "
            "where the migrated DataParallel branch is not (the set-up is in the other branch)"
        )
    os.environ[OWN_PATH_VARIABLE] = "1"
