"""mgpu_runtime: the parallel implementations that migrated scripts call.

Code rewritten by ``mgpu-migrate`` does ``import mgpu_runtime`` and uses the names below.
Two families, each in its own sub-package:

* ``balanced``: one process, several devices; the loss is computed beside each piece of the output
  so nothing large is gathered on the output device.
* ``distributed``: one process per device under torchrun / SLURM / plain python, with data, loss
  and side effects arranged so the run computes what the DataParallel original computed.

This package depends on torch only; it never imports the ``mgpu_migrate`` tool.
"""

from mgpu_runtime._version import __version__
from mgpu_runtime.balanced import (
    DataParallelCriterion,
    DataParallelModel,
    gather,
)
from mgpu_runtime.distributed import (
    DistributedCriterion,
    DistributedDataParallel,
    MainProcessOnly,
    barrier,
    data_parallel,
    device,
    distribute_loader,
    distribute_loaders,
    fail_together,
    is_initialized,
    is_main_process,
    launch_own_path,
    leave_to_own_path,
    load,
    local_rank,
    main_process_first,
    main_process_only,
    main_process_value,
    node_rank,
    on_main_process,
    print_once,
    rank,
    reduce_mean,
    reduce_sum,
    save,
    setup,
    wait_for_main_process,
    world_size,
)
from mgpu_runtime.wrappers import PARALLEL_WRAPPERS, unwrap

__all__ = [
    "__version__",
    "PARALLEL_WRAPPERS",
    "DataParallelCriterion",
    "DataParallelModel",
    "DistributedCriterion",
    "DistributedDataParallel",
    "MainProcessOnly",
    "barrier",
    "data_parallel",
    "device",
    "distribute_loader",
    "distribute_loaders",
    "fail_together",
    "gather",
    "is_initialized",
    "is_main_process",
    "launch_own_path",
    "leave_to_own_path",
    "load",
    "local_rank",
    "main_process_first",
    "main_process_only",
    "main_process_value",
    "node_rank",
    "on_main_process",
    "print_once",
    "rank",
    "reduce_mean",
    "reduce_sum",
    "save",
    "setup",
    "unwrap",
    "wait_for_main_process",
    "world_size",
]
