"""W CUDA devices emulated on the CPU: the device count, and one random stream per device.

What a script sees once ``install(count)`` has run (process-wide; ``uninstall()`` undoes it):

* ``torch.cuda.device_count()`` is ``count``, while ``torch.cuda.is_available()`` stays False: tensors live
  on the CPU, so a script that tests ``is_available()`` picks the CPU, and its ``device_count() > 1``
  branches are taken as on a machine with ``count`` GPUs.
* Each device has its own generator. ``on_device(i)`` makes the default CPU generator draw device i's
  stream (dropout, ``torch.rand*`` without ``generator=``) until the block ends, and
  ``torch.cuda.current_device()`` is i inside it (0 outside). This is what "replica i runs on GPU i" means
  here: the forward of replica i draws from device i's stream, and the code outside keeps the process's
  own CPU stream, untouched.
* ``torch.nn.parallel``'s collectives that torch runs on GPUs only (``comm.broadcast_coalesced``,
  ``comm.reduce_add_coalesced``, ``_functions.Broadcast``, ``ReduceAddCoalesced``) run on the CPU, with the same
  values (``collectives``): a project's synchronized BatchNorm calls them itself.
* The CUDA seeding functions act on the emulated devices: ``torch.cuda.manual_seed_all``,
  ``manual_seed`` (the current device), ``seed``, ``seed_all``, ``initial_seed``, ``get_rng_state``,
  ``set_rng_state``, ``get_rng_state_all``, ``set_rng_state_all``. ``torch.manual_seed(s)`` and
  ``torch.seed()`` reach every device as on a GPU machine (below).

The API, for the runtime's CPU paths as much as for the DataParallel emulation:
``install(count)``, ``uninstall()``, ``count()``, ``on_device(index)``, ``current_device()``.

Facts from torch 2.13 that this follows
---------------------------------------
* ``torch.manual_seed(s)`` (``torch/random.py``) imports ``torch.cuda`` and calls
  ``torch.cuda.manual_seed_all(s)``, looked up as an attribute at each call (skipped only in a bad fork),
  then seeds the CPU generator. So every device gets the CPU's seed, and replacing the attribute on
  ``torch.cuda`` is enough. ``torch.seed()`` draws a nondeterministic seed for the CPU and hands that same
  seed to ``torch.cuda.manual_seed_all``. All devices seeded alike draw alike: after ``torch.manual_seed``
  two replicas given chunks of one shape get the same dropout mask, on GPUs as here.
* A fresh CUDA device's default generator is **not** at torch's fixed default seed (67280421310721): its
  first use calls ``seed()`` (``getDefaultCUDAGenerator`` in ``CUDAGeneratorImpl.cpp``), a nondeterministic
  53-bit seed of its own per device, as the CPU's default generator starts nondeterministic too. So what
  decides a device's stream is the script's last ``torch.manual_seed``/``torch.seed``, which gave every
  device the CPU's seed. Installed devices start at that seed, ``torch.initial_seed()``, at the start of
  its stream (a GPU draws only on the device): exactly where GPUs are when the script seeded before
  ``install``, so the runtime may install late. A script that never seeds gets the CPU's nondeterministic
  seed on every device (one of its own each on GPUs): not reproducible either way.
* ``torch.cuda.seed_all()`` seeds device 0 nondeterministically and gives the others that same seed;
  ``torch.cuda.seed()`` reseeds the current device only.
* The streams are the CPU's mt19937, not CUDA's Philox: the numbers differ from a GPU's, their structure
  (which device draws what, seeded how) is the GPU's. A state from ``get_rng_state`` is a CPU state
  (5,056 bytes), so a state saved on a real GPU does not load here.

Cost and limits
---------------
* ``on_device`` swaps generator states: entering and leaving costs two ``get_state`` and two
  ``set_state`` of the 5 KB mt19937 state, about 5 microseconds per block on a 2-core CI machine.
  Entering the device already current costs nothing more; blocks nest.
* Not thread-safe: there is one default CPU generator per process, so replicas that should draw as
  devices must run one after another, never in threads at once.
* ``torch.manual_seed`` called *inside* ``on_device(i)`` reseeds every device (device i through the
  default generator it is drawing from), but not the process's own stream, which was set aside at entry
  and comes back at exit.
* What a script imported before ``install`` by value (``from torch.cuda import device_count``) keeps
  torch's own function; ``torch.cuda.default_generators``, ``torch.accelerator`` and memory queries are
  not emulated.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.cuda
import torch.cuda.random

from mgpu_runtime.emulation.collectives import REPLACEMENTS

_SEED_BITS = 53  # CUDA's nondeterministic seeds are limited to 53 bits (exact as a double)

_generators: list[torch.Generator] = []
_installed = False
_installer = ""  # who installed the devices now emulated (``installed_by``)
_replaced: list[tuple[object, str, object]] = []  # (namespace, name, torch's function) to put back
_host = torch.Generator()  # the process's own CPU stream while a device draws through the default generator
_owner: int | None = None  # whose stream the default generator holds: a device index, or None (the process's)


def install(device_count: int, by: str = "") -> None:
    """Emulate ``device_count`` CUDA devices in this process. Idempotent for the same count; a different
    count needs ``uninstall()`` first. 0 emulates a machine without GPUs (the count stays 0). ``by`` names the
    installer, for ``installed_by``."""
    global _installed, _installer
    if device_count < 0:
        raise ValueError(f"a device count cannot be negative, got {device_count}")
    if _installed:
        if device_count == len(_generators):
            return
        raise RuntimeError(f"{len(_generators)} emulated devices are installed; uninstall() before installing {device_count}")
    _generators[:] = [torch.Generator().manual_seed(torch.initial_seed()) for _ in range(device_count)]
    replaced: list[tuple[Any, dict[str, Any]]] = [(torch.cuda, _CUDA_FUNCTIONS), (torch.cuda.random, _RANDOM_FUNCTIONS)]
    for namespace, functions in [*replaced, *REPLACEMENTS.items()]:
        for name, function in functions.items():
            _replaced.append((namespace, name, getattr(namespace, name)))
            setattr(namespace, name, function)
    _installed = True
    _installer = by


def installed_by() -> str:
    """Who installed the devices emulated now (``install``'s ``by``); "" when none are, or nobody said."""
    return _installer if _installed else ""


def uninstall() -> None:
    """Give torch its own CUDA functions back; nothing happens when nothing is installed."""
    global _installed
    if _owner is not None:
        raise RuntimeError(f"uninstall() inside on_device({_owner})")
    while _replaced:
        namespace, name, function = _replaced.pop()
        setattr(namespace, name, function)
    _generators.clear()
    _installed = False
_installer = ""  # who installed the devices now emulated (``installed_by``)


def count() -> int:
    """How many devices are emulated (0 when none are installed)."""
    return len(_generators)


def current_device() -> int:
    """The device whose ``on_device`` block is innermost; 0 outside every block."""
    return 0 if _owner is None else _owner


class on_device:  # lower case, as torch names its context managers (no_grad, autocast)
    """``with on_device(i):`` the default CPU generator draws device i's stream, and
    ``torch.cuda.current_device()`` is i. Blocks nest; leaving one restores the stream that was drawing."""

    __slots__ = ("index", "outer")

    def __init__(self, index: int) -> None:
        if not 0 <= index < len(_generators):
            raise ValueError(f"device {index} is not one of the {len(_generators)} emulated devices")
        self.index = index

    def __enter__(self) -> on_device:
        self.outer = _owner
        if self.index != self.outer:
            _hand_stream(self.outer, self.index)
        return self

    def __exit__(self, *exception) -> None:
        if self.index != self.outer:
            _hand_stream(self.index, self.outer)


def _hand_stream(holder: int | None, taker: int | None) -> None:
    """The default generator stops drawing ``holder``'s stream (kept in its store) and draws ``taker``'s."""
    global _owner
    default = torch.default_generator
    _store(holder).set_state(default.get_state())
    default.set_state(_store(taker).get_state())
    _owner = taker


def _store(owner: int | None) -> torch.Generator:
    return _host if owner is None else _generators[owner]


def _live(index: int) -> torch.Generator:
    """The generator that holds device ``index``'s stream now: the default one while it is drawing it."""
    return torch.default_generator if index == _owner else _generators[index]


def _nondeterministic_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") & ((1 << _SEED_BITS) - 1)


def _index(device: int | str | torch.device) -> int:
    """A device argument as torch's CUDA functions take it: an index, ``'cuda'``, ``'cuda:1'``, a device."""
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return current_device() if device.index is None else device.index


# The replacements of torch.cuda's functions, with torch's names and signatures.


def _device_count() -> int:
    return len(_generators)


def _manual_seed(seed: int) -> None:
    _live(current_device()).manual_seed(int(seed))


def _manual_seed_all(seed: int) -> None:
    for index in range(len(_generators)):
        _live(index).manual_seed(int(seed))


def _seed() -> None:
    _live(current_device()).manual_seed(_nondeterministic_seed())


def _seed_all() -> None:
    _manual_seed_all(_nondeterministic_seed())


def _initial_seed() -> int:
    return _live(current_device()).initial_seed()


def _get_rng_state(device: int | str | torch.device = "cuda") -> torch.Tensor:
    return _live(_index(device)).get_state()


def _set_rng_state(new_state: torch.Tensor, device: int | str | torch.device = "cuda") -> None:
    _live(_index(device)).set_state(new_state)


def _get_rng_state_all() -> list[torch.Tensor]:
    return [_get_rng_state(index) for index in range(len(_generators))]


def _set_rng_state_all(new_states) -> None:
    for index, state in enumerate(new_states):
        _set_rng_state(state, index)


_RANDOM_FUNCTIONS = {
    "manual_seed": _manual_seed,
    "manual_seed_all": _manual_seed_all,
    "seed": _seed,
    "seed_all": _seed_all,
    "initial_seed": _initial_seed,
    "get_rng_state": _get_rng_state,
    "set_rng_state": _set_rng_state,
    "get_rng_state_all": _get_rng_state_all,
    "set_rng_state_all": _set_rng_state_all,
}
_CUDA_FUNCTIONS = {"device_count": _device_count, "current_device": current_device, **_RANDOM_FUNCTIONS}
