"""``data_parallel(module, inputs)``: torch's functional DataParallel, over the processes of a job.

``mgpu_runtime.data_parallel`` has ``torch.nn.parallel.data_parallel``'s signature. Outside a job of several
processes (no ``setup()``, or a world of one) it is the balanced function (``balanced/functional.py``): the
module's replicas over this process's devices. Inside one (a script migrated ``--to ddp``, whose training step
calls the functional form, or a hand-written ``data_parallel_workaround`` that now calls this one), it is
DataParallel's forward over the ranks, as ``mgpu_runtime.DistributedDataParallel`` runs it: this rank's chunk
of the global inputs through the module, the outputs given back as DataParallel's gather gave them, and the
module's gradients summed over the ranks by DDP's reducer.

The functional form wraps nothing the script keeps: each call names the module. So the job keeps one
``DistributedDataParallel`` per module (``Job.functional_wrappers``), made at the module's first call, and runs
its forward at each call. The job holds it by a weak reference to the module, and the wrapper holds the
module only during a call (torch's DDP keeps the parameters and buffers it reduces, not the module), so a
module the script drops is not kept by the job. Between the calls the module is the script's own: called
directly (an evaluation, ``model.generate(...)``) it runs as it is, on this process, as the original ran it
outside ``data_parallel``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from mgpu_runtime.balanced.functional import data_parallel as balanced_data_parallel
from mgpu_runtime.distributed.ddp import DistributedDataParallel
from mgpu_runtime.distributed.process_group import Job, current_job

_MODULE = "module"  # where DDP (and FrozenModule) hold the module they wrap


def data_parallel(
    module: nn.Module,
    inputs: Any,
    device_ids: Sequence[Any] | None = None,
    output_device: Any = None,
    dim: int = 0,
    module_kwargs: dict[str, Any] | None = None,
) -> Any:
    """``module(*inputs, **module_kwargs)`` split as DataParallel splits it (see the module doc).

    Inside a job of several processes, ``device_ids`` and ``output_device`` are accepted and ignored, as
    ``DistributedDataParallel`` ignores them: each process has one device."""
    current = current_job()
    if current is None or current.group is None:
        return balanced_data_parallel(module, inputs, device_ids, output_device, dim, module_kwargs)
    if dim != 0:
        raise ValueError(
            f"mgpu_runtime.data_parallel(dim={dim}) in a job of {current.group.parts} processes: the batch is split "
            "over the processes along dimension 0 only; run this script as one process (MGPU_NPROC=1)"
        )
    if not isinstance(inputs, tuple):
        inputs = () if inputs is None else (inputs,)
    wrapper = _wrapper(current, module)
    wrapper._modules[_MODULE] = module
    wrapper.training = module.training
    try:
        return wrapper(*inputs, **(module_kwargs or {}))
    finally:
        del wrapper._modules[_MODULE]


def _wrapper(current: Job, module: nn.Module) -> nn.Module:
    """The job's ``DistributedDataParallel`` of ``module``, made at its first call (without the module: see the
    module doc)."""
    wrappers = current.functional_wrappers
    wrapper = wrappers.get(module)
    if wrapper is None:
        wrapper = DistributedDataParallel(module)
        del wrapper._modules[_MODULE]
        wrappers[module] = wrapper
    return wrapper
