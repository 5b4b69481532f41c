"""Rank 0's generator states, which travel with the batches so that every rank's loop generators stay the original's.

Only rank 0 draws the sampler's randomness (``data.py``): torch's sampler draws from torch's CPU generator, and a
sampler of the script's own may draw from numpy's or Python's (DeepCluster's per-label sampler,
``np.random.choice`` when an epoch starts). Every other draw of the loop is made alike on every rank (its values are
global, ``global_view.py``), and the wrapped model's forward draws from its device's own stream. So with each chunk
of batches rank 0 sends the states of all three generators and the others take them: a script that draws from
numpy after the sampler drew (a k-means initialised with ``np.random.choice`` at the next epoch) draws the
original's numbers on every rank, as after ``setup()`` (``global_view._take_rank_zero_generators``).
"""

from __future__ import annotations

import random
from typing import Any

import numpy
import torch


def generator_states() -> tuple[torch.Tensor, Any, Any]:
    """This process's CPU generator states: torch's, numpy's global one, Python's ``random``."""
    return torch.get_rng_state(), numpy.random.get_state(), random.getstate()


def take_generator_states(states: tuple[torch.Tensor, Any, Any]) -> None:
    """Set the states rank 0 sent (``generator_states``)."""
    torch_state, numpy_state, python_state = states
    torch.set_rng_state(torch_state)
    numpy.random.set_state(numpy_state)
    random.setstate(python_state)
