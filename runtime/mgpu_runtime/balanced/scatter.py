"""Splitting a batch into per-replica pieces with explicit sizes.

Sizes are decided once, from the batch, as ``torch.chunk`` (DataParallel's scatter) would cut it
(``structure.chunk_sizes``), and every tensor of that batch size is split with exactly those sizes
(``torch.split`` with a list), so inputs, targets and the loss weights always agree, and each replica holds
the rows DataParallel's did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mgpu_runtime.structure import children, chunk_sizes, rebuild, tensors


def split_sizes(batch: int, parts: int) -> list[int]:
    """``torch.chunk``'s sizes for ``batch`` rows over at most ``parts`` pieces (no empty replicas); an empty
    batch gives one empty piece, so the module still runs once as it would unsplit."""
    return chunk_sizes(batch, parts) or [0]


def batch_size(inputs: Any, dim: int) -> int:
    """Rows along ``dim`` of the first tensor that has that dimension; 0 when there is none."""
    for candidate in tensors(inputs):
        if candidate.dim() > dim:
            return candidate.shape[dim]
    return 0


def scatter(value: Any, sizes: Sequence[int], dim: int, devices: Sequence[torch.device]) -> list[Any]:
    """``value`` cut into ``len(sizes)`` pieces, piece ``i`` on ``devices[i]``.

    Tensors with ``sum(sizes)`` rows along ``dim`` are split with ``sizes``; other tensors with that
    dimension are split into the same number of pieces (as near-equal as ``tensor_split`` makes them);
    tensors without it (scalars) and non-tensors are shared by every piece. Containers are rebuilt per piece.
    """
    pieces = len(sizes)
    if pieces == 1:
        return [move_to(value, devices[0])]
    if isinstance(value, torch.Tensor):
        if value.dim() <= dim:
            parts = [value] * pieces
        elif value.shape[dim] == sum(sizes):
            parts = torch.split(value, list(sizes), dim)
        else:
            parts = torch.tensor_split(value, pieces, dim)
        return [part.to(device, non_blocking=True) for part, device in zip(parts, devices)]
    parts = children(value)
    if parts is None:
        return [value] * pieces
    per_part = [scatter(part, sizes, dim, devices) for part in parts]
    return [rebuild(value, [pieces_of_part[i] for pieces_of_part in per_part]) for i in range(pieces)]


def move_to(value: Any, device: torch.device) -> Any:
    """``value`` with its tensors on ``device``: the very same object when they already are there, which
    keeps the single-device forward as cheap as calling the module."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    parts = children(value)
    if parts is None:
        return value
    moved = [move_to(part, device) for part in parts]
    if all(new is old for new, old in zip(moved, parts)):
        return value
    return rebuild(value, moved)


def scatter_inputs(
    inputs: tuple[Any, ...], kwargs: dict[str, Any], sizes: Sequence[int], dim: int, devices: Sequence[torch.device]
) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    """Per-piece positional and keyword arguments."""
    return scatter(tuple(inputs), sizes, dim, devices), scatter(dict(kwargs), sizes, dim, devices)

