"""``save`` and ``load``: checkpoints written once, atomically, and read onto this process's device.

``save`` is called by every process, where the original called ``torch.save``: the main process writes a
temporary file beside the target and renames it into place (``os.replace``, atomic on POSIX and Windows),
so the checkpoint on disk is always the old one or the complete new one; the others wait at a barrier, so
when ``save`` returns anywhere, the file is complete for everyone (a following ``load`` on every rank is safe).

The temporary file is created exclusively under an unpredictable name (``mkstemp``: ``O_EXCL``, no symlink
followed), so neither two jobs saving one path (containers reuse process ids) nor a planted symlink can
mix or redirect a write; the data and the directory entry are fsynced. A failed or interrupted save
(Ctrl-C, an exception while pickling) removes it. One that is killed outright cannot, so while it is written
it is locked (``flock``), and the next save to the same path removes such leftovers that nobody holds.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import IO, Any, Union

try:
    import fcntl
except ImportError:  # Windows: no leftovers are swept
    fcntl = None

import torch

from mgpu_runtime.distributed.process_group import barrier, device, is_main_process
from mgpu_runtime.sharded.tensor import materialize

Destination = Union[str, "os.PathLike[str]", IO[bytes]]


def save(obj: Any, path: Destination, *, wait: bool = True, **kwargs: Any) -> None:
    """``torch.save(obj, path, **kwargs)`` on the main process only, atomically; every process waits for it.

    ``wait=False`` skips the wait, for a save that not every process reaches (under a condition each process
    decides from its own batch): the waiting processes would hang there. The file is then complete on disk
    only once the main process is past this call.

    The global values in ``obj`` (the batch's, the model's outputs: ``mgpu_runtime.sharded``, held in pieces) are
    made whole first, on every process: that is a collective, which the main process could not make alone while
    pickling them."""
    obj = materialize(obj)
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


_TEMPORARY_SUFFIX = ".partial"
# A leftover is removed only when unlocked and older than this: its writer may be between creating it and
# locking it.
_ABANDONED_AFTER_S = 5.0


def _save_atomically(obj: Any, path: str, **kwargs: Any) -> None:
    directory, name = os.path.split(os.path.abspath(path))
    _remove_abandoned(directory, name)
    mode = _mode_for(path)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=_TEMPORARY_SUFFIX, dir=directory)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            if fcntl is not None:
                fcntl.flock(stream.fileno(), fcntl.LOCK_EX)  # held until closed: "being written"
            _save_reporting_write_errors(obj, stream, path, **kwargs)
            stream.flush()
            os.chmod(temporary, mode)
            os.fsync(stream.fileno())  # the data is on disk before the name points at it
            os.replace(temporary, path)
        _fsync_directory(directory)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise


class _Writes:
    """A stream that keeps the first ``OSError`` of its writes: torch's archive writer turns it into an
    ``enforce fail at inline_container.cc`` that names neither the cause nor the file."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.stream.write(data)
        except OSError as error:
            self.error = self.error or error
            raise

    def flush(self) -> None:
        self.stream.flush()


def _save_reporting_write_errors(obj: Any, stream: IO[bytes], path: str, **kwargs: Any) -> None:
    """``torch.save`` into ``stream``; a write that fails (a full disk, ``ulimit -f``) is raised as itself."""
    writes = _Writes(stream)
    try:
        torch.save(obj, writes, **kwargs)
    except RuntimeError as failure:
        if writes.error is None:
            raise
        error = writes.error
        raise OSError(error.errno, f"cannot save the checkpoint: {error.strerror or error}", path) from failure


def _mode_for(path: str) -> int:
    """The existing checkpoint's mode, else what ``open(path, "wb")`` would have created (0666 less the umask)."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _remove_abandoned(directory: str, name: str) -> None:
    """Remove temporaries of earlier saves to ``name`` whose writers were killed (unlocked and not new)."""
    if fcntl is None:
        return
    prefix = f".{name}."
    with os.scandir(directory) as entries:
        leftovers = [e.path for e in entries if e.name.startswith(prefix) and e.name.endswith(_TEMPORARY_SUFFIX)]
    for leftover in leftovers:
        try:
            descriptor = os.open(leftover, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            status = os.fstat(descriptor)
            if status.st_nlink and time.time() - status.st_mtime > _ABANDONED_AFTER_S:
                os.remove(leftover)
        except OSError:
            pass  # locked: a save in progress, in this job or another
        finally:
            os.close(descriptor)


def _fsync_directory(directory: str) -> None:
    """Make the rename itself durable (a crash right after could otherwise bring back the old name)."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
