"""The one line a balanced model says when it starts replicas, as a relaunch says that it relaunches.

``nn.DataParallel`` spreads a batch silently, and so would its drop-in; but whether the replicas run (and on
which devices) is what a person checks first when a migrated script is slower or larger than expected. So
the first ``DataParallelModel`` of a process over two or more replicas says, once, on stderr, where they run
and where the loss is combined. One replica (or none) is the plain module: nothing is said.
"""

from __future__ import annotations

import functools
import sys

from mgpu_runtime.balanced.devices import CPU_REPLICAS_VARIABLE, Devices


def announce(devices: Devices) -> None:
    if len(devices.replicas) >= 2:
        _say_once(devices)


@functools.cache
def _say_once(devices: Devices) -> None:
    print(f"mgpu_runtime: {describe(devices)}", file=sys.stderr, flush=True)


def describe(devices: Devices) -> str:
    count = len(devices.replicas)
    if devices.replicas[0].type == "cpu":
        where = f"the CPU ({CPU_REPLICAS_VARIABLE}={count})"
    else:
        where = "GPUs " + ", ".join(str(device.index) for device in devices.replicas)
    return (
        f"balanced over {count} replicas on {where}: outputs stay on their devices, the loss is computed beside "
        f"each piece and combined on {devices.output}"
    )
