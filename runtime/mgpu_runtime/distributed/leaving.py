"""Leaving a job together: each process waits at a stage of its exit until every process has come to it.

A gloo process that ends while a peer is still taking its process group down can make that peer abort at exit
(``terminate called without an active exception``, SIGABRT) after a run that trained well. So a process that
has destroyed its group waits, through the job's store, until every process has destroyed its own (at most
``EXIT_WAIT_S`` seconds, or until the store is gone with a peer that already left), and only then ends.

The wait is for a job that ends well. A process that ends with an uncaught exception does not wait (the job fails
anyway, and its peers may wait for it in a collective), nor does one whose peer is blocked in a collective: the
destroy does not make that collective fail, only this process's end does (its connections close), so waiting
for that peer would hold both until ``EXIT_WAIT_S``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

import torch.distributed as dist

EXIT_WAIT_S = 30.0
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
