"""Rank 0's generator state, which travels with the batches so that every rank's loop generator stays the original's.

Only rank 0 draws the sampler's randomness (``data.py``), on the CPU generator; every other draw of the loop is
made alike on every rank (its values are global, ``global_view.py``), and the wrapped model's forward draws
from its device's own stream. So with each chunk of batches rank 0 sends its CPU generator's state and the
others take it.
"""

from __future__ import annotations

import torch


def generator_states() -> torch.Tensor:
    """This process's CPU generator state."""
    return torch.get_rng_state()


def take_generator_states(state: torch.Tensor) -> None:
    """Set the state rank 0 sent (``generator_states``)."""
    torch.set_rng_state(state)
