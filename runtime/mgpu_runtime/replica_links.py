"""Layers that meet their own copies across DataParallel's replica threads.

``nn.DataParallel`` runs its replicas in threads of one process, so a layer can exchange values with its copies
in memory: a synchronized BatchNorm told its copy by ``__data_parallel_replicate__`` (the Synchronized-BatchNorm
packages), or one that keeps ``queue.Queue``s and barriers made in its ``__init__`` (CCNet's and the first
inplace_abn's ``InPlaceABNSync``: the replica on the first device waits for the others' statistics). Such
replicas cannot run one after another (the emulated devices, balanced CPU replicas): they run in threads. And
they cannot become one process per GPU: each process holds one replica, and the first would wait forever for
copies that are in other processes.
"""

from __future__ import annotations

import multiprocessing.queues
import multiprocessing.synchronize
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from torch import nn

# What a layer holds to meet its copies in other threads: thread primitives, and multiprocessing's (which work
# across DataParallel's threads too, and no more than those across DDP's processes when each made its own).
_PRIMITIVES = (
    queue.Queue,
    threading.Barrier,
    threading.Condition,
    threading.Event,
    threading.Semaphore,
    multiprocessing.queues.Queue,
    multiprocessing.queues.SimpleQueue,
    multiprocessing.synchronize.Barrier,
    multiprocessing.synchronize.Condition,
    multiprocessing.synchronize.Event,
    multiprocessing.synchronize.Semaphore,
)


def _holds_primitive(layer: nn.Module) -> bool:
    for value in vars(layer).values():
        values = value if isinstance(value, (list, tuple)) else (value,)
        if any(isinstance(item, _PRIMITIVES) for item in values):
            return True
    return False


def thread_linked(module: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """The layers of ``module`` that hold queues or barriers to meet their copies in other threads."""
    return ((name, layer) for name, layer in module.named_modules() if _holds_primitive(layer))


def waits_for_copies(module: nn.Module) -> bool:
    """Whether a replica of ``module`` meets the others while it runs (so the replicas run at once)."""
    return any(hasattr(layer, "__data_parallel_replicate__") or _holds_primitive(layer) for layer in module.modules())


# How long replicas that wait for a copy that failed are given before that failure stops the run.
WAITING_AFTER_A_FAILURE_S = 10.0


def run_at_once(jobs: Sequence[Callable[[], None]], failed: Callable[[], bool]) -> list[int]:
    """Runs ``jobs`` in threads at once and waits for them. Returns the positions of the jobs still running
    ``WAITING_AFTER_A_FAILURE_S`` after ``failed()`` first answered true (none when every job ended).

    A replica that failed leaves the copies that wait for it waiting forever (a synchronized BatchNorm's master
    that raised; under torch's DataParallel too): the threads are daemons, so those still waiting end with the
    process once the caller has raised the failure.
    """
    threads = [threading.Thread(target=job, daemon=True) for job in jobs]
    for thread in threads:
        thread.start()
    failed_at = None
    while alive := [thread for thread in threads if thread.is_alive()]:
        alive[0].join(0.05)
        if failed_at is None and failed():
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > WAITING_AFTER_A_FAILURE_S:
            return [position for position, thread in enumerate(threads) if thread.is_alive()]
    return []


def still_waiting(positions: Sequence[int]) -> str:
    """The note a failure raised while its copies wait for it carries."""
    return f"(the replicas {list(positions)} still wait for it: this one's failure stops the run)"
