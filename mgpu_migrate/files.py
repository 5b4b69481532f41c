"""Files around the engine: discovery, reading in the file's own encoding, safe write-back.

A rewrite never loses work: a file is replaced only if it is still what was read (``Stamp`` and the bytes),
so an edit made while the tool ran, or another run's rewrite, is refused rather than overwritten. The new
content goes to a temporary file beside the original, renamed over it (atomic: an interrupted run leaves
the old file or the new one), keeping mode, owner and group. Where a rename would lose something (a file
with several hard links, or an owner this process cannot give the new file), the file is rewritten in place
instead, as black and ruff always do, with interrupts held off for the few microseconds of the write; the
space it needs is claimed first (a full disk or ``ulimit -f`` refuses it there), and the original bytes are
put back if the write fails, so a file that cannot be rewritten is left byte-identical either way.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import stat
import tempfile
import threading
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

try:
    import resource
except ImportError:  # Windows: no file-size limit to respect
    resource = None  # type: ignore[assignment]

# Directories never walked into (they are someone else's code or generated); a path named explicitly
# on the command line is always processed.
_SKIPPED_DIRECTORIES = {"__pycache__", "node_modules", "site-packages", "build", "dist"}


def _skip_directory(directory: Path) -> bool:
    return directory.name.startswith(".") or directory.name in _SKIPPED_DIRECTORIES or (directory / "pyvenv.cfg").exists()


def discover(
    paths: list[str],
    excluded: Callable[[str], bool] = lambda path: False,
    outside: list[str] | None = None,
    suffixes: tuple[str, ...] = (".py",),
) -> tuple[list[str], list[str]]:
    """Expand files and directories into Python files, each real file once, in a stable order.

    Walked directories give the files whose names end in one of ``suffixes``. ``excluded`` says which files and directories to leave out (the settings' ``exclude`` patterns); it
    applies to named paths too. Returns the files and the paths that do not exist. A symlink found in a walked
    directory that leads out of it is skipped (as black does: a rewrite would change a file nobody named),
    and appended to ``outside``.
    """
    found: list[str] = []
    missing: list[str] = []
    seen: set[str] = set()

    def add(path: str, real: str) -> None:
        if real not in seen and not excluded(path):
            seen.add(real)
            found.append(path)

    for path in paths:
        if os.path.isdir(path):
            if excluded(path):
                continue
            boundary = os.path.realpath(path)
            for root, directories, files in os.walk(path):
                directories[:] = sorted(
                    d for d in directories if not _skip_directory(Path(root, d)) and not excluded(os.path.join(root, d))
                )
                real_root = os.path.realpath(root)  # once per directory: a file that is no symlink is in it
                for name in sorted(files):
                    candidate = os.path.join(root, name)
                    if not name.endswith(suffixes) or os.path.isdir(candidate):
                        continue
                    real = os.path.join(real_root, name)
                    if os.path.islink(candidate):
                        real = os.path.realpath(candidate)
                        if not inside(real, boundary):
                            if outside is not None:
                                outside.append(candidate)
                            continue
                    add(candidate, real)
        elif os.path.lexists(path):
            add(path, os.path.realpath(path))
        else:
            missing.append(path)
    return found, missing


def inside(real: str, boundary: str) -> bool:
    return os.path.commonpath([real, boundary]) == boundary


@dataclass(frozen=True)
class Stamp:
    """What identifies a file's state on disk without reading it: which file, how long, when last written."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, status: os.stat_result) -> Stamp:
        return cls(status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


@dataclass
class SourceFile:
    path: str
    data: bytes
    encoding: str
    stamp: Stamp | None = None
    """The file as it was read (None: not read from disk); a write-back requires it unchanged."""

    @property
    def text(self) -> str:
        # Newlines are kept as they are (no universal-newline translation), so CRLF files round-trip.
        return self.data.decode(self.encoding)


class NotARegularFile(OSError):
    pass


class TooLarge(OSError):
    """More bytes than the reader's bound."""


class FileChanged(OSError):
    """The file on disk is no longer what was read: someone edited or replaced it meanwhile."""


def read(path: str, limit: int | None = None) -> tuple[bytes, Stamp]:
    """A regular file's content and stamp. A FIFO, socket or device is refused rather than read (it could
    block forever, or never end: ``/dev/zero``), and so, with ``limit``, is a file of more bytes than that."""
    with _regular_file(path) as (handle, status):
        if limit is None:
            return handle.read(), Stamp.of(status)
        data = handle.read(limit + 1) if status.st_size <= limit else b""
        if status.st_size > limit or len(data) > limit:
            raise TooLarge(errno.EFBIG, f"over {limit} bytes")
        return data, Stamp.of(status)


def head(path: str, size: int) -> bytes:
    """The first ``size`` bytes of a regular file (refused as by ``read`` otherwise)."""
    with _regular_file(path) as (handle, _):
        return handle.read(size)


@contextlib.contextmanager
def _regular_file(path: str) -> Iterator[tuple[IO[bytes], os.stat_result]]:
    # O_NONBLOCK: opening a FIFO that has no writer would otherwise wait for one.
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode):
        os.close(descriptor)
        raise NotARegularFile(errno.EINVAL, "not a regular file")
    with open(descriptor, "rb") as handle:
        yield handle, status


def source_file(path: str, data: bytes, stamp: Stamp | None = None) -> SourceFile:
    """Bytes read from ``path`` with the encoding their BOM or coding cookie declares (UTF-8 otherwise)."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return SourceFile(path, data, encoding, stamp)


def write_atomically(path: str, text: str, encoding: str, read_as: SourceFile | None = None) -> None:
    """Replace a file's content, keeping its mode, owner and group; a symlink keeps pointing at it.

    With ``read_as`` (the file as it was read), raises ``FileChanged`` and writes nothing unless the file is
    still exactly that. One rename; in place only where a rename would lose hard links or the owner.
    """
    target = os.path.realpath(path)
    data = text.encode(encoding)
    status = os.stat(target)
    if status.st_nlink > 1 or not _can_give_owner(status):
        _rewrite_in_place(target, data, read_as)
        return
    directory = os.path.dirname(target) or "."
    temporary = handle = None
    try:
        # A Ctrl-C or SIGTERM while the temporary file is made is delivered once its name is known (here, where
        # the cleanup below sees it), not between its creation and this try, which would leave it behind.
        with interrupts_held():
            descriptor, temporary = tempfile.mkstemp(prefix=temporary_prefix(os.getpid()), suffix=TEMPORARY_SUFFIX, dir=directory)
            handle = os.fdopen(descriptor, "wb")
        with handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            created = os.fstat(handle.fileno())
        if hasattr(os, "chown") and (created.st_uid, created.st_gid) != (status.st_uid, status.st_gid):
            os.chown(temporary, status.st_uid, status.st_gid)
        os.chmod(temporary, stat.S_IMODE(status.st_mode))  # after chown, which clears set-id bits
        if read_as is not None:
            with open(target, "rb") as current:
                _check_unchanged(current, read_as)
        os.replace(temporary, target)
    except BaseException:
        # Held here too: on Ctrl-C a worker gets the terminal's SIGINT and then its parent's SIGTERM; the second,
        # raised between the lines below, would leave the temporary file behind (a stray .tmp was seen once, under
        # load, in tests/robustness/test_interrupts.py).
        with interrupts_held():
            if handle is not None:
                handle.close()
            if temporary is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary)
        raise


TEMPORARY_SUFFIX = ".tmp"


def temporary_prefix(pid: int) -> str:
    """The start of the names of the temporary files process ``pid`` writes (``remove_temporaries`` finds them)."""
    return f".mgpu-migrate-{pid}-"


def remove_temporaries(pid: int, directories: set[str]) -> None:
    """Remove what a killed writer (process ``pid``) left of its writes in ``directories``: a process killed
    outright cannot remove its temporary file itself."""
    prefix = temporary_prefix(pid)
    for directory in directories:
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.startswith(prefix) and entry.name.endswith(TEMPORARY_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)


def _can_give_owner(status: os.stat_result) -> bool:
    """Whether a new file made by this process can be given ``status``'s owner and group: as root, or as the
    owner when the group is one of this process's."""
    if not hasattr(os, "geteuid"):
        return True
    if os.geteuid() == 0:
        return True
    return status.st_uid == os.geteuid() and (status.st_gid == os.getegid() or status.st_gid in os.getgroups())


def _check_unchanged(handle: IO[bytes], read_as: SourceFile) -> None:
    """Raise ``FileChanged`` unless the open file has ``read_as``'s stamp and bytes (compared in full: a
    same-size edit within one mtime tick is caught too)."""
    if Stamp.of(os.fstat(handle.fileno())) != read_as.stamp or handle.read() != read_as.data:
        raise FileChanged("changed on disk since it was read")


def _rewrite_in_place(target: str, data: bytes, read_as: SourceFile | None) -> None:
    """Write ``data`` through the file's own inode, leaving it byte-identical when the write cannot finish.

    The space the new text needs is claimed before the first byte changes (``posix_fallocate``: a full disk,
    a quota or ``ulimit -f`` fail there, the file untouched), so what can still fail after is an I/O error;
    then the original bytes are written back."""
    with open(target, "r+b", buffering=0) as handle, interrupts_held():
        if read_as is not None:
            _check_unchanged(handle, read_as)
            original = read_as.data
        else:
            original = handle.read()
        descriptor = handle.fileno()
        _claim_space(descriptor, len(original), len(data))
        try:
            _write_from_start(descriptor, data)
        except BaseException as failure:
            try:
                _write_from_start(descriptor, original)
            except OSError as second:
                raise OSError(
                    failure.errno if isinstance(failure, OSError) else None,
                    f"{getattr(failure, 'strerror', None) or failure}; putting the original back failed too "
                    f"({second.strerror or second}): the file may be incomplete",
                ) from failure
            raise


def _claim_space(descriptor: int, size: int, needed: int) -> None:
    """Fail, changing nothing, unless the file can grow from ``size`` to ``needed`` bytes (and be written to
    that size under this process's file-size limit, ``ulimit -f``)."""
    if _over_size_limit(max(size, needed)):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    if needed <= size or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(descriptor, size, needed - size)
    except OSError as error:
        os.ftruncate(descriptor, size)  # a partial claim may have grown the file
        if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP):  # no fallocate here: the write-back covers it
            raise


def _over_size_limit(size: int) -> bool:
    if resource is None:
        return False
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return limit != resource.RLIM_INFINITY and size > limit


def _write_from_start(descriptor: int, data: bytes) -> None:
    written = 0
    while written < len(data):
        written += os.pwrite(descriptor, data[written:], written)
    os.ftruncate(descriptor, len(data))
    os.fsync(descriptor)


@contextlib.contextmanager
def interrupts_held():
    """Ctrl-C and SIGTERM arriving inside are delivered at its end (so a write in place is never cut short, and
    worker processes forked inside start with a handler that does nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {number: signal.signal(number, lambda number, frame: arrived.append(number)) for number in held}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in arrived:
            signal.raise_signal(number)
