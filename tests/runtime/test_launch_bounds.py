"""Every launch variable that is out of bounds is named in its error, before torch or torchrun sees it."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from mgpu_runtime.distributed.environment import LaunchEnvironmentError, detect_environment
from mgpu_runtime.distributed.launch import requested_process_count
from tests.runtime.test_distributed_launches import _clean_environment

TORCHRUN_2 = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("port", ["99999", "65536", "0"])
def test_a_port_out_of_range_is_named(port):
    with pytest.raises(LaunchEnvironmentError, match=f"MASTER_PORT={port} is (above 65535|below 1)"):
        detect_environment({**TORCHRUN_2, "MASTER_PORT": port})
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    with pytest.raises(LaunchEnvironmentError, match="MASTER_PORT"):
        detect_environment({**slurm, "SLURM_JOB_NODELIST": "n1", "MASTER_PORT": port})


def test_a_process_count_no_machine_can_run_is_named():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert requested_process_count({"MGPU_NPROC": str(4 * cores)}) == 4 * cores
    with pytest.raises(LaunchEnvironmentError, match="MGPU_NPROC=100000 is more processes than this machine can run"):
        requested_process_count({"MGPU_NPROC": "100000"})


SETUP = "import mgpu_runtime; mgpu_runtime.setup(); print('joined')"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("environment", "named"),
    [
        ({**TORCHRUN_2, "MASTER_PORT": "99999"}, "MASTER_PORT=99999 is above 65535"),
        ({**TORCHRUN_2, "MASTER_ADDR": "no-such-host.invalid"}, "MASTER_ADDR='no-such-host.invalid' does not resolve"),
        ({"MGPU_NPROC": "100000"}, "MGPU_NPROC=100000 is more processes than this machine can run"),
        ({"MGPU_TIMEOUT": "soon", **TORCHRUN_2}, "MGPU_TIMEOUT='soon' must be a positive number of seconds"),
    ],
    ids=["port", "address", "nproc", "timeout"],
)
def test_a_script_started_with_a_bad_variable_stops_at_once_naming_it(environment, named):
    result = subprocess.run(
        [sys.executable, "-c", SETUP], env=_clean_environment(**environment), capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode != 0 and "joined" not in result.stdout
    assert f"LaunchEnvironmentError: {named}" in result.stderr


@pytest.fixture
def foreign_listener():
    """Another program's socket on a port: it accepts every connection and never says a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted = []

    def accept_forever():
        with contextlib.suppress(OSError):  # closed at the end of the test
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=accept_forever, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()
    for connection in accepted:
        connection.close()


def _slurm_task(rank: int, port: int) -> subprocess.Popen:
    environment = {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NTASKS": "2", "SLURM_NODEID": "0"}
    environment.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), MGPU_TIMEOUT="5")
    return subprocess.Popen(
        [sys.executable, "-c", SETUP], env=_clean_environment(**environment), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )


@pytest.mark.slow
def test_a_rendezvous_port_held_by_another_program_ends_every_rank_naming_it(foreign_listener):
    """Rank 0 failed at once in torch's words (EADDRINUSE); rank 1 connected to the foreign listener and waited,
    silent past 12 x MGPU_TIMEOUT (srun kills nothing by default: the job waited for its time limit)."""
    started = time.monotonic()
    tasks = [_slurm_task(rank, foreign_listener) for rank in (0, 1)]
    outputs = [task.communicate(timeout=120)[0] for task in tasks]
    assert all(task.returncode != 0 for task in tasks) and "joined" not in "".join(outputs)
    assert f"LaunchEnvironmentError: MASTER_PORT={foreign_listener} is in use on 127.0.0.1 by another program" in outputs[0]
    assert (
        f"LaunchEnvironmentError: rank 1 could not join the job's store at 127.0.0.1:{foreign_listener} (MASTER_ADDR, "
        "MASTER_PORT) within MGPU_TIMEOUT=5 s: a program there accepts connections but does not answer as torch's store"
    ) in outputs[1]
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_a_rank_whose_rank_0_never_comes_ends_at_mgpu_timeout_naming_the_address():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free once closed: nobody listens there
    task = _slurm_task(1, port)
    output = task.communicate(timeout=120)[0]
    assert task.returncode != 0
    assert f"rank 1 could not join the job's store at 127.0.0.1:{port} (MASTER_ADDR, MASTER_PORT) within MGPU_TIMEOUT=5 s: nothing answers there" in output
