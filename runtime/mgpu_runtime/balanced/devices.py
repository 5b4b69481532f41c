"""Which devices the replicas run on, resolved once from ``device_ids``, ``output_device`` and the machine.

Three cases, mirroring ``nn.DataParallel`` plus the CPU replicas (``MGPU_CPU_REPLICAS``):

* CUDA present: ``device_ids`` name CUDA devices (default: all of them); a device may repeat, which is the
  only way to get two replicas on one GPU.
* No CUDA and ``MGPU_CPU_REPLICAS=N`` (N > 1): N replicas on the CPU, so the whole multi-replica path runs
  in CI and on laptops; ``device_ids`` then index those replicas. The N devices are emulated
  (``mgpu_runtime.emulation.devices``): ``torch.cuda.device_count()`` is N, so the script takes the branches
  it takes on N GPUs, and replica i draws from device i's random stream (``Devices.stream``), one replica
  after the other, as GPU i drew for it.
* Otherwise: no replicas; the module runs as is, as ``nn.DataParallel`` does without a GPU.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Union

import torch

from mgpu_runtime.emulation import devices as emulated

CPU_REPLICAS_VARIABLE = "MGPU_CPU_REPLICAS"

DeviceId = Union[int, str, torch.device]


@dataclass(frozen=True)
class Devices:
    """Where each replica runs and where gathered values land."""

    replicas: tuple[torch.device, ...]
    """One entry per replica, in ``device_ids`` order; empty when the module runs unreplicated."""
    output: torch.device | None
    """Where gathered outputs and combined losses are placed; None when there are no replicas."""
    streams: tuple[int, ...] = ()
    """CPU replicas: the emulated device each replica draws its random numbers from (its device id)."""

    @contextlib.contextmanager
    def stream(self, replica: int) -> Iterator[None]:
        """Replica ``replica``'s forward draws from its device's stream (CPU replicas; a GPU has its own)."""
        if not self.streams:
            yield
            return
        with emulated.on_device(self.streams[replica]):
            yield

    def label(self, replica: int) -> str:
        """How errors name a replica: ``replica 1 on cuda:1`` or ``cpu replica 1``."""
        device = self.replicas[replica]
        if device.type == "cpu":
            return f"cpu replica {replica}"
        return f"replica {replica} on {device}"

    def where(self, replica: int) -> str:
        """Where DataParallel said a replica's error was raised: ``in replica 1 on device 1`` (the GPU's index; a CPU
        replica's emulated device)."""
        device = self.replicas[replica]
        index = device.index if device.type == "cuda" else (self.streams[replica] if self.streams else replica)
        return f"in replica {replica} on device {index}"


def resolve_devices(
    device_ids: Sequence[DeviceId] | None = None,
    output_device: DeviceId | None = None,
) -> Devices:
    """The replica devices for this machine, read now (not at import) so tests can set the environment."""
    if device_ids is not None:
        device_ids = list(device_ids)  # any iterable, as nn.DataParallel takes: a range, a generator
    if torch.cuda.is_available():
        return _cuda_devices(device_ids, output_device)
    emulate_cpu_replicas()
    replica_count = cpu_replica_count()
    if replica_count > 1:
        return _cpu_devices(device_ids, replica_count)
    # Like nn.DataParallel without a GPU: device ids are meaningless here, so they are ignored, not checked.
    return Devices(replicas=(), output=None)


_INSTALLER = "MGPU_CPU_REPLICAS"


def emulate_cpu_replicas() -> None:
    """Emulate ``MGPU_CPU_REPLICAS`` devices when there is no GPU (read now: tests change the variable between
    scripts), so that the script sees the machine its original ran on; called at import and for each wrapper.
    Devices a distributed job emulates are left as they are."""
    wanted = cpu_replica_count() if not torch.cuda.is_available() else 1
    ours = emulated.installed_by() == _INSTALLER
    if wanted > 1 and emulated.count() != wanted and (ours or not emulated.count()):
        emulated.uninstall()
        emulated.install(wanted, by=_INSTALLER)
    elif wanted <= 1 and ours:
        emulated.uninstall()


def cpu_replica_count() -> int:
    """``MGPU_CPU_REPLICAS`` as a positive count; 1 when unset."""
    raw = os.environ.get(CPU_REPLICAS_VARIABLE, "").strip()
    if not raw:
        return 1
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{CPU_REPLICAS_VARIABLE} must be a positive integer, got {raw!r}")
    return count


def _cuda_devices(device_ids: Sequence[DeviceId] | None, output_device: DeviceId | None) -> Devices:
    count = torch.cuda.device_count()
    indices = list(range(count)) if device_ids is None else [_cuda_index(d, count) for d in device_ids]
    if not indices:
        raise ValueError("device_ids is empty: name at least one CUDA device")
    replicas = tuple(torch.device("cuda", i) for i in indices)
    return Devices(replicas=replicas, output=_cuda_output_device(output_device, replicas[0], count))


def _cuda_output_device(output_device: DeviceId | None, first_replica: torch.device, count: int) -> torch.device:
    if output_device is None:
        return first_replica
    if output_device == -1:  # torch's spelling for "gather on the CPU"
        return torch.device("cpu")
    if not isinstance(output_device, int) and torch.device(output_device).type == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", _cuda_index(output_device, count))


def _cuda_index(device_id: DeviceId, count: int) -> int:
    if isinstance(device_id, int):
        index = device_id
    else:
        device = torch.device(device_id)
        if device.type != "cuda":
            raise ValueError(
                f"device_ids must name CUDA devices on a machine with CUDA, got {str(device)!r}; "
                "pass GPU indices such as [0, 1]"
            )
        index = torch.cuda.current_device() if device.index is None else device.index
    if not 0 <= index < count:
        raise ValueError(
            f"device id {index} is out of range: this machine has {count} CUDA device(s), "
            f"valid ids are 0..{count - 1}"
        )
    return index


def _cpu_devices(device_ids: Sequence[DeviceId] | None, available: int) -> Devices:
    # Empty ids are what `range(torch.cuda.device_count())` gives on a machine without a GPU: on the machine
    # the CPU replicas stand in for, that expression names every device, so it gets every replica.
    if not device_ids:
        count = available
    else:
        for device_id in device_ids:
            index = device_id if isinstance(device_id, int) else torch.device(device_id).index or 0
            if not 0 <= index < available:
                raise ValueError(
                    f"device id {index} is out of range: {CPU_REPLICAS_VARIABLE}={available} gives "
                    f"CPU replicas 0..{available - 1}"
                )
        count = len(device_ids)
    cpu = torch.device("cpu")
    streams = tuple(range(count)) if not device_ids else tuple(
        device_id if isinstance(device_id, int) else torch.device(device_id).index or 0 for device_id in device_ids
    )
    return Devices(replicas=(cpu,) * count, output=cpu, streams=streams)


emulate_cpu_replicas()
