"""A parallel in-place run stopped by a real signal: Ctrl-C (SIGINT to the whole process group, as a terminal
sends it) or SIGTERM ends it at once, every file old or new, no temporary left; SIGKILL of the main process
takes its workers with it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from mgpu_migrate.engine import migrate_source
from tests.cli_helpers import DP_SCRIPT, command

FILES = 300
STOP_WITHIN_S = 15


def _tree(directory):
    sources = {}
    for index in range(FILES):
        path = directory / f"train_{index:03d}.py"
        path.write_text(DP_SCRIPT + f"step = {index}\n")
        sources[path] = path.read_text()
    return sources


def _as_in_a_terminal():
    """In the child, before it runs: Ctrl-C interrupts, as in a terminal, even where the tests were started with it
    ignored (a shell's background job inherits SIGINT ignored, and Python then installs no KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(directory):
    return subprocess.Popen(
        [*command(), "--to", "ddp", "-j", "2", "."],
        cwd=directory,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, like a job in a terminal
        preexec_fn=_as_in_a_terminal,
    )


def _wait_until_some_file_is_rewritten(run, sources):
    """Wait for the first rewritten file; the workers seen on the way back. Every file is migrated before any is
    written (``report.process_files``), so by then the workers may be gone: they must stay gone."""
    deadline = time.monotonic() + 60
    seen = set()
    while all(path.read_text() == source for path, source in sources.items()):
        assert time.monotonic() < deadline and run.poll() is None, "no file was rewritten"
        seen.update(_children(run.pid))
        time.sleep(0.01)
    return seen


def _wait_for_the_workers(run, count):
    """The workers once ``count`` of them are migrating (no file is written before they are all done)."""
    deadline = time.monotonic() + 60
    while len(workers := _children(run.pid)) < count:
        assert time.monotonic() < deadline and run.poll() is None, f"{count} workers never ran at once"
        time.sleep(0.002)
    return workers


def _stat(pid):
    """The fields of /proc/PID/stat after the command's name: [0] the state, [1] the parent, [19] the start time."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _children(pid):
    """The live children of pid, each as (pid, start time): once a worker is gone, its pid may be another
    process's (a busy machine goes through 32768 pids in minutes), which must not pass for the worker."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(entry)
            if fields and int(fields[1]) == pid and fields[0] != "Z":
                found.append((int(entry), fields[19]))
    return found


def _alive(process):
    pid, started = process
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and fields[19] == started


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc for the workers")
@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_a_signal_ends_a_parallel_run_at_once_with_every_file_old_or_new(tmp_path, signal_number):
    sources = _tree(tmp_path)
    migrated = {path: migrate_source(source, "ddp", str(path)).output for path, source in sources.items()}
    run = _start(tmp_path)
    workers = _wait_until_some_file_is_rewritten(run, sources) | set(_children(run.pid))
    assert workers, "the run took no workers"
    if signal_number == signal.SIGINT:
        os.killpg(run.pid, signal.SIGINT)
    else:
        run.send_signal(signal.SIGTERM)
    try:
        run.communicate(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        pytest.fail(f"the run did not stop within {STOP_WITHIN_S}s of the signal")
    assert run.returncode != 0
    assert not [worker for worker in workers if _alive(worker)], "workers outlived the run"
    old = new = 0
    for path, source in sources.items():
        content = path.read_text()
        assert content in (source, migrated[path]), f"{path.name} is neither the old file nor the new one"
        old, new = old + (content == source), new + (content == migrated[path])
    assert new > 0 and old > 0, (old, new)  # it really stopped in the middle
    assert sorted(os.listdir(tmp_path)) == sorted(path.name for path in sources), "temporary files were left"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc for the workers")
def test_ctrl_c_while_the_workers_start_aborts_instead_of_failing_every_file(tmp_path):
    """Workers that caught the Ctrl-C themselves used to die, and every file was reported as an internal error
    (MGP003, exit 2); or, caught in the wrong moment, it was lost and the run went on to the end."""
    sources = _tree(tmp_path)
    run = _start(tmp_path)
    _wait_for_the_workers(run, 1)
    os.killpg(run.pid, signal.SIGINT)
    _, stderr = run.communicate(timeout=STOP_WITHIN_S)
    assert run.returncode == 1 and stderr.strip().endswith(b"Aborted!"), stderr[-2000:]
    assert b"MGP003" not in stderr and b"Traceback" not in stderr
    assert sorted(os.listdir(tmp_path)) == sorted(path.name for path in sources)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc for the workers")
def test_workers_die_with_a_killed_main_process(tmp_path):
    sources = _tree(tmp_path)
    run = _start(tmp_path)
    workers = _wait_for_the_workers(run, 2)
    run.kill()
    run.communicate(timeout=STOP_WITHIN_S)
    deadline = time.monotonic() + STOP_WITHIN_S
    while any(_alive(worker) for worker in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [worker for worker in workers if _alive(worker)]
    for pid, _ in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, "workers outlived their killed parent"
    for path, source in sources.items():
        assert path.read_text() == source or "mgpu_runtime" in path.read_text()


# A pool of one worker whose outcomes are slow to send back (pickled): the worker is between files, in the
# pool's own code, when the signal comes. That code catches whatever the signal raises and takes the next file;
# the worker lived on after its killed parent (waiting for files forever), or after the main process's stop.
_SLOW_TO_SEND = """
import os, pathlib, sys, time, types
from mgpu_migrate import report

class SlowToSend:
    def __reduce__(self):
        pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))
        time.sleep(60)
        return (SlowToSend, ())

def migrate(source_file):
    if sys.argv[2] == "without_the_death_signal":  # the kernel's signal cleared: the worker's own watch must act
        import ctypes
        ctypes.CDLL(None).prctl(1, 0)  # PR_SET_PDEATHSIG
    return SlowToSend()

report._map_in_processes(migrate, [types.SimpleNamespace(path=str(n)) for n in range(4)], 1, lambda outcome: outcome)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("stopped_by", ["parent_killed", "parent_killed_without_the_death_signal", "sigterm"])
def test_a_worker_sending_an_outcome_back_stops_at_the_signal(tmp_path, stopped_by):
    sending = tmp_path / "sending"
    (tmp_path / "pool.py").write_text(_SLOW_TO_SEND)
    death_signal = "without_the_death_signal" if stopped_by.endswith("without_the_death_signal") else "kept"
    parent = subprocess.Popen(
        [sys.executable, "pool.py", str(sending), death_signal], cwd=tmp_path, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while not sending.exists() or not sending.read_text():
            assert time.monotonic() < deadline and parent.poll() is None, "the worker sent nothing"
            time.sleep(0.01)
        (worker,) = _children(parent.pid)
        assert worker[0] == int(sending.read_text())
        if stopped_by.startswith("parent_killed"):
            parent.kill()
        else:
            os.kill(worker[0], signal.SIGTERM)
        deadline = time.monotonic() + STOP_WITHIN_S
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.02)
        survived = _alive(worker)
        if survived:
            os.kill(worker[0], signal.SIGKILL)
        assert not survived, "the worker lived on after the signal"
    finally:
        parent.kill()
        parent.wait()


# A worker that does not act on the main process's SIGTERM while its temporary file exists (as one inside an
# fsync of a loaded disk, which no signal interrupts): the main process kills it after its grace and removes
# what it left. Such a worker, killed, left a .mgpu-migrate-*.tmp behind (seen once in a full suite under load).
_STUCK_IN_A_WRITE = """
import os, pathlib, signal, sys, time, types
from mgpu_migrate import files, report

def migrate(source_file):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    directory = os.path.dirname(os.path.realpath(source_file.path))
    name = files.temporary_prefix(os.getpid()) + "stuck" + files.TEMPORARY_SUFFIX
    pathlib.Path(directory, name).write_text("half a rewrite")
    pathlib.Path(sys.argv[1]).write_text(name)
    time.sleep(60)

paths = [os.path.join(sys.argv[2], f"train_{n}.py") for n in range(2)]
report._map_in_processes(migrate, [types.SimpleNamespace(path=path) for path in paths], 1, lambda outcome: outcome)
"""


@pytest.mark.slow
def test_a_worker_killed_in_its_write_leaves_no_temporary_file(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    started = tmp_path / "started"
    (tmp_path / "pool.py").write_text(_STUCK_IN_A_WRITE)
    parent = subprocess.Popen(
        [sys.executable, "pool.py", str(started), str(tree)],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_as_in_a_terminal,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists() or not started.read_text():
            assert time.monotonic() < deadline and parent.poll() is None, "the worker wrote nothing"
            time.sleep(0.01)
        assert os.listdir(tree) == [started.read_text()]
        os.killpg(parent.pid, signal.SIGINT)
        parent.communicate(timeout=STOP_WITHIN_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    assert os.listdir(tree) == [], "the killed worker's temporary file was left"
