"""Every launch variable that is out of bounds is named in its error, before torch or torchrun sees it."""

from __future__ import annotations

import os
import subprocess
import sys

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
