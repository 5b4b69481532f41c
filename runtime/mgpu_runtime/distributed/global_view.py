"""A job of several processes seen as the DataParallel original saw its one process (the runtime contract).

``join`` (called by ``setup()`` in a world of more than one) puts in place what the loop's values need to be
the original's on every rank:

* **the rank group** (``mgpu_runtime.sharded.RankGroup``): the batches of the distributed loader and the
  outputs of the wrapped model are ``Sharded`` values over it, and autograd follows the convention of
  ``mgpu_runtime.sharded.gradients`` (gradient parts that sum over the ranks). Small host-side exchanges (row
  counts, Python objects) go through gloo, also when the gradients go through NCCL;
* **the generators in step**: rank 0's Python ``random``, NumPy and torch CPU generator states are every
  rank's, so the loop draws the same numbers on every rank (a shuffle of file names, ``np.random.beta`` for
  mixup, ``torch.randperm``), as the one original process drew them once;
* **the devices the original saw**: on the CPU, the W devices of DataParallel are emulated
  (``mgpu_runtime.emulation.devices``): ``torch.cuda.device_count()`` is W, so the script takes its
  ``n_gpu > 1`` branches, and the wrapped model's forward on rank r draws from device r's random stream,
  seeded by ``torch.manual_seed`` as a GPU is, while the loop keeps the process's own. On GPUs the devices
  are real: rank r's forward draws on ``cuda:r``, as replica r's did, and on a rank above 0 from a stream of
  its own (``DeviceStream``): under DataParallel device r drew only in replica r's forward, while everything
  the loop drew on the GPU (a ``torch.multinomial`` of an evaluation, noise for the batch) came from
  ``cuda:0``. Rank r's loop draws on ``cuda:r`` therefore leave its forward's stream where device r's was, and
  a draw for a global value (``torch.randn_like`` of the batch) first takes rank 0's GPU stream
  (``RankGroup.take_rank_zero_stream``), so it is the one ``cuda:0`` drew.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy
import torch
import torch.distributed as dist

from mgpu_runtime.emulation import devices as emulated
from mgpu_runtime.sharded import RankGroup
from mgpu_runtime.sharded.gradients import Gradients
from mgpu_runtime.sharded.groups import Monitor


class DeviceStream:
    """The random stream of the wrapped model's forward on a rank above 0 (on GPUs), kept apart from the one
    the loop draws from on the same device: the generator's state is swapped in for the forward and out again.

    Device r's stream starts where the script's seed put every device: at the join, and anew whenever the
    loop's generator shows another seed at a forward's start (``torch.manual_seed(s)`` after ``setup()``, which
    seeded every device under DataParallel). A seed given inside the forward stays the forward's. Not followed:
    the loop seeding the same seed again, or ``torch.cuda.manual_seed`` (one device's) in the loop, which under
    DataParallel reseeded ``cuda:0`` only; here it starts device r's stream over too."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self.state = generator.get_state()
        self.loop_seed = generator.initial_seed()

    @contextlib.contextmanager
    def drawing(self) -> Iterator[None]:
        generator = self.generator
        loop_state, loop_seed = generator.get_state(), generator.initial_seed()
        if loop_seed != self.loop_seed:
            fresh = torch.Generator(device=generator.device)
            fresh.manual_seed(loop_seed)
            self.state, self.loop_seed = fresh.get_state(), loop_seed
        generator.set_state(self.state)
        try:
            yield
        finally:
            self.state = generator.get_state()
            generator.set_state(loop_state)


def join(
    rank: int, world_size: int, device: torch.device, lockstep: Monitor
) -> tuple[RankGroup, Gradients, DeviceStream | None]:
    """Make this process's loop see the job's global values (see the module doc); once, at setup, on every rank.
    The rank group's collectives are told to ``lockstep``. What it returns, the job keeps: the rank group, its
    gradients' convention, and this rank's forward stream (on GPUs, on a rank above 0; else None)."""
    metadata = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    group = RankGroup(rank, world_size, device, metadata, lockstep)
    gradients = Gradients(group)
    gradients.install()
    _take_rank_zero_generators(metadata)
    stream = None
    if device.type == "cuda" and rank > 0:
        torch.cuda.get_rng_state(device)  # CUDA's generators exist once it has started
        stream = DeviceStream(torch.cuda.default_generators[device.index or 0])
    if device.type == "cpu" and not emulated.count():
        emulated.install(world_size)
        # A script seeds before setup as often as after (at import, at the top of main). On GPUs that seed
        # reached every device when CUDA started (torch.manual_seed queues it); devices emulated only now
        # take it here, rank 0's, so each rank's forward draws what its device drew under DataParallel.
        torch.cuda.manual_seed_all(torch.initial_seed())
    return group, gradients, stream


def leave(gradients: Gradients) -> None:
    """Undo ``join`` (at teardown)."""
    gradients.uninstall()
    if emulated.count():
        emulated.uninstall()


@contextlib.contextmanager
def own_forward(gradients: Gradients, rank: int, stream: DeviceStream | None = None) -> Iterator[None]:
    """The wrapped model's forward on this rank: its own computation, drawing from its device's stream
    (``stream``, the job's, on GPUs on a rank above 0)."""
    with gradients.own_computation():
        if emulated.count():
            with emulated.on_device(rank):
                yield
        elif stream is not None:
            with stream.drawing():
                yield
        else:
            yield


def _take_rank_zero_generators(metadata) -> None:
    states = [(random.getstate(), numpy.random.get_state(), torch.get_rng_state())]
    dist.broadcast_object_list(states, src=0, group=metadata)
    python, numpy_state, torch_state = states[0]
    random.setstate(python)
    numpy.random.set_state(numpy_state)
    torch.set_rng_state(torch_state)
