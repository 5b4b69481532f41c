"""What each process prints: the main process's lines alone, or every rank's, as they are or rank-prefixed.

``MGPU_LOG`` chooses, for a job of several processes (a single process is never changed):

* ``rank0`` (the default): the job prints what the original single process printed, each line once. Only
  the main process's stdout is kept, and the other ranks' ``logging`` below WARNING is switched off
  (``logging.disable``: a ``logger.info`` goes to stderr, or to a log file every rank would append to).
  Their log files are opened when they first write, and in ``"a"`` mode: a ``FileHandler`` a rank makes
  after the set-up creates no file of its own (a log named by the clock, one per rank) and truncates none of
  the main process's, unless that rank logs a warning. Every rank's stderr still shows: warnings, tracebacks,
  the runtime's own messages.
* ``all``: every rank prints every line, as torchrun leaves it.
* ``prefix``: every rank prints, and each line of stdout and stderr starts with ``[rank N]``.

The values printed are the job's, not the rank's: under the runtime contract what the loop computes from the
model's outputs and the distributed loader's batches is the global batch's value on every rank (``sharded/``),
and where a script counts on its own the codemod sums the counts (``correct += mgpu_runtime.reduce_sum(...)``).
``print_once`` prints on the main process only, whatever ``MGPU_LOG`` says.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

from mgpu_runtime.distributed import failures
from mgpu_runtime.distributed.environment import LaunchEnvironment, LaunchEnvironmentError

LOG_VARIABLE = "MGPU_LOG"
MODES = ("all", "prefix", "rank0")
DEFAULT_MODE = "rank0"


class _Prefixed:
    """A text stream that starts every line written to it with a prefix, and hands on whole lines only.

    Every rank writes to the same terminal or pipe: ``print("hello")`` is two writes (the text, then the
    newline), and a line handed on in pieces can be cut by another rank's line (``[rank 1] hello[rank 0] hi``).
    So the lines that are complete go on together, prefixed, in one write, flushed at once; an unfinished one
    waits for its end, or for a ``flush()`` (a progress bar redrawn with ``\\r``), after which its rest goes
    on unprefixed."""

    def __init__(self, stream: TextIO, prefix: str) -> None:
        self._stream = stream
        self._prefix = prefix
        self._at_line_start = True
        self._pending = ""

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        if lines:
            pieces = []
            for line in lines:
                pieces.append(f"{self._prefix if self._at_line_start else ''}{line}\n")
                self._at_line_start = True
            self._stream.write("".join(pieces))
            self._stream.flush()
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._stream.write(f"{self._prefix if self._at_line_start else ''}{self._pending}")
            self._at_line_start, self._pending = False, ""
        self._stream.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def apply(environment: LaunchEnvironment) -> None:
    """Arrange this process's output as ``MGPU_LOG`` asks (called once, by ``setup()``)."""
    mode = os.environ.get(LOG_VARIABLE, "").strip().lower() or DEFAULT_MODE
    if mode not in MODES:
        raise LaunchEnvironmentError(f"{LOG_VARIABLE}={mode!r}: expected one of {', '.join(MODES)}")
    if environment.world_size == 1:
        return
    failures.install()
    # Every rank's lines go on whole (with "[rank R] " before each under "prefix"): unbuffered output from
    # several processes is cut mid-line otherwise. Under "rank0" the other ranks' stdout and INFO logs go.
    prefix = f"[rank {environment.rank}] " if mode == "prefix" else ""
    _replace_stream("stderr", _Prefixed(sys.stderr, prefix))
    if mode == "rank0" and environment.rank != 0:
        sys.stdout.flush()
        _replace_stream("stdout", open(os.devnull, "w"))  # noqa: SIM115 -- held for the life of the process
        logging.disable(logging.INFO)
        _open_log_files_when_written()
    else:
        _replace_stream("stdout", _Prefixed(sys.stdout, prefix))


def _open_log_files_when_written() -> None:
    """On a rank whose INFO logs are off: every ``logging.FileHandler`` (its subclasses too) made from now on opens
    its file at its first record, appending: a rank that only logs INFO leaves no file, and none truncates the
    main process's."""
    opened = logging.FileHandler.__init__

    def lazily(self, filename, mode="a", encoding=None, delay=False, errors=None):
        opened(self, filename, "a" if "w" in mode else mode, encoding=encoding, delay=True, errors=errors)

    logging.FileHandler.__init__ = lazily  # type: ignore[method-assign]


def _replace_stream(name: str, replacement: TextIO) -> None:
    """``sys.stdout`` or ``sys.stderr`` replaced, also in the logging handlers made before ``setup()`` (a
    ``logging.basicConfig()`` at the top of the script), which hold the stream they were given."""
    original = getattr(sys, name)
    setattr(sys, name, replacement)
    loggers = [logging.getLogger(), *(value for value in logging.Logger.manager.loggerDict.values() if isinstance(value, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is original:
                handler.setStream(replacement)


def print_once(*values, **options) -> None:
    """``print`` on the main process (rank 0) only; in a single process, always."""
    from mgpu_runtime.distributed.process_group import is_main_process

    if is_main_process():
        print(*values, **options)
