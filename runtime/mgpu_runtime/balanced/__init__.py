"""Balanced data parallelism: one process, several devices, nothing large gathered on the first one.

``DataParallelModel`` splits the batch like ``nn.DataParallel`` but leaves each replica's output where
it was computed, as a ``Sharded`` value: the loop's loss and arithmetic run beside each piece and give
exactly what the gathered output would (the runtime contract, ``runtime/README.md``).
``DataParallelCriterion`` is a pass-through kept for code written against the PyTorch-Encoding pair. See
``runtime/README_balanced.md``.
"""

from mgpu_runtime.balanced.criterion import DataParallelCriterion
from mgpu_runtime.balanced.functional import data_parallel
from mgpu_runtime.balanced.model import DataParallelModel
from mgpu_runtime.balanced.outputs import gather

__all__ = ["DataParallelCriterion", "DataParallelModel", "data_parallel", "gather"]
