"""Rank 0's generator states, which travel with the batches so that every rank's generators stay the original's.

Only rank 0 draws the sampler's randomness (``data.py``), on the CPU generator; every other draw of the run is
made alike on every rank (the loss watch draws dropout and per-row noise for the global batch, ``losses.py``).
So with each chunk of batches rank 0 sends its CPU generator's state and the others take it. A process that
trains on a GPU also sends its device's CUDA generator state (dropout on the GPU draws from it), and the
others set it on their own device: draws on the GPU that a rank made for itself alone (a shape that depends
on its share, a draw the watch does not know) are undone at the next chunk, as on the CPU. The CUDA state is
read and set only where this process's device is a GPU (it is CUDA's seed and offset, no device
synchronisation), so CPU runs exchange exactly what they did before.
"""

from __future__ import annotations

from typing import Any

import torch

from mgpu_runtime.distributed.process_group import device


def generator_states() -> tuple[torch.Tensor, torch.Tensor | None]:
    """This process's CPU generator state, and its device's CUDA generator state when it trains on a GPU."""
    local = device()
    return torch.get_rng_state(), torch.cuda.get_rng_state(local) if local.type == "cuda" else None


def take_generator_states(states: Any) -> None:
    """Set the states rank 0 sent (``generator_states``); a CUDA state only on a process that trains on a GPU."""
    cpu, cuda = states
    torch.set_rng_state(cpu)
    local = device()
    if cuda is not None and local.type == "cuda":
        torch.cuda.set_rng_state(cuda, local)
