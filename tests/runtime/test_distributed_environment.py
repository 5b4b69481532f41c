"""Reading the launch environment: torchrun, SLURM, a plain process, and half-set environments' errors.

All pure: the environment is a dictionary, nothing is launched or joined.
"""

from __future__ import annotations

import pytest
import torch
from mgpu_runtime.distributed.environment import (
    LaunchEnvironmentError,
    detect_environment,
    first_host,
    tasks_on_node,
)
from mgpu_runtime.distributed import process_group
from mgpu_runtime.distributed.launch import requested_process_count, torchrun_command
from mgpu_runtime.distributed.slicing import spans

TORCHRUN = {
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.7",
    "MASTER_PORT": "29500",
}
SLURM = {
    "SLURM_PROCID": "6",
    "SLURM_LOCALID": "2",
    "SLURM_NTASKS": "8",
    "SLURM_NODEID": "1",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_JOB_NODELIST": "gpu-node[07-08]",
    "SLURM_JOB_ID": "123456",
}


class TestTorchrun:
    def test_reads_every_variable(self):
        environment = detect_environment(TORCHRUN)
        assert (environment.launcher, environment.rank, environment.local_rank) == ("torchrun", 5, 1)
        assert (environment.world_size, environment.local_world_size, environment.node_rank) == (8, 4, 1)
        assert (environment.master_addr, environment.master_port) == ("10.0.0.7", 29500)

    def test_joins_through_torchruns_own_store(self):
        assert detect_environment(TORCHRUN).init_method == "env://"

    def test_node_and_node_size_default_from_the_ranks(self):
        """A hand-made environment without LOCAL_WORLD_SIZE / GROUP_RANK is one node."""
        environment = detect_environment(
            {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234"}
        )
        assert (environment.node_rank, environment.local_world_size) == (0, 2)

    def test_a_world_of_one_needs_no_address(self):
        environment = detect_environment({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
        assert environment.world_size == 1 and environment.master_port is None

    def test_wins_over_slurm(self):
        """torchrun started inside a SLURM allocation: the workers' coordinates are torchrun's."""
        assert detect_environment({**SLURM, **TORCHRUN}).launcher == "torchrun"


class TestSlurm:
    def test_reads_every_variable(self):
        environment = detect_environment(SLURM)
        assert (environment.launcher, environment.rank, environment.local_rank) == ("slurm", 6, 2)
        assert (environment.world_size, environment.local_world_size, environment.node_rank) == (8, 4, 1)

    def test_master_is_the_first_host_and_the_port_follows_the_job(self):
        environment = detect_environment(SLURM)
        assert environment.master_addr == "gpu-node07"
        assert environment.master_port == 15000 + 123456 % 10000
        assert environment.init_method == "tcp://gpu-node07:18456"

    def test_master_variables_override(self):
        environment = detect_environment({**SLURM, "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "4321"})
        assert (environment.master_addr, environment.master_port) == ("10.1.1.1", 4321)

    def test_the_steps_own_variables_come_first(self):
        """``srun -n 2`` inside an 8-task job: the step, not the job, is the world."""
        environment = detect_environment(
            {
                **SLURM,
                "SLURM_PROCID": "1",
                "SLURM_LOCALID": "1",
                "SLURM_NODEID": "0",
                "SLURM_STEP_NUM_TASKS": "2",
                "SLURM_STEP_TASKS_PER_NODE": "2",
                "SLURM_STEP_NODELIST": "b[3-4]",
            }
        )
        assert (environment.world_size, environment.local_world_size, environment.master_addr) == (2, 2, "b3")

    def test_a_single_task_needs_no_address(self):
        environment = detect_environment(
            {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "SLURM_NODEID": "0"}
        )
        assert environment.world_size == 1 and environment.master_addr is None


@pytest.mark.parametrize(
    ("node_list", "host"),
    [
        ("node01", "node01"),
        ("node01,node02", "node01"),
        ("node[01-04,07]", "node01"),
        ("node[07,01-04]", "node07"),
        ("gpu-a[3,5],gpu-b1", "gpu-a3"),
        ("rack[1-2]-n[07-09]", "rack1-n07"),
        ("host-[001-003]-ib", "host-001-ib"),
    ],
)
def test_first_host_of_a_node_list(node_list, host):
    assert first_host(node_list) == host


@pytest.mark.parametrize("node_list", ["node[1-2", "node1]", "node[1-2]]", "node[1-[2]]"])
def test_a_malformed_node_list_is_an_error_not_a_guess(node_list):
    """`node[1-2` gave the master `node`: every rank then waited for a host that does not exist."""
    with pytest.raises(LaunchEnvironmentError, match=r"is malformed at .*: set MASTER_ADDR to the first node's address"):
        first_host(node_list)


@pytest.mark.parametrize(("text", "node", "tasks"), [("4", 0, 4), ("2(x3),1", 2, 2), ("2(x3),1", 3, 1), ("1,3", 1, 3)])
def test_tasks_on_a_node(text, node, tasks):
    assert tasks_on_node(text, node) == tasks


class TestHalfSetEnvironments:
    @pytest.mark.parametrize(
        ("environ", "names"),
        [
            ({"RANK": "0"}, ["LOCAL_RANK", "WORLD_SIZE", "torchrun --nproc_per_node"]),
            ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, ["WORLD_SIZE=2", "MASTER_ADDR", "MASTER_PORT"]),
            ({"LOCAL_RANK": "0", "WORLD_SIZE": "2"}, ["RANK is not"]),
            ({"SLURM_PROCID": "0"}, ["SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "srun"]),
            ({k: v for k, v in SLURM.items() if k != "SLURM_JOB_NODELIST"}, ["node list", "MASTER_ADDR"]),
            ({k: v for k, v in SLURM.items() if k != "SLURM_JOB_ID"}, ["MASTER_PORT"]),
        ],
    )
    def test_says_what_is_missing_and_how_to_fix_it(self, environ, names):
        with pytest.raises(LaunchEnvironmentError) as raised:
            detect_environment(environ)
        for name in names:
            assert name in str(raised.value)

    @pytest.mark.parametrize(
        ("change", "words"),
        [
            ({"RANK": "8"}, "RANK=8 is not below the world size 8"),
            ({"LOCAL_RANK": "4"}, "LOCAL_RANK=4 is not below the 4 processes"),
            ({"WORLD_SIZE": "eight"}, "WORLD_SIZE='eight' is not a whole number"),
            ({"RANK": "-1"}, "RANK=-1 is below 0"),
        ],
    )
    def test_contradictions_are_errors(self, change, words):
        with pytest.raises(LaunchEnvironmentError, match=words):
            detect_environment({**TORCHRUN, **change})


def test_no_launcher_is_a_single_process():
    environment = detect_environment({"PATH": "/usr/bin"})
    assert (environment.launcher, environment.rank, environment.world_size) == ("single", 0, 1)


class TestRelaunch:
    @pytest.mark.parametrize(("value", "count"), [("2", 2), ("1", 1), (" 3 ", 3)])
    def test_mgpu_nproc_asks_for_processes(self, value, count):
        assert requested_process_count({"MGPU_NPROC": value}) == count

    def test_without_it_one_process_per_visible_gpu(self):
        assert requested_process_count({}) == max(1, torch.cuda.device_count())

    def test_gpus_the_script_chose_are_one_process_each(self):
        expected = 2 if torch.cuda.is_available() else 1  # no GPU: one process, whatever was chosen
        assert requested_process_count({}, (2, 3)) == expected
        assert requested_process_count({"MGPU_NPROC": "3"}, (2, 3)) == 3


class TestChosenDevices:
    """``setup(devices=...)``: a DataParallel's device_ids, kept as the GPUs the processes run on."""

    @pytest.mark.parametrize(
        ("devices", "chosen"),
        [([2, 3], (2, 3)), ("2,3", (2, 3)), (["1", " 0"], (1, 0)), ((torch.device("cuda:3"),), (3,)), (None, None)],
    )
    def test_the_spellings_of_a_choice(self, devices, chosen):
        assert process_group.chosen_devices(devices) == chosen

    @pytest.mark.parametrize("devices", [[], "", ["-1"], [torch.device("cuda")]])
    def test_no_gpu_is_an_error(self, devices):
        with pytest.raises((LaunchEnvironmentError, ValueError)):
            process_group.chosen_devices(devices)

    def test_local_ranks_take_the_chosen_gpus_in_turn(self):
        assert [process_group.device_index(rank, 8, (2, 5)) for rank in range(3)] == [2, 5, 2]
        assert [process_group.device_index(rank, 2, None) for rank in range(3)] == [0, 1, 0]
        with pytest.raises(LaunchEnvironmentError, match="GPU 4, but only 2 are visible"):
            process_group.device_index(0, 2, (4,))

    @pytest.mark.parametrize("value", ["0", "two", "-1"])
    def test_nonsense_is_an_error(self, value):
        with pytest.raises(LaunchEnvironmentError, match="MGPU_NPROC"):
            requested_process_count({"MGPU_NPROC": value})

    def test_the_command_reruns_the_original_command_line(self):
        command = torchrun_command(4, "/usr/bin/python3", ["python3", "-X", "dev", "-m", "pkg.train", "--lr", "0.1"])
        assert command[:5] == ["/usr/bin/python3", "-m", "mgpu_runtime.distributed.agent", "--standalone", "--nproc_per_node=4"]
        assert command[5:] == ["--no-python", "/usr/bin/python3", "-u", "-X", "dev", "-m", "pkg.train", "--lr", "0.1"]


@pytest.mark.parametrize(("total", "parts"), [(8, 2), (8, 3), (5, 3), (4, 3), (6, 4), (2, 3), (1, 4), (0, 2), (23, 4)])
def test_spans_cut_as_dataparallel_chunks(total, parts):
    """Rank r holds DataParallel's chunk r (4 rows over 3: 2, 2 and none, never a 1-row BatchNorm batch)."""
    rows = torch.arange(total)
    chunks = [piece.tolist() for piece in rows.chunk(parts)] if total else []
    assert [rows[start:stop].tolist() for start, count, _ in spans(total, parts) for stop in [start + count]] == chunks + [[]] * (
        parts - len(chunks)
    )
