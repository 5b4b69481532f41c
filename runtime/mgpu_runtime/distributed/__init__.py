"""The distributed runtime: one process per device, computing what the DataParallel original computed.

Modules, one idea each: ``environment`` (where this process sits, read from torchrun / SLURM / nothing),
``launch`` (relaunching a plain ``python train.py`` under torchrun), ``own_path`` (relaunching a script's own
distributed path from a plain start, with the original's global batch), ``process_group`` (setup, device,
backend, teardown), ``ddp`` (the DDP wrapper and its exact gradient reduction), ``share`` (this rank's share
of the current global batch), ``data`` and ``slicing`` (the distributed twin of a DataLoader), ``losses``
(``DistributedCriterion``), ``io`` (``save``/``load``), ``once`` (writers on the main process only:
``on_main_process``, ``main_process_only``, ``main_process_first``), ``metrics`` (reductions across ranks), ``rank_output``
(``MGPU_LOG``, ``print_once``), ``readings`` (``main_process_value``: a clock reading that names things
the same on every process), ``together`` (``fail_together``: a step that fails on one process fails on all) and
``safety`` (the first step of a multi-process run: drifted weights, differing whole batches, an unwrapped
model). See ``runtime/README_distributed.md``.
"""

from mgpu_runtime.distributed.data import distribute_loader, distribute_loaders
from mgpu_runtime.distributed.ddp import DistributedDataParallel
from mgpu_runtime.distributed.functional import data_parallel
from mgpu_runtime.distributed.io import load, save
from mgpu_runtime.distributed.losses import DistributedCriterion
from mgpu_runtime.distributed.metrics import reduce_mean, reduce_sum
from mgpu_runtime.distributed.own_path import launch_own_path, leave_to_own_path
from mgpu_runtime.distributed.once import MainProcessOnly, main_process_first, main_process_only, on_main_process
from mgpu_runtime.distributed.rank_output import print_once
from mgpu_runtime.distributed.readings import main_process_value, wait_for_main_process
from mgpu_runtime.distributed.together import fail_together
from mgpu_runtime.distributed.process_group import (
    barrier,
    device,
    is_initialized,
    is_main_process,
    local_rank,
    node_rank,
    rank,
    setup,
    world_size,
)

__all__ = [
    "data_parallel",
    "DistributedCriterion",
    "DistributedDataParallel",
    "MainProcessOnly",
    "barrier",
    "device",
    "distribute_loader",
    "distribute_loaders",
    "is_initialized",
    "is_main_process",
    "launch_own_path",
    "leave_to_own_path",
    "load",
    "local_rank",
    "main_process_first",
    "main_process_only",
    "main_process_value",
    "wait_for_main_process",
    "node_rank",
    "fail_together",
    "on_main_process",
    "print_once",
    "rank",
    "reduce_mean",
    "reduce_sum",
    "save",
    "setup",
    "world_size",
]
