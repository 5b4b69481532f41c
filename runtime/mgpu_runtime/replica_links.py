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
from collections.abc import Iterator

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
