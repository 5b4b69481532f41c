"""Readings that name things the same on every process: the main process's value, returned to all of them.

The original read the clock once: ``args.save = "eval-{}".format(time.strftime("%Y%m%d-%H%M%S"))`` named one
run directory. One process per GPU reads it once per process, and two processes whose readings fall on either
side of a second name two directories: the main process makes its own, and another opens a log file in the
one nobody made (FileNotFoundError), or writes beside the main process's files under another name.
``main_process_value(time.strftime, "%Y%m%d-%H%M%S")`` calls the function on the main process and returns
its result on every process, so the name is the original's one name.

It never waits for a collective that some process does not join: the main process publishes its value in the
job's store (under the call's site: its file's name and line, and how many times this process passed there)
and goes on at once; each other process waits for that key alone, at most ``MGPU_TIMEOUT`` seconds. So a call
that only the main process makes (under ``if mgpu_runtime.is_main_process():``) costs nothing and pairs with
nothing. When the main process's call raises, the others raise too, saying so. In a single process it is just
the call (no set-up); in a plainly started script that will relaunch, the first call relaunches it (as
``rank()`` does), so the value is read by the job's processes only.
"""

from __future__ import annotations

import datetime
import os
import pickle
import sys
from types import FrameType
from typing import Any, Callable

import torch.distributed as dist

from mgpu_runtime.distributed.process_group import TIMEOUT_VARIABLE, is_main_process, job, timeout_seconds, world_size


def main_process_value(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` called on the main process, its result returned on every process.

    For a reading that differs between processes and names something they share: the clock read into a run
    directory's name (``time.strftime``, ``datetime.datetime.now``). The result must pickle: one that does not
    raises on the main process, and the others hear why at once. In a single process, the call itself."""
    if world_size() == 1:
        return function(*args, **kwargs)
    return main_process_result(
        lambda: function(*args, **kwargs), sys._getframe(1), f"mgpu_runtime.main_process_value({_name(function)})"
    )


def main_process_result(call: Callable[[], Any], caller: FrameType, what: str, kind: str = "") -> Any:
    """``call()`` on the main process (the others do not call it), its result returned on every process, through
    the job's store under the site of ``caller`` (``main_process_value``'s way). ``what`` names the call in an
    error. The last process to read a value removes it from the store, so a call made each step (a visdom
    client's ``viz.line(...)``, ``MainProcessOnly``) leaves nothing behind."""
    site, key, store = _keyed(caller, kind)
    if is_main_process():
        try:
            value = call()
            published = pickle.dumps(("value", value))  # a value that does not pickle raises here, and is told
        except BaseException as error:
            store.set(key, pickle.dumps(("raised", f"{type(error).__name__}: {error}")).hex())
            raise
        store.set(key, published.hex())
        return value
    seconds = timeout_seconds(os.environ)
    try:
        store.wait([key], datetime.timedelta(seconds=seconds))
    except (RuntimeError, dist.DistStoreError) as error:
        raise RuntimeError(
            f"{what} at {site}: the main process gave no value within "
            f"{TIMEOUT_VARIABLE}={seconds:g} s (it did not come to this call, or ended)"
        ) from error
    outcome, value = pickle.loads(bytes.fromhex(store.get(key).decode()))
    if store.add(f"{key}/read", 1) == world_size() - 1:
        store.delete_key(key)
        store.delete_key(f"{key}/read")
    if outcome == "raised":
        raise RuntimeError(f"{what} at {site}: on the main process it raised {value}")
    return value


def _keyed(caller: FrameType, kind: str = "") -> tuple[str, str, dist.PrefixStore]:
    """The call's site (its file's name and line), its key (the site and how many times this process passed
    there: a call the main process alone makes, under an ``if``, moves only its own site's count), and the job's
    store the main process publishes in (under this launch's restart)."""
    site = f"{kind}{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
    passes = job().readings
    passes[site] = passes.get(site, 0) + 1
    store = dist.PrefixStore(
        f"mgpu_runtime/main_process_value/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}",
        dist.distributed_c10d._get_default_store(),
    )
    return site, f"{site}#{passes[site]}", store


def _name(function: Callable[..., Any]) -> str:
    module = getattr(function, "__module__", None)
    name = getattr(function, "__qualname__", None) or repr(function)
    return f"{module}.{name}" if module and module != "builtins" else name


# How long each wait on the store lasts before the next: the wait itself has no end, but a job torn down (a
# process that failed, Ctrl-C) ends it through the store's connection or torchrun's agent.
_WAIT_STEP_S = 600.0


def wait_for_main_process() -> None:
    """Every other process waits here until the main process gets here, however long that takes.

    For work the main process alone does while the others wait (an evaluation with a DataParallel of its own,
    run under ``if mgpu_runtime.is_main_process():`` where the original ran it once): a barrier would fail the
    job after ``MGPU_TIMEOUT`` seconds, and an evaluation may take longer. The main process marks its arrival in
    the job's store (under this call's site and pass, as ``main_process_value`` does) and goes on; the others
    wait for that mark with no limit. A main process that fails ends the job as any failing process does (the
    launcher stops the others). In a single process it does nothing."""
    if world_size() == 1:
        return
    _, key, store = _keyed(sys._getframe(1), "wait:")
    if is_main_process():
        store.set(key, "here")
        return
    while True:
        try:
            store.wait([key], datetime.timedelta(seconds=_WAIT_STEP_S))
            return
        except dist.DistStoreError as error:
            if "timeout" not in str(error).lower():
                raise
