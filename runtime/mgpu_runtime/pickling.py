"""How the runtime's classes pickle: as the torch classes the original script held.

Old code saves whole models, ``torch.save(model, "model.pth")``, where ``model`` is the wrapped model. The
original's file held an ``nn.DataParallel``, which loads anywhere with torch alone, and its loader code
goes on with ``model.module`` or ``model.eval()``. So a migrated script's wrapper (``DistributedDataParallel``,
``FrozenModule``, ``DataParallelModel``) pickles as the ``nn.DataParallel`` around the same module that
``nn.DataParallel(module, ...)`` would have built on this machine, and the CPU SyncBatchNorm layer as
``nn.SyncBatchNorm``: a file that loads without ``mgpu_runtime``, exactly like the original's. ``copy.deepcopy``
of a wrapper is a wrapper of the same kind around a copy of the module (``__deepcopy__``: an averaged model, an EMA
copy), whose forward splits each batch as the original's ``nn.DataParallel`` copy did: an ``nn.DataParallel`` over
all of a machine's GPUs from ``cuda:0`` is no copy a process of a job can run, and CPU replicas it would not split
over. A DataParallel subclass rebased on a wrapper is copied as it pickles.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

# Set on a wrapper that `copy.deepcopy` made of another (an averaged or EMA copy: a wrapper of the same kind, not
# the nn.DataParallel a pickle holds), so that what counts the models a script wrapped passes over it.
COPY_MARK = "_mgpu_deep_copy"


def as_data_parallel(module: nn.Module, **arguments: Any) -> Any:
    """``__reduce_ex__``'s value for a wrapper of ``module``: the ``nn.DataParallel(module, **arguments)``
    of this machine (its device ids, output device, ``dim``), without touching ``module``."""
    # Built around an empty placeholder: DataParallel's constructor moves its module to a single GPU.
    original = nn.DataParallel(nn.Module(), **arguments)
    original.module = module
    return as_class(original, nn.DataParallel)


def as_class(instance: Any, cls: type) -> Any:
    """``__reduce_ex__``'s value for ``instance`` as if it were of class ``cls`` (the same state).

    Protocol 1's form (``copyreg._reconstructor``, then the state) whatever the protocol: protocol 2's
    ``__newobj__`` refuses a class other than the instance's own.
    """
    constructor, (_, base, base_state), state = object.__reduce_ex__(instance, 1)
    return constructor, (cls, base, base_state), state


def copied_as_pickled(instance: Any, memo: dict) -> Any:
    """``copy.deepcopy`` of ``instance`` through its ``__reduce_ex__`` (the copy a pickle would load): what a
    DataParallel subclass rebased on a wrapper gets, its own state kept."""
    return copy._reconstruct(instance, memo, *instance.__reduce_ex__(4))  # type: ignore[attr-defined]
