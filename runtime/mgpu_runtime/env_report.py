"""``mgpu_runtime env``: one report of what the runtime finds on this machine and what it would do there.

What a bug report needs, as ``accelerate env`` and ``torch.utils.collect_env`` give it: the versions (this
package, Python, torch and its CUDA, cuDNN and NCCL), the devices torch sees, the launcher variables set in
this process's environment, and what ``setup()`` would make of them (launcher, rank and world, device,
backend, a relaunch under torchrun, which ranks print). It only reads: no process group, no relaunch.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

import torch
import torch.distributed as dist

from mgpu_runtime._version import __version__
from mgpu_runtime.distributed import launch, process_group, rank_output
from mgpu_runtime.distributed.environment import SINGLE, LaunchEnvironmentError, detect_environment

# The variables the runtime (or torch under it) reads to place a process, in the order they are shown.
LAUNCHER_VARIABLES = (
    *("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"),
    "TORCHELASTIC_RUN_ID",
    *("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_NODEID", "SLURM_JOB_ID"),
    *("SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE"),
    *("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"),
)
# Every variable with one of these prefixes is shown too: the runtime's own and NCCL's settings.
SETTING_PREFIXES = ("MGPU_", "NCCL_")


def report(environ: Mapping[str, str]) -> str:
    lines = [f"mgpu_runtime {__version__} ({os.path.dirname(os.path.abspath(__file__))})"]
    lines.append(f"Python {platform.python_version()} ({sys.executable}), {platform.platform()}")
    lines += _torch()
    lines += _devices()
    lines.append("Variables:")
    shown = [name for name in LAUNCHER_VARIABLES if name in environ]
    shown += sorted(name for name in environ if name.startswith(SETTING_PREFIXES) and name not in shown)
    lines += [f"  {name}={environ[name]}" for name in shown] or ["  (none of the launchers' or the runtime's)"]
    lines.append("What setup() would do here:")
    lines += [f"  {line}" for line in _plan(environ)]
    return "\n".join(lines) + "\n"


def _torch() -> list[str]:
    cuda = torch.version.cuda or (f"ROCm {torch.version.hip}" if getattr(torch.version, "hip", None) else None)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    nccl = None
    if dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available():
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    backends = [name for name, available in _backends() if available]
    return [
        f"torch {torch.__version__} (CUDA build: {cuda or 'none, a CPU build'}; cuDNN: {cudnn or 'none'}; "
        f"NCCL: {nccl or 'none'})",
        f"Process-group backends: {', '.join(backends) or 'none (torch.distributed is not available)'}",
    ]


def _backends() -> list[tuple[str, bool]]:
    if not dist.is_available():
        return []
    return [("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()), ("mpi", dist.is_mpi_available())]


def _devices() -> list[str]:
    if not torch.cuda.is_available():
        return ["CUDA devices: none visible (the runtime trains on the CPU)"]
    lines = [f"CUDA devices: {torch.cuda.device_count()} visible"]
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        memory = properties.total_memory / 2**30
        lines.append(f"  cuda:{index} {properties.name}, {memory:.1f} GiB, compute capability {properties.major}.{properties.minor}")
    return lines


def _plan(environ: Mapping[str, str]) -> list[str]:
    try:
        environment = detect_environment(environ)
        if environment.launcher == SINGLE:
            count = launch.requested_process_count(environ)
            if count > 1:
                return [
                    "launcher: none (a plain `python train.py`)",
                    launch.relaunch_notice(count, environ).removeprefix("mgpu_runtime: ").replace("relaunching", "would relaunch", 1),
                ]
        timeout = process_group.timeout_seconds(environ)
    except LaunchEnvironmentError as error:
        return [f"setup() would stop: {error}"]
    # The device and backend setup() would choose (binding the device in this short-lived process is harmless).
    device, shares = process_group._bind_device(environment)
    if environment.launcher == SINGLE:
        return ["launcher: none; one process (a world of 1, no network)", f"device: {device}"]
    output = environ.get(rank_output.LOG_VARIABLE, "").strip().lower() or rank_output.DEFAULT_MODE
    return [
        f"launcher: {environment.launcher}; rank {environment.rank} of {environment.world_size} (local rank "
        f"{environment.local_rank} of {environment.local_world_size}, node {environment.node_rank})",
        f"rendezvous: {environment.init_method}"
        + (f" ({environment.master_addr}:{environment.master_port})" if environment.init_method == "env://" else ""),
        f"device: {device}{' (shared with other ranks)' if shares else ''}; backend: "
        f"{process_group._backend(device, shares)}; collectives time out after {timeout:g} s "
        f"({process_group.TIMEOUT_VARIABLE})",
        f"output: {rank_output.LOG_VARIABLE}={output}",
    ]
