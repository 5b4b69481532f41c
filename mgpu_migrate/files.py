"""Files around the engine: discovery, reading in the file's own encoding, atomic write-back."""

from __future__ import annotations

import io
import os
import stat
import tempfile
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Directories never walked into (they are someone else's code or generated); a path named explicitly
# on the command line is always processed.
_SKIPPED_DIRECTORIES = {"__pycache__", "node_modules", "site-packages", "build", "dist"}


def _skip_directory(directory: Path) -> bool:
    return directory.name.startswith(".") or directory.name in _SKIPPED_DIRECTORIES or (directory / "pyvenv.cfg").exists()


def discover(
    paths: list[str], excluded: Callable[[str], bool] = lambda path: False, suffixes: tuple[str, ...] = (".py",)
) -> tuple[list[str], list[str]]:
    """Expand files and directories into Python files, each real file once, in a stable order.

    Walked directories give the files whose names end in one of ``suffixes``. ``excluded`` says which files
    and directories to leave out (the settings' ``exclude`` patterns); it
    applies to named paths too. Returns the files and the paths that do not exist.
    """
    found: list[str] = []
    missing: list[str] = []
    seen: set[str] = set()

    def add(path: str) -> None:
        real = os.path.realpath(path)
        if real not in seen and not excluded(path):
            seen.add(real)
            found.append(path)

    for path in paths:
        if os.path.isdir(path):
            if excluded(path):
                continue
            for root, directories, files in os.walk(path):
                directories[:] = sorted(
                    d for d in directories if not _skip_directory(Path(root, d)) and not excluded(os.path.join(root, d))
                )
                for name in sorted(files):
                    candidate = os.path.join(root, name)
                    if name.endswith(suffixes) and not os.path.isdir(candidate):
                        add(candidate)
        elif os.path.lexists(path):
            add(path)
        else:
            missing.append(path)
    return found, missing


@dataclass
class SourceFile:
    path: str
    data: bytes
    encoding: str

    @property
    def text(self) -> str:
        # Newlines are kept as they are (no universal-newline translation), so CRLF files round-trip.
        return self.data.decode(self.encoding)


class NotARegularFile(OSError):
    pass


def read_bytes(path: str) -> bytes:
    """A regular file's content. A FIFO, socket or device is refused rather than read (it could block forever)."""
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise NotARegularFile("not a regular file")
    with open(descriptor, "rb") as handle:
        return handle.read()


def source_file(path: str, data: bytes) -> SourceFile:
    """Bytes read from ``path`` with the encoding their BOM or coding cookie declares (UTF-8 otherwise)."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return SourceFile(path, data, encoding)


def write_atomically(path: str, text: str, encoding: str) -> None:
    """Replace a file's content in one rename, keeping its mode; a symlink keeps pointing at it."""
    target = os.path.realpath(path)
    data = text.encode(encoding)
    mode = stat.S_IMODE(os.stat(target).st_mode)
    directory = os.path.dirname(target) or "."
    descriptor, temporary = tempfile.mkstemp(prefix=".mgpu-migrate-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
