"""Running one callable per replica in threads, with the caller's torch modes and errors that name the replica.

Grad mode, inference mode and autocast are thread-local in torch: a fresh thread starts with grad on and
autocast off, so they are captured in the caller and re-entered in each worker (PyTorch-Encoding's copy
forgot autocast, which silently ran its replicas in fp32).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._utils import ExceptionWrapper

from mgpu_runtime.balanced.devices import Devices
from mgpu_runtime.replica_links import run_at_once, still_waiting, waits_for_copies

_AUTOCAST_DEVICE_TYPES = ("cuda", "cpu")


def parallel_apply(
    functions: Sequence[Callable[..., Any]],
    args: Sequence[Sequence[Any]],
    kwargs: Sequence[dict[str, Any]],
    devices: Devices,
) -> list[Any]:
    """``functions[i](*args[i], **kwargs[i])`` on replica ``i`` of ``devices``, all at once; results in order.

    A single call runs in the caller's thread. A failure is re-raised here as DataParallel re-raised it (the first
    replica's, of its type, with "Caught <type> in replica <r> on device <d>." and the original traceback in its
    message), so ``except`` clauses written for the unwrapped model (``torch.cuda.OutOfMemoryError``,
    ``ValueError`` ...) catch it, and what they print is the original's.
    """
    enter_caller_modes = _caller_modes()
    waiting: list[int] = []
    streams = [_current_stream(device) for device in devices.replicas[: len(functions)]]
    results: list[Any] = [None] * len(functions)
    failures: list[BaseException | None] = [None] * len(functions)

    def work(replica: int) -> None:
        try:
            with enter_caller_modes(), _on_device(devices.replicas[replica], streams[replica]):
                results[replica] = functions[replica](*args[replica], **kwargs[replica])
        # BaseException too: a SystemExit or KeyboardInterrupt in a thread would otherwise vanish, and the
        # caller would go on with a missing result.
        except BaseException as failure:  # noqa: BLE001 - every failure is re-raised in the caller below
            failures[replica] = failure

    if len(functions) == 1 or (devices.streams and not _wait_for_each_other(functions)):
        # CPU replicas one after the other: each draws from its emulated device's stream through the one CPU
        # generator (on GPUs each device has its own, and the threads run at once). Replicas that wait for each
        # other (a synchronized BatchNorm told its copy by ``__data_parallel_replicate__``) run at once, in
        # threads, as the emulated DataParallel runs them.
        for replica in range(len(functions)):
            with devices.stream(replica):
                work(replica)
    else:
        # At once, in threads; copies that wait for one that failed are given a grace period, then its failure is
        # raised (they would wait forever, as under torch's DataParallel).
        jobs = [functools.partial(work, replica) for replica in range(len(functions))]
        waiting = run_at_once(jobs, lambda: any(failure is not None for failure in failures))

    for replica, failure in enumerate(failures):
        if isinstance(failure, Exception) and len(functions) == 1:
            raise failure  # DataParallel on one device called its module as it is
        if isinstance(failure, Exception):
            # As DataParallel's parallel_apply: the same type, "Caught ValueError in replica 1 on device 1." and the
            # original traceback in the message, which a loop that catches it prints
            wrapped = ExceptionWrapper((type(failure), failure, failure.__traceback__), where=devices.where(replica))
            if waiting:  # the replicas that wait for this one, named
                wrapped.exc_msg += "\n" + still_waiting(waiting)
            wrapped.reraise()
        if failure is not None:
            _reraise(failure, devices.label(replica))
    return results


def _caller_modes() -> Callable[[], contextlib.AbstractContextManager]:
    """A context-manager factory that re-enters, in a worker thread, the torch modes active here."""
    grad_enabled = torch.is_grad_enabled()
    inference = torch.is_inference_mode_enabled()
    autocasts = [
        (device_type, torch.get_autocast_dtype(device_type))
        for device_type in _AUTOCAST_DEVICE_TYPES
        if torch.is_autocast_enabled(device_type)
    ]

    @contextlib.contextmanager
    def enter():
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode(inference))
            stack.enter_context(torch.set_grad_enabled(grad_enabled))
            for device_type, dtype in autocasts:
                stack.enter_context(torch.autocast(device_type, dtype=dtype))
            yield

    return enter


def _current_stream(device: torch.device) -> torch.cuda.Stream | None:
    # Read in the caller: the current stream is thread-local, and the work must queue behind the caller's.
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


@contextlib.contextmanager
def _on_device(device: torch.device, stream: torch.cuda.Stream | None):
    if stream is None:
        yield
        return
    with torch.cuda.device(device), torch.cuda.stream(stream):
        yield


def _reraise(failure: BaseException, where: str) -> None:
    """Raise ``failure`` (not an ``Exception``: DataParallel's threads lost those) again from the caller's thread,
    saying which replica it came from. A ``SystemExit`` keeps its exit code (what ``sys.exit(code)`` in the module
    asked for), with the replica in a note.
    """
    message = f"in {where}: {type(failure).__name__}: {failure}"
    if isinstance(failure, SystemExit):
        located = SystemExit(failure.code)
        if hasattr(located, "add_note"):  # Python 3.11+: shown in the traceback when someone prints it
            located.add_note(message)
        raise located from failure
    try:
        located = type(failure)(message)
    except Exception:  # noqa: BLE001 - a type whose constructor wants more than a message
        located = RuntimeError(message)
    raise located from failure


def _wait_for_each_other(functions: Sequence[Callable[..., Any]]) -> bool:
    """Whether the replicas are modules with a layer that meets its copies (``mgpu_runtime.replica_links``)."""
    first = functions[0]
    return isinstance(first, torch.nn.Module) and waits_for_copies(first)
