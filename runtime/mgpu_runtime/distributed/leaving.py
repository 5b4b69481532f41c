"""Leaving a job together: each process waits at a stage of its exit until every process has come to it.

A gloo process that ends while a peer is still taking its process group down can make that peer abort at exit
(``terminate called without an active exception``, SIGABRT) after a run that trained well. So a process that
has destroyed its group waits, through the job's store, until every process has destroyed its own (at most
``EXIT_WAIT_S`` seconds, or until the store is gone with a peer that already left), and only then ends.

The wait is for a job that ends well. A process that ends with an uncaught exception does not wait (the job fails
anyway, and its peers may wait for it in a collective), nor does one whose peer is blocked in a collective: the
destroy does not make that collective fail, only this process's end does (its connections close), so waiting
for that peer would hold both until ``EXIT_WAIT_S``.

Then the process gives gloo's worker threads the interpreter for a moment (``let_the_gloo_threads_finish``). A
collective's waiter wakes as soon as its work is marked done, but the worker thread drops the work only after:
that drop takes the GIL (the work keeps the Python objects of its caller's thread-local state). Had the main
thread gone on into the interpreter's finalization meanwhile, Python ends the worker thread when it asks for the
GIL (``pthread_exit``), and that unwind through the work's destructor is ``std::terminate``: the SIGABRT above,
after a job that trained well and destroyed its group (its DDP module still holds the group, so the destroy joins
no thread). A core dump of such a rank (torch 2.13, gloo, two processes on two busy cores) shows it:
``ProcessGroupGloo::runLoop`` -> ``~AsyncAllreduceWork`` -> ``~ThreadLocalState`` -> ``SafePyObject`` decref ->
``take_gil`` -> ``PyThread_exit_thread`` -> ``std::terminate``, while the main thread is in ``Py_FinalizeEx``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

import torch.distributed as dist

EXIT_WAIT_S = 30.0
# How long the exiting process leaves the GIL to gloo's worker threads (each needs it for microseconds).
GLOO_THREADS_S = 0.1
_EXIT_KEY = "mgpu_runtime/exit/"


def the_store() -> tuple[object | None, int]:
    """The job's store and the number of processes, read while the process group exists (None in a world of
    one, where nobody is to be met)."""
    try:
        everyone = dist.get_world_size()
        return (dist.distributed_c10d._get_default_store(), everyone) if everyone > 1 else (None, 0)
    except Exception:  # noqa: BLE001 -- no store to meet through: leave without waiting
        return None, 0


def meet_the_others(
    store: object | None, everyone: int, stage: str, waited_for: Callable[[], bool] | None = None
) -> None:
    """Count this process at ``stage``, then wait until every process has come to it (or ``EXIT_WAIT_S`` has
    passed, or the store is gone with a peer that already left, or ``waited_for()``, asked every half second,
    says that a peer waits for this process and so will never come). Stages are counted per restart of an
    elastic job, whose store outlives the workers it restarts."""
    if store is None:
        return
    key = f"{_EXIT_KEY}{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{stage}"
    with contextlib.suppress(Exception):
        arrived = store.add(key, 1)  # type: ignore[attr-defined]
        started = time.monotonic()
        asked = started
        while arrived < everyone and time.monotonic() < started + EXIT_WAIT_S:
            time.sleep(0.02)
            arrived = store.add(key, 0)  # type: ignore[attr-defined]
            if waited_for is not None and time.monotonic() - asked >= 0.5:
                asked = time.monotonic()
                if waited_for():
                    return


def let_the_gloo_threads_finish(everyone: int) -> None:
    """Leave the GIL to gloo's worker threads for ``GLOO_THREADS_S``, so that they drop the works of the last
    collectives while the interpreter still lives (see above). Nothing to wait for in a world of one."""
    if everyone > 1:
        time.sleep(GLOO_THREADS_S)
