"""``DataParallelCriterion``: the loss computed beside each output piece, combined into the unsplit batch's loss.

How per-piece results are combined depends on what the criterion computes (see README_balanced.md):

* A torch loss function's mean (``CrossEntropyLoss``/``NLLLoss`` over the total weight of their
  non-ignored targets, element-wise losses over their elements), also inside a criterion of the script's
  own: each piece's result is marked with its numerator and denominator (``piece_losses.py``) and the loss
  is the sum of numerators over the sum of denominators. Exact with ``weight``, ``ignore_index``,
  ``label_smoothing`` and masked selections; a piece whose targets are all ignored adds 0 to both, never NaN.
* ``reduction='sum'``: the piece losses are summed.
* Anything else (``reduction='none'``, a callable that reduces by its own arithmetic): the piece results
  are gathered like outputs: scalars as the mean weighted by the rows of each piece, which is exact for
  losses averaged over rows, and tensors concatenated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import torch
from torch import nn

from mgpu_runtime.balanced.outputs import Pieces, gather, pieces_of
from mgpu_runtime.balanced.parallel_apply import parallel_apply
from mgpu_runtime.balanced.piece_losses import marking_losses
from mgpu_runtime.balanced.replicate import replicate
from mgpu_runtime.balanced.scatter import scatter
from mgpu_runtime.structure import tensors


class DataParallelCriterion(nn.Module):
    """Wraps a criterion so it takes ``DataParallelModel`` outputs and returns the unsplit batch's loss.

    ``criterion(output, *targets, **kwargs)``: every ``ParallelOutput`` argument gives its pieces; tensor
    targets are split with the sizes of the output pieces and sent to their devices. The criterion runs
    on each device in parallel; the result is combined exactly, differentiable, on the output device.
    Given plain tensors it is the plain criterion; targets that cannot be split to match the pieces get the
    plain criterion on the gathered output (exact, but it gathers).
    """

    def __init__(self, criterion: Callable[..., Any]) -> None:
        super().__init__()
        self.module = criterion

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        reference = next(filter(None, map(pieces_of, chain(args, kwargs.values()))), None)
        if reference is None or len(reference.values) == 1:
            return self._on_gathered(args, kwargs)
        rows = _piece_rows(reference)
        split = _split_arguments(args, kwargs, reference, rows)
        if split is None:
            return self._on_gathered(args, kwargs)
        piece_args, piece_kwargs = split
        devices = reference.devices
        criteria = [marking_losses(criterion) for criterion in self._replicas(devices.replicas[: len(rows)])]
        losses = parallel_apply(criteria, piece_args, piece_kwargs, devices)
        if getattr(self.module, "reduction", None) == "sum":
            return _sum(losses, devices.output)
        return Pieces(losses, rows, reference.dim, devices).combine()

    def _on_gathered(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.module(*map(gather, args), **{name: gather(value) for name, value in kwargs.items()})

    def _replicas(self, devices: Sequence[torch.device]) -> list[Callable[..., Any]]:
        # A criterion module may hold tensors (class weights, pos_weight) that must sit on each piece's device.
        if isinstance(self.module, nn.Module):
            return replicate(self.module, devices)
        return [self.module] * len(devices)


def _sum(values: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    return torch.stack([value.to(device) for value in values]).sum()


def _piece_rows(pieces: Pieces) -> list[int]:
    """Rows along ``dim`` of each output piece: what targets are split by, and how scalar losses weigh.

    These are the pieces' own rows, which differ from the input rows when the model reshapes its output
    (logits flattened to one row per token).
    """
    rows = []
    for value, input_rows in zip(pieces.values, pieces.sizes):
        first = next((tensor for tensor in tensors(value) if tensor.dim() > pieces.dim), None)
        rows.append(input_rows if first is None else first.shape[pieces.dim])
    return rows


def _split_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], reference: Pieces, rows: Sequence[int]
) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]] | None:
    """Per-piece positional and keyword arguments, or None when some argument cannot be split to match.

    Outputs of the parallel model give their own pieces (which must line up with the reference); other
    arguments are scattered with the reference's rows, provided every batch-like tensor in them has
    exactly that many rows.
    """
    per_argument = []
    for argument in chain(args, kwargs.values()):
        pieces = pieces_of(argument)
        if pieces is not None:
            if pieces.dim != reference.dim or _piece_rows(pieces) != rows:
                return None
            per_argument.append(pieces.values)
        elif any(t.dim() > reference.dim and t.shape[reference.dim] != sum(rows) for t in tensors(argument)):
            return None
        else:
            per_argument.append(scatter(argument, rows, reference.dim, reference.devices.replicas))
    positional, keyword = per_argument[: len(args)], per_argument[len(args) :]
    piece_args = [tuple(argument[piece] for argument in positional) for piece in range(len(rows))]
    piece_kwargs = [{name: argument[piece] for name, argument in zip(kwargs, keyword)} for piece in range(len(rows))]
    return piece_args, piece_kwargs
