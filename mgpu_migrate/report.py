"""The file engine: screen each file, migrate it (here or in a pool of processes) and write it safely."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from mgpu_migrate import files
from mgpu_migrate.diagnostics import FILE_CHANGED, INTERNAL_ERROR, OUTSIDE_TREE, READ_ERROR, TOO_LARGE, Diagnostic
from mgpu_migrate.engine import MigrationResult, might_need_migration, might_start_a_program, migrate_source
from mgpu_migrate.options import DEFAULT_OPTIONS, Options
from mgpu_migrate.output import diff_path, markers
from mgpu_migrate.results import CHANGED, FAILED, UNCHANGED, FileOutcome, unified_diff



def _failed(path: str, code: str, message: str) -> FileOutcome:
    return FileOutcome(path, FAILED, [Diagnostic(path, 1, 1, code, message)])


# Parsing costs about 0.9 GB of memory per MB of source; no hand-written training script comes near this.
DEFAULT_MAX_FILE_SIZE = 2_000_000


def screen(path: str, max_file_size: int = DEFAULT_MAX_FILE_SIZE, target: str = "") -> FileOutcome | files.SourceFile:
    """Read a file; what the engine needs to see, or the outcome when it need not (or cannot) see it.

    Only the bytes pre-filter runs here, so screening a tree of files with nothing to migrate costs
    a read per file, and never loads the parser. A file over ``max_file_size`` bytes (0: no limit) that
    would need the parser is refused. Under ``--to ddp`` a script with a main block and no site of its own is
    seen too when it imports a project module that may become a distributed program (its entry point).
    """
    try:
        data, stamp = files.read(path)
        if not might_need_migration(data) and not might_start_a_program(data, target, path):
            return FileOutcome(path, UNCHANGED, markers.marked_in_bytes(path, data))
        if max_file_size and len(data) > max_file_size:
            message = (
                f"not migrated: {_size(len(data))} is over the {_size(max_file_size)} limit "
                "(raise max-file-size in [tool.mgpu-migrate] or --max-file-size)"
            )
            return _failed(path, TOO_LARGE, message)
        return files.source_file(path, data, stamp)
    except (OSError, SyntaxError) as error:
        return _failed(path, READ_ERROR, f"cannot read: {getattr(error, 'strerror', None) or error}")


def _size(count: int) -> str:
    for unit, scale in (("MB", 10**6), ("kB", 10**3)):
        if count >= scale:
            return f"{count / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{count} bytes"


def outside_tree(path: str) -> FileOutcome:
    """A symlink that ``files.discover`` skipped: it leads out of the directory it was found in."""
    message = f"skipped: a symlink to {os.path.realpath(path)}, outside the directory walked"
    return FileOutcome(path, UNCHANGED, [Diagnostic(path, 1, 1, OUTSIDE_TREE, message)])


def changed_on_disk(path: str) -> FileOutcome:
    """A file edited (or migrated by another run) between its read and its write: it is not written."""
    return _failed(path, FILE_CHANGED, "changed on disk while mgpu-migrate ran (an edit, or another run): not written; run again")


def outcome_of(result: MigrationResult, want_diff: bool) -> FileOutcome:
    """What the command line reports for one migrated source, on disk or from stdin."""
    if result.error is not None:
        return FileOutcome(result.path, FAILED, [result.error, *result.diagnostics])
    if not result.changed:
        return FileOutcome(result.path, UNCHANGED, result.diagnostics)
    diff = unified_diff(result.source, result.output, diff_path(result.path)) if want_diff else ""
    return FileOutcome(result.path, CHANGED, result.diagnostics, diff)


@dataclass(frozen=True)
class PendingWrite:
    """A migrated file's new text, to be written once every file of the run has been migrated."""

    source_file: files.SourceFile
    output: str


def migrate_file(
    source_file: files.SourceFile, target: str, write: bool, want_diff: bool, options: Options = DEFAULT_OPTIONS
) -> FileOutcome:
    """Migrate one screened file (and write it). Never raises for a bad file: it comes back as FAILED, untouched."""
    outcome, pending = migrated(source_file, target, write, want_diff, options)
    return written(outcome, pending)


def migrated(
    source_file: files.SourceFile, target: str, write: bool, want_diff: bool, options: Options = DEFAULT_OPTIONS
) -> tuple[FileOutcome, PendingWrite | None]:
    """Migrate one screened file: its outcome as it will be once written, and the write to make (None: nothing to
    write). Never raises for a bad file: it comes back as FAILED."""
    path = source_file.path
    try:
        text = source_file.text
    except (UnicodeDecodeError, LookupError) as error:
        return _failed(path, READ_ERROR, f"cannot read: {error}"), None
    result = migrate_source(text, target, path, options)
    pending = PendingWrite(source_file, result.output) if write and result.changed else None
    return markers.review_notes(outcome_of(result, want_diff), result, written=pending is not None), pending


def written(outcome: FileOutcome, pending: PendingWrite | None) -> FileOutcome:
    """``outcome``, once its file is written (or what stopped the write)."""
    if pending is None:
        return outcome
    source_file = pending.source_file
    try:
        files.write_atomically(source_file.path, pending.output, source_file.encoding, read_as=source_file)
    except files.FileChanged:
        return changed_on_disk(source_file.path)
    except (OSError, UnicodeEncodeError) as error:
        return _failed(source_file.path, READ_ERROR, f"cannot write: {getattr(error, 'strerror', None) or error}")
    return outcome


# A worker pays for its start (its fork, its queue, the first file's one-time costs: ~0.05-0.1 s of CPU,
# and no time saved at all when the cores are busy) only when it takes a quarter of a second of migration
# or more off the main process: some 40 kB of source beside the largest file, which one process migrates
# alone however many there are. A file's fixed costs (its rules, its analysis) weigh as much as ~2 kB of it.
# (Measured on 2 idle cores: Megatron-LM's 8 parsed files, 79 kB beside a 114 kB one, take 1.67 s of wall
# time on two workers and 2.05 s in one process, for 2.09 s and 2.04 s of CPU.)
BYTES_PER_WORKER = 40_000
BYTES_PER_FILE = 2_000
MIN_FILES_PER_WORKER = 2


def workers_for(sizes: Sequence[int], jobs: int) -> int:
    """How many processes to migrate files of these sizes (in bytes) on: 1 (this one) when the work is small."""
    work = [size + BYTES_PER_FILE for size in sizes]
    beside_largest = sum(work) - max(work, default=0)
    return max(1, min(jobs, len(work) // MIN_FILES_PER_WORKER, 1 + beside_largest // BYTES_PER_WORKER))


def process_files(
    paths: Sequence[str],
    target: str,
    write: bool,
    want_diff: bool,
    jobs: int,
    options: Options = DEFAULT_OPTIONS,
    progress: Callable[[int, int], None] = lambda done, total: None,
    max_file_size: int = DEFAULT_MAX_FILE_SIZE,
) -> list[FileOutcome]:
    """Migrate many files, on up to ``jobs`` processes; the outcomes come back in the order of ``paths``.

    Files are screened here first, so worker processes start only when the files that need the parser are
    enough work (``workers_for``); otherwise they are migrated in this process.
    ``progress(done, total)`` hears of each file the parser has finished.

    Every file is migrated before any is written: a file's migration may read another module of the project as
    it is (a trainer module migrates with the script that hands it the model, ``engine.handed_programs``; a
    class's subclasses with it, ``engine.held_programs``), and that module, written first, would read as one
    that no longer needs migrating.
    """
    outcomes = [screen(path, max_file_size, target) for path in paths]
    todo = [index for index, outcome in enumerate(outcomes) if isinstance(outcome, files.SourceFile)]
    migrate = functools.partial(migrated, target=target, write=write, want_diff=want_diff, options=options)
    workers = workers_for([len(outcomes[index].data) for index in todo], jobs)
    run = _map_in_processes if workers > 1 else _map_here
    finished = itertools.count(1)

    def ticked(done: tuple[FileOutcome, PendingWrite | None]) -> tuple[FileOutcome, PendingWrite | None]:
        progress(next(finished), len(todo))
        return done

    with _terminate_as_interrupt():
        done = run(migrate, [outcomes[index] for index in todo], workers, ticked)
        for index, (outcome, pending) in zip(todo, done):
            outcomes[index] = written(outcome, pending)
    return outcomes


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM (a hook runner's timeout, ``kill``) stops a run as Ctrl-C does: writes finished or undone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _map_here(migrate: Callable, source_files: list, workers: int, ticked: Callable) -> list:
    return [ticked(migrate(source_file)) for source_file in source_files]


def _map_in_processes(migrate: Callable, source_files: list, workers: int, ticked: Callable) -> list:
    # Imported here: multiprocessing is a start-up cost a run over a few files never needs.
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    # The parser and the rules, loaded once before the workers fork (where processes fork), rather than
    # once in every worker (~0.4 s each).
    import mgpu_migrate.pipeline  # noqa: F401

    if sys.platform.startswith("linux"):
        import ctypes  # noqa: F401 - for the workers' parent-death signal, so none imports it while signalled

    from mgpu_migrate.started import named_roots

    with ProcessPoolExecutor(max_workers=workers, initializer=_start_worker, initargs=(os.getpid(), named_roots())) as pool:
        outcomes = []
        try:
            with files.interrupts_held():  # a Ctrl-C while the workers fork is raised once they all exist
                futures = [pool.submit(_in_worker, migrate, source_file) for source_file in source_files]
            for source_file, future in zip(source_files, futures):
                try:
                    outcomes.append(ticked(future.result()))
                except BrokenProcessPool:
                    # A worker died (killed for memory, say). Its files were never written: say so, go on.
                    message = "internal error: the process migrating this file stopped; file left unchanged, please report"
                    outcomes.append((_failed(source_file.path, INTERNAL_ERROR, message), None))
        except KeyboardInterrupt:
            _stop_workers(pool, {os.path.dirname(os.path.realpath(source_file.path)) for source_file in source_files})
            raise
        return outcomes


class _WorkerStopped(SystemExit):
    """Raised in a worker by SIGTERM: unwinds its write (the temporary file is removed), then the worker exits."""


_migrating = False
"""Whether this worker is migrating a file (a SIGTERM then unwinds its write before the worker exits)."""


def _start_worker(parent: int, roots: frozenset[str] = frozenset()) -> None:
    """Ctrl-C reaches the whole process group, but stopping is the main process's call (``_stop_workers``);
    SIGTERM, from it or at its death, stops a worker cleanly. ``roots``: the directories named on the command
    line (``started.name_roots``), which a worker that was not forked would not know."""
    from mgpu_migrate.started import name_roots

    name_roots(roots)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Before the parent-death request: a worker forked inside ``interrupts_held`` inherits a handler that only
    # notes the signal, and would live on after a parent that died here.
    signal.signal(signal.SIGTERM, _stop_worker)
    if sys.platform.startswith("linux"):
        import ctypes  # loaded by the parent before forking

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the request above took effect
        os._exit(1)
    # The parent-death signal alone once let a worker live on after its killed parent (CI, under load): a
    # watch that sees the worker orphaned sends it that signal itself, then ends it if it has not acted.
    threading.Thread(target=_watch_parent, args=(parent,), name="mgpu-migrate-parent-watch", daemon=True).start()


_PARENT_WATCH_S = 0.5
_SIGTERM_GRACE_S = 5.0


def _watch_parent(parent: int) -> None:
    import time

    while os.getppid() == parent:
        time.sleep(_PARENT_WATCH_S)
    os.kill(os.getpid(), signal.SIGTERM)  # the main thread unwinds a write under way, as at the parent's SIGTERM
    while True:
        time.sleep(_SIGTERM_GRACE_S)
        if not _migrating:  # a write is unwound by the main thread alone, once its system call returns
            os._exit(128 + signal.SIGTERM)


def _stop_worker(number: int, frame) -> None:
    if _migrating:
        raise _WorkerStopped(128 + number)
    # Between files (waiting for one, sending an outcome back) the pool's own code would catch the exception
    # and take the next file; no write of this worker is under way.
    os._exit(128 + number)


def _in_worker(migrate: Callable, source_file: files.SourceFile) -> tuple[FileOutcome, PendingWrite | None]:
    global _migrating
    try:
        _migrating = True
        try:
            return migrate(source_file)
        finally:
            _migrating = False
    except _WorkerStopped as stopped:  # also one raised in the line above, before it took effect
        os._exit(stopped.code)  # the pool would otherwise take the next file


def _stop_workers(pool, directories: set[str]) -> None:
    """On Ctrl-C: no new file is started; each worker finishes or undoes the file it is writing, and exits. One
    that has not within seconds (an fsync on a loaded disk can take longer) is killed, and the temporary file
    of its write, in one of ``directories``, removed here."""
    workers = list((pool._processes or {}).values())  # the executor offers no public way to stop them
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.join(timeout=5)
        if worker.is_alive():
            worker.kill()
            worker.join()
            files.remove_temporaries(worker.pid, directories)
