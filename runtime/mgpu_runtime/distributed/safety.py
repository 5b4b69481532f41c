"""The safety net: a multi-process run that would not train like the original is put right or fails loudly.

First, a repair. DDP copies rank 0's weights to every process when the model is wrapped; a script that
changes them afterwards (``model.apply(init_weights)`` after the wrap, a checkpoint loaded on the main
process only) would leave each process with its own model, drifting apart for good. So at the first
training forward the wrapper compares the processes' parameters and buffers (count, sum and sum of squares
of each) and, where they differ, copies rank 0's to all, as the wrap would have, with a warning.

Then a check, before the first optimizer step, installed only in a world of more than one process:
**plain inputs that differ.** The wrapper takes the loop's values as global ones: the distributed loader's
batches are held in pieces, and a plain tensor is taken to be the same on every process (noise drawn for the
batch from generators kept in step, a batch of data the tool could not follow, loaded alike everywhere).
An unseeded shuffle in a loader of the script's own, or random augmentation there, breaks that: each
process would train on its own batches. So the wrapper fingerprints the plain tensors given to its
training forwards (count, sum and sum of squares of each, on their device), and the first step compares
the last one across processes. ``MGPU_ALLOW_DIFFERENT_BATCHES=1`` turns this check off.

A small all-gather, once, so it costs nothing measurable.
"""

from __future__ import annotations

import os
import warnings
import weakref
from itertools import chain
from typing import Any

import torch
import torch.distributed as dist
from torch.optim import Optimizer
from torch.optim.optimizer import register_optimizer_step_pre_hook

from mgpu_runtime.sharded import Sharded
from mgpu_runtime.structure import tensors

ALLOW_DIFFERENT_BATCHES_VARIABLE = "MGPU_ALLOW_DIFFERENT_BATCHES"


class DifferentBatchesError(RuntimeError):
    """Processes were given plain inputs that differ (each would train on its own batches)."""


class SafetyNet:
    """The first-step check of one job (see the module doc): checks every optimizer's first step, present and
    future, from when it is made until ``remove()`` (at teardown)."""

    def __init__(self) -> None:
        self._verified: weakref.WeakSet[Optimizer] = weakref.WeakSet()
        self._batches_compared = False
        self._whole_batch: torch.Tensor | None = None
        """The fingerprint of the plain tensors of the last training forward (None: it had none)."""
        self._hook = register_optimizer_step_pre_hook(self._check_first_step)

    def note_forward(self, inputs: tuple, kwargs: dict[str, Any]) -> None:
        """Called by the wrapper's training forward in a multi-process run: keep what the first-step check compares."""
        if self._batches_compared:
            return
        plain = [tensor for tensor in tensors((inputs, kwargs)) if type(tensor) is not Sharded and tensor.dim() > 0]
        self._whole_batch = _batch_fingerprint(plain) if plain else None

    def remove(self) -> None:
        self._hook.remove()

    def _check_first_step(self, optimizer: Optimizer, args: tuple, kwargs: dict) -> None:
        if optimizer in self._verified:
            return
        self._verified.add(optimizer)
        self._compare_whole_batches()

    def _compare_whole_batches(self) -> None:
        """Once per run, on every process alike (the same collective everywhere, so none can hang)."""
        if self._batches_compared:
            return
        self._batches_compared = True
        mine = torch.zeros(5, dtype=torch.float64, device=_gather_device())
        if self._whole_batch is not None:
            mine[0], mine[1:] = 1.0, self._whole_batch
        self._whole_batch = None
        everyone = _gathered(mine)
        if everyone[:, 0].sum() == 0 or os.environ.get(ALLOW_DIFFERENT_BATCHES_VARIABLE, "") not in ("", "0"):
            return
        if not torch.equal(everyone, everyone[0].expand_as(everyone)):
            raise DifferentBatchesError(
                f"mgpu_runtime: the {dist.get_world_size()} processes trained their first step on whole batches "
                "that differ. Data that does not come through mgpu_runtime.distribute_loader gives every process "
                "whole batches, which matches the original single-process training only when every process draws "
                "the same ones; here they did not (an unseeded shuffle, or random augmentation), so each step would "
                "average the gradients of different batches. Pass the training loader through "
                "mgpu_runtime.distribute_loader(loader) where it is built (each process then gets its rows of the "
                "original batches), or seed every process alike before building it. A script that splits its data "
                f"itself (a DistributedSampler) means the batches to differ: {ALLOW_DIFFERENT_BATCHES_VARIABLE}=1 "
                "skips this check."
            )


def align_replicas(module: torch.nn.Module, group: Any = None) -> bool:
    """Make every process's parameters and buffers rank 0's if they differ anywhere; whether they did.

    A collective: every process calls it, at its first training forward."""
    states = list(chain(module.parameters(), module.buffers()))
    if not states:
        return False
    device = _gather_device()
    everyone = _gathered(torch.stack([_value_fingerprint(state).to(device) for state in states]), group)
    if torch.equal(everyone, everyone[0].expand_as(everyone)):
        return False
    for state in states:
        dist.broadcast(state.data, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    if dist.get_rank() == 0:
        warnings.warn(
            "mgpu_runtime: the processes' weights differed at the first training step (changed after the model "
            "was wrapped, e.g. initialised with each process's own random numbers); rank 0's were copied to every "
            "process. Initialise or load weights before wrapping to keep this from happening.",
            RuntimeWarning,
            stacklevel=3,
        )
    return True


def _value_fingerprint(tensor: torch.Tensor) -> torch.Tensor:
    values = tensor.detach() if tensor.is_floating_point() else tensor.detach().double()
    norm = torch.linalg.vector_norm(values, dtype=torch.float64)
    return torch.stack([values.sum(dtype=torch.float64), norm.square()])


def _batch_fingerprint(value: Any) -> torch.Tensor:
    """How many tensors and elements, and the sum and sum of squares of their values, on the gather device.
    Float tensors are reduced in float64 without a float64 copy of the batch."""
    device = _gather_device()
    total = torch.zeros(4, dtype=torch.float64, device=device)
    for tensor in tensors(value):
        if tensor.is_complex():
            continue
        sums = _value_fingerprint(tensor)
        total += torch.cat([sums.new_tensor([1.0, float(tensor.numel())]), sums]).to(device)
    return total


def _gather_device() -> torch.device:
    # nccl gathers only CUDA tensors; gloo takes CPU ones.
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _gathered(local: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Every process's ``local`` (the same shape everywhere, on ``_gather_device()``), stacked in rank order, on
    the CPU."""
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, local, group=group)
    return torch.stack(gathered).cpu()


