"""``save`` and ``load``: checkpoints written once, atomically, and read onto this process's device.

``save`` is called by every process, where the original called ``torch.save``: the main process writes a
temporary file beside the target and renames it into place (``os.replace``, atomic on POSIX and Windows),
so a crash mid-write never leaves a truncated checkpoint; the others wait at a barrier, so when ``save``
returns anywhere, the file is complete for everyone (a following ``load`` on every rank is safe).
"""

from __future__ import annotations

import os
from typing import IO, Any, Union

import torch

from mgpu_runtime.distributed.process_group import barrier, device, is_main_process

Destination = Union[str, "os.PathLike[str]", IO[bytes]]


def save(obj: Any, path: Destination, *, wait: bool = True, **kwargs: Any) -> None:
    """``torch.save(obj, path, **kwargs)`` on the main process only, atomically; every process waits for it.

    ``wait=False`` skips the wait, for a save that not every process reaches (under a condition each process
    decides from its own batch): the waiting processes would hang there. The file is then complete on disk
    only once the main process is past this call."""
    if is_main_process():
        if isinstance(path, (str, os.PathLike)):
            _save_atomically(obj, os.fspath(path), **kwargs)
        else:
            torch.save(obj, path, **kwargs)
    if wait:
        barrier()


def load(path: Destination, **kwargs: Any) -> Any:
    """``torch.load`` with tensors mapped to ``device()``, unless the caller passes ``map_location``."""
    kwargs.setdefault("map_location", device())
    return torch.load(path, **kwargs)


def _save_atomically(obj: Any, path: str, **kwargs: Any) -> None:
    directory, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as stream:
            torch.save(obj, stream, **kwargs)
            stream.flush()
            os.fsync(stream.fileno())  # the data is on disk before the name points at it
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
