"""``mgpu_runtime.save``: the checkpoint on disk is always the old one or the complete new one, whatever
happens to the save (a planted symlink, a concurrent saver, an exception, Ctrl-C, SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import mgpu_runtime
from tests.runtime.test_distributed_launches import _clean_environment

CHILD_TIMEOUT = 120


def test_a_symlink_planted_at_the_old_temporary_name_is_not_written_through(tmp_path):
    """The old name was `.{name}.{pid}.tmp`, opened following symlinks: anyone could predict and redirect it."""
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file\n")
    (tmp_path / f".ckpt.pt.{os.getpid()}.tmp").symlink_to(victim)
    mgpu_runtime.save({"step": 1}, tmp_path / "ckpt.pt")
    assert victim.read_text() == "someone else's file\n"
    assert torch.load(tmp_path / "ckpt.pt") == {"step": 1}


def test_a_symlink_at_the_destination_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file\n")
    (tmp_path / "ckpt.pt").symlink_to(victim)
    mgpu_runtime.save({"step": 1}, tmp_path / "ckpt.pt")
    assert victim.read_text() == "someone else's file\n"
    assert not (tmp_path / "ckpt.pt").is_symlink() and torch.load(tmp_path / "ckpt.pt") == {"step": 1}


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_a_save_that_fails_keeps_the_old_checkpoint_and_leaves_nothing(tmp_path):
    mgpu_runtime.save({"step": 1}, tmp_path / "ckpt.pt")
    os.chmod(tmp_path / "ckpt.pt", 0o640)
    with pytest.raises(RuntimeError, match="cannot pickle"):
        mgpu_runtime.save({"step": 2, "bad": Unpicklable()}, tmp_path / "ckpt.pt")
    assert torch.load(tmp_path / "ckpt.pt") == {"step": 1}
    assert os.listdir(tmp_path) == ["ckpt.pt"]
    mgpu_runtime.save({"step": 3}, tmp_path / "ckpt.pt")
    assert os.stat(tmp_path / "ckpt.pt").st_mode & 0o777 == 0o640  # a new save keeps the checkpoint's mode


# Saves {"step": 1}, then a checkpoint whose pickling stops for a minute (time to signal it mid-save).
SLOW_SAVER = """
import sys, time
import torch
import mgpu_runtime

class Slow:
    def __reduce__(self):
        print("saving", flush=True)
        time.sleep(60)
        return (int, (0,))

mgpu_runtime.save({"step": 1}, sys.argv[1])
mgpu_runtime.save({"step": 2, "weights": torch.ones(1000), "slow": Slow()}, sys.argv[1])
"""


def _interrupted_save(path, signal_number):
    child = subprocess.Popen(
        [sys.executable, "-c", SLOW_SAVER, str(path)],
        env=_clean_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C interrupts in the child even where the tests run with SIGINT ignored (a shell's background job)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert child.stdout.readline() == "saving\n"
        child.send_signal(signal_number)
        child.wait(timeout=CHILD_TIMEOUT)
    finally:
        child.kill()
        child.communicate()
    return child.returncode


@pytest.mark.slow
def test_ctrl_c_during_a_save_keeps_the_old_checkpoint_and_leaves_no_temporary(tmp_path):
    assert _interrupted_save(tmp_path / "ckpt.pt", signal.SIGINT) != 0
    assert torch.load(tmp_path / "ckpt.pt") == {"step": 1}
    assert os.listdir(tmp_path) == ["ckpt.pt"]


@pytest.mark.slow
def test_a_killed_save_keeps_the_old_checkpoint_and_the_next_save_sweeps_its_leftover(tmp_path):
    assert _interrupted_save(tmp_path / "ckpt.pt", signal.SIGKILL) == -signal.SIGKILL
    assert torch.load(tmp_path / "ckpt.pt") == {"step": 1}
    [leftover] = [name for name in os.listdir(tmp_path) if name != "ckpt.pt"]
    assert leftover.startswith(".ckpt.pt.")
    past = time.time() - 60  # as it would be a minute later
    os.utime(tmp_path / leftover, (past, past))
    mgpu_runtime.save({"step": 3}, tmp_path / "ckpt.pt")
    assert os.listdir(tmp_path) == ["ckpt.pt"]


# Saves N checkpoints to one path, loading after each save: a mixed or truncated file fails the load.
SAVER = """
import sys
import torch
import mgpu_runtime

path, me = sys.argv[1], int(sys.argv[2])
for step in range(40):
    mgpu_runtime.save({"who": me, "step": step, "weights": torch.full((20000,), float(me))}, path)
    loaded = torch.load(path)
    assert loaded["weights"].eq(loaded["who"]).all(), loaded
"""


@pytest.mark.slow
def test_two_jobs_saving_one_path_always_leave_a_loadable_checkpoint(tmp_path):
    path = tmp_path / "ckpt.pt"
    savers = [
        subprocess.Popen([sys.executable, "-c", SAVER, str(path), str(me)], env=_clean_environment(), stderr=subprocess.PIPE)
        for me in (1, 2)
    ]
    errors = [saver.communicate(timeout=CHILD_TIMEOUT)[1] for saver in savers]
    assert [saver.returncode for saver in savers] == [0, 0], errors
    assert os.listdir(tmp_path) == ["ckpt.pt"]


# A checkpoint of 400 kB under a file-size limit of 100 kB, over an old one of a few bytes.
OVER_THE_LIMIT = """
import resource, sys
import torch
import mgpu_runtime
mgpu_runtime.save({"step": 1}, sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
try:
    mgpu_runtime.save({"weights": torch.zeros(100_000)}, sys.argv[1])
except OSError as error:
    print("OSError:", error)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="no ulimit")
def test_a_save_past_ulimit_f_says_file_too_large_and_keeps_the_old_checkpoint(tmp_path):
    """torch's own error there is `enforce fail at inline_container.cc:672 . unexpected pos`."""
    result = subprocess.run(
        [sys.executable, "-c", OVER_THE_LIMIT, str(tmp_path / "ckpt.pt")],
        env=_clean_environment(MGPU_NPROC="1"), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"OSError: [Errno 27] cannot save the checkpoint: File too large: '{tmp_path / 'ckpt.pt'}'"
    assert torch.load(tmp_path / "ckpt.pt") == {"step": 1}
    assert os.listdir(tmp_path) == ["ckpt.pt"]
