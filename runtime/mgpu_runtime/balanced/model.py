"""``DataParallelModel``: ``nn.DataParallel`` whose outputs stay on the replicas that computed them."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from torch import nn

from mgpu_runtime.balanced.banner import announce
from mgpu_runtime.balanced.devices import DeviceId, Devices, resolve_devices
from mgpu_runtime.balanced.functional import parallel_forward
from mgpu_runtime.balanced.replicate import replicate
from mgpu_runtime.pickling import COPY_MARK, as_data_parallel, copied_as_pickled


class DataParallelModel(nn.DataParallel):
    """A drop-in for ``nn.DataParallel(module, device_ids, output_device, dim)``.

    Everything but the gather is ``nn.DataParallel``'s: the batch is split along ``dim`` over
    ``device_ids`` (default: every GPU), the module is replicated for each forward, gradients flow back to
    ``module``'s parameters. The outputs stay on their devices, held as global values
    (``mgpu_runtime.sharded``) that behave as the gathered output wherever they are used, and a criterion on
    them computes the loss beside each piece. Being a ``nn.DataParallel`` keeps ``.module``, ``isinstance`` checks and the
    ``module.``-prefixed ``state_dict`` keys of the original script.

    Without a GPU the module runs as is, unless ``MGPU_CPU_REPLICAS=N`` asks for N CPU replicas.
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids: Sequence[DeviceId] | None = None,
        output_device: DeviceId | None = None,
        dim: int = 0,
    ) -> None:
        # nn.DataParallel.__init__ is skipped on purpose: it resolves devices its own way, which knows
        # nothing of CPU replicas and would reject their ids.
        nn.Module.__init__(self)
        self.module = module
        self.dim = dim
        self._devices = resolve_devices(device_ids, output_device)
        self.device_ids = _device_ids(self._devices)
        self.output_device = _output_device_id(self._devices)
        announce(self._devices)
        if len(self._devices.replicas) == 1:
            module.to(self._devices.replicas[0])  # as nn.DataParallel does for a single device

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        # Through self.replicate, which a synchronized-BatchNorm package's patch_replication_callback replaces
        # to tell each replica's layers their copy (as it does on nn.DataParallel). A subclass's own scatter and
        # gather (a detection project's CustomDataParallel, placing each device's images itself, stacking each
        # device's losses) are called as there.
        scatter = self._own_scatter if type(self).scatter is not nn.DataParallel.scatter else None
        gather = self._own_gather if type(self).gather is not nn.DataParallel.gather else None
        return parallel_forward(self.module, inputs, kwargs, self._devices, self.dim, self.replicate, scatter, gather)

    def _own_scatter(self, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.scatter(inputs, kwargs, self.device_ids)

    def _own_gather(self, outputs: list[Any]) -> Any:
        return self.gather(outputs, self.output_device)

    def replicate(self, module: nn.Module, device_ids: Sequence[Any]) -> list[nn.Module]:  # type: ignore[override]
        """``module``'s replicas for ``device_ids`` (the replicas' devices, as this wrapper's forward gives them)."""
        return replicate(module, device_ids)

    def __deepcopy__(self, memo: dict) -> Any:
        """``copy.deepcopy`` of the wrapper (``swa_utils.AveragedModel(model)``, an EMA copy): a wrapper of the same
        kind over the same devices around a deep copy of the module, whose forward splits each batch as the
        original's ``nn.DataParallel`` copy did (each chunk its own BatchNorm statistics, the first one's kept), and
        whose outputs behave as that copy's gathered ones. (A pickle still holds the ``nn.DataParallel``.)"""
        if type(self) is not DataParallelModel:
            # A DataParallel subclass rebased on this class (MGP106) keeps state of its own: copied as pickled.
            return copied_as_pickled(self, memo)
        clone = DataParallelModel.__new__(DataParallelModel)
        object.__setattr__(clone, COPY_MARK, True)  # no wrap of the script's: `verify` counts those
        memo[id(self)] = clone
        nn.Module.__init__(clone)
        clone.training = self.training
        clone.dim, clone._devices = self.dim, self._devices  # the same devices, as the copy's were
        clone.device_ids, clone.output_device = self.device_ids, self.output_device
        clone.module = copy.deepcopy(self.module, memo)
        return clone

    def __reduce_ex__(self, protocol: int) -> Any:
        # Without a GPU nn.DataParallel ignores device ids, so CPU replicas' ids do not reach the file.
        devices = {"device_ids": self.device_ids, "output_device": self.output_device, "dim": self.dim}
        return as_data_parallel(self.module, **devices)


def _device_ids(devices: Devices) -> list[int]:
    # CPU replicas are numbered by position, the way MGPU_CPU_REPLICAS device ids address them.
    return [device.index if device.type == "cuda" else position for position, device in enumerate(devices.replicas)]


def _output_device_id(devices: Devices) -> int | None:
    # nn.DataParallel's spelling: a CUDA index, or -1 for the CPU.
    if devices.output is None:
        return None
    return -1 if devices.output.type == "cpu" else devices.output.index
