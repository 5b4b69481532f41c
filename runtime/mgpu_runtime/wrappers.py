"""The set of parallel wrapper types, for code that asks "is this model wrapped?".

Migrated code that used ``isinstance(m, nn.DataParallel)`` to decide whether to reach for ``m.module``
asks ``isinstance(m, mgpu_runtime.PARALLEL_WRAPPERS)`` instead, so the check stays true for the wrappers
the migration put in place.
"""

from torch import nn

from mgpu_runtime.balanced import DataParallelModel
from mgpu_runtime.distributed import DistributedDataParallel
from mgpu_runtime.distributed.ddp import FrozenModule

PARALLEL_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel, DataParallelModel, FrozenModule)
if isinstance(DistributedDataParallel, type) and not issubclass(DistributedDataParallel, PARALLEL_WRAPPERS):
    PARALLEL_WRAPPERS = PARALLEL_WRAPPERS + (DistributedDataParallel,)


def unwrap(model: nn.Module) -> nn.Module:
    """The bare module inside any number of parallel wrappers."""
    while isinstance(model, PARALLEL_WRAPPERS):
        model = model.module
    return model
