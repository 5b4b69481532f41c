"""Balanced data parallelism: one process, several devices, nothing large gathered on the first one.

``DataParallelModel`` splits the batch like ``nn.DataParallel`` but leaves each replica's output where
it was computed; ``DataParallelCriterion`` computes the loss beside each piece and combines the pieces
into exactly the unsplit batch's loss. See ``runtime/README_balanced.md``.
"""

from mgpu_runtime.balanced.criterion import DataParallelCriterion
from mgpu_runtime.balanced.functional import data_parallel
from mgpu_runtime.balanced.model import DataParallelModel
from mgpu_runtime.balanced.outputs import gather

__all__ = ["DataParallelCriterion", "DataParallelModel", "data_parallel", "gather"]
