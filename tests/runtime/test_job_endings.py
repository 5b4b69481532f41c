"""How a job of several processes ends when a rank fails or a person presses Ctrl-C, under real launches on CPU
(a relaunched ``python train.py``, and torchrun itself); and ``mgpu_runtime env``, the runtime's report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.runtime.test_rank_output import _environment

# Rank 1 writes down when it fails (``failed_at``), in the line before its error's, which stays line 5.
FAILING = """\
import time
import mgpu_runtime
mgpu_runtime.setup()
if mgpu_runtime.rank() == 1 and open("failed_at", "w").write(repr(time.time())):
    raise ValueError("no data for rank one")
time.sleep(120)  # rank 0 is still at work when rank 1 fails: the agent stops it
"""

WAITING = """\
import sys
import time

import mgpu_runtime

mgpu_runtime.setup()
print(f"ready {mgpu_runtime.rank()}", file=sys.stderr, flush=True)
for step in range(1200):
    time.sleep(0.1)
"""

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def _assert_ended_soon_after_the_failure(tmp_path) -> None:
    """The job ended soon after rank 1 failed, counted from the failure (a loaded machine starts a job slowly): the
    failing rank leaves at once, where it used to wait 30 s at exit for its peer, which still sleeps."""
    seconds = time.time() - float((tmp_path / "failed_at").read_text())
    assert seconds < 20, f"the job ended {seconds:.0f}s after rank 1 failed"


def _launch(tmp_path, script: str, command: list[str], **extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "job.py").write_text(script)
    return subprocess.run(
        [*command, "job.py"], cwd=tmp_path, env=_environment(**extra), capture_output=True, text=True, timeout=240
    )


@pytest.mark.slow
def test_a_relaunched_job_ends_with_the_failing_rank_its_exception_and_line(tmp_path):
    result = _launch(tmp_path, FAILING, [sys.executable], MGPU_NPROC="2")
    _assert_ended_soon_after_the_failure(tmp_path)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    # The rank's own traceback, then one line; none of the agent's traceback or progress messages.
    assert "[rank1]: ValueError: no data for rank one" in lines
    assert lines[-1] == (
        f"mgpu_runtime: rank 1 failed with ValueError: no data for rank one ({tmp_path / 'job.py'}, line 5); "
        "exit status 1; the other processes were stopped"
    )
    assert not any("ChildFailedError" in line or "torch/distributed" in line or "OMP_NUM_THREADS" in line for line in lines)


@pytest.mark.slow
def test_under_torchrun_the_failure_block_holds_the_ranks_error_file(tmp_path):
    result = _launch(tmp_path, FAILING, TORCHRUN)
    _assert_ended_soon_after_the_failure(tmp_path)
    assert result.returncode == 1
    root_cause = result.stderr[result.stderr.index("Root Cause (first observed failure)") :]
    assert "rank      : 1 (local_rank: 1)" in root_cause
    error_file = next(line.split(":", 1)[1].strip() for line in root_cause.splitlines() if "error_file:" in line)
    assert error_file.endswith("error.json")  # no longer <N/A>
    assert 'File "job.py", line 5, in <module>' in root_cause or f'File "{tmp_path / "job.py"}", line 5' in root_cause
    assert "ValueError: no data for rank one" in root_cause


# A script's own distributed path (launch_own_path relaunches it), whose rank 1 fails while rank 0 still works.
OWN_PATH_FAILING = """\
import os
import time

import torch.distributed as dist

import mgpu_runtime

mgpu_runtime.launch_own_path("--batch-size", 12)
if "LOCAL_RANK" in os.environ:
    dist.init_process_group("gloo")
    if dist.get_rank() == 1 and open("failed_at", "w").write(repr(time.time())):
        raise ValueError("no data for rank one")
time.sleep(120)
"""


@pytest.mark.slow
def test_a_failing_rank_of_the_scripts_own_path_ends_the_job_at_once(tmp_path):
    """Its exit does not wait for the peers to leave too (as it does after a good end: leaving.py)."""
    result = _launch(tmp_path, OWN_PATH_FAILING, [sys.executable], MGPU_NPROC="2")
    _assert_ended_soon_after_the_failure(tmp_path)
    assert result.returncode == 1 and "ValueError: no data for rank one" in result.stderr, result.stderr[-3000:]


def _interrupted(tmp_path, command: list[str], **extra: str) -> tuple[int, list[str]]:
    """Start the waiting job in a session of its own, and once both ranks are ready send SIGINT to its whole
    process group, as a terminal's Ctrl-C does."""
    (tmp_path / "job.py").write_text(WAITING)
    job = subprocess.Popen(
        [*command, "job.py"], cwd=tmp_path, env=_environment(**extra), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 180
        while sum(line.startswith("ready") for line in lines) < 2 and time.monotonic() < deadline:
            line = job.stderr.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
        assert sum(line.startswith("ready") for line in lines) == 2, lines
        os.killpg(job.pid, signal.SIGINT)
        rest = job.communicate(timeout=90)[1]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return job.returncode, lines + rest.splitlines()


@pytest.mark.slow
def test_ctrl_c_ends_every_rank_quietly_with_one_line(tmp_path):
    status, lines = _interrupted(tmp_path, [sys.executable], MGPU_NPROC="2")
    assert status == 128 + signal.SIGINT
    said = [line for line in lines if not line.startswith(("ready", "mgpu_runtime: relaunching"))]
    assert said == ["mgpu_runtime: stopped by Ctrl-C: every process of the job has ended"]


@pytest.mark.slow
def test_under_torchrun_the_ranks_print_no_traceback_on_ctrl_c(tmp_path):
    status, lines = _interrupted(tmp_path, TORCHRUN)
    assert status != 0
    # torchrun's agent still says it was signalled; the ranks themselves add nothing.
    assert not any(line.startswith("[rank") or "KeyboardInterrupt" in line and "job.py" in line for line in lines)
    assert not any('File "job.py"' in line or "job.py\", line" in line for line in lines)


def _env_report(**extra: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "mgpu_runtime", "env"], env=_environment(**extra), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_env_reports_the_versions_the_devices_and_a_single_process():
    import torch

    import mgpu_runtime

    lines = _env_report()
    assert lines[0].startswith(f"mgpu_runtime {mgpu_runtime.__version__} ")
    assert any(line.startswith(f"torch {torch.__version__} (CUDA build: ") and "NCCL: " in line for line in lines)
    assert "CUDA devices: none visible (the runtime trains on the CPU)" in lines  # CUDA_VISIBLE_DEVICES=""
    assert "  CUDA_VISIBLE_DEVICES=" in lines
    assert lines[-2:] == ["  launcher: none; one process (a world of 1, no network)", "  device: cpu"]


def test_env_says_what_setup_would_do_with_the_launchers_variables():
    torchrun = _env_report(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511", MGPU_LOG="prefix")
    assert "  RANK=1" in torchrun and "  MGPU_LOG=prefix" in torchrun
    assert "  launcher: torchrun; rank 1 of 2 (local rank 1 of 2, node 0)" in torchrun
    assert "  rendezvous: env:// (127.0.0.1:29511)" in torchrun
    assert "  output: MGPU_LOG=prefix" in torchrun
    assert any(line.startswith("  device: cpu; backend: gloo;") for line in torchrun)

    slurm = _env_report(SLURM_PROCID="3", SLURM_LOCALID="1", SLURM_NTASKS="4", SLURM_NODEID="1",
                        SLURM_JOB_NODELIST="gpu[07-08]", SLURM_JOB_ID="1234", SLURM_TASKS_PER_NODE="2(x2)")
    assert "  launcher: slurm; rank 3 of 4 (local rank 1 of 2, node 1)" in slurm
    assert "  rendezvous: tcp://gpu07:16234" in slurm

    plain = _env_report(MGPU_NPROC="3")
    assert plain[-1].startswith("  would relaunch under torchrun as 3 processes on the CPU (gloo) (MGPU_NPROC=3)")

    half_set = _env_report(RANK="1")
    assert half_set[-1].startswith("  setup() would stop: RANK is set but LOCAL_RANK, WORLD_SIZE are not")


def test_the_installed_command_is_the_same_report():
    from shutil import which

    if which("mgpu_runtime") is None:
        pytest.skip("the mgpu-runtime distribution is not installed (pip install -e ./runtime)")
    result = subprocess.run(["mgpu_runtime", "env"], env=_environment(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "  device: cpu"
