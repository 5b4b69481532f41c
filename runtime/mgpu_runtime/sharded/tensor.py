"""``Sharded``: a global value of the batch whose rows are held in pieces (see the package doc).

The object is a wrapper: a ``torch.Tensor`` subclass without storage whose metadata (``shape``, ``dtype``,
``device``) is the global value's, holding the pieces this process keeps, the rows of every part
(``splits``) and the ``Group`` that combines them. Every torch operation on it reaches ``__torch_function__``
and is answered by a rule of ``rules.py``, above autograd: the rules compute on the pieces, which are plain
tensors, so autograd records plain operations and the collectives' own backward functions. Nothing may reach
the dispatcher below autograd with a ``Sharded`` in it; if something does, it is a missing rule, and it says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mgpu_runtime.sharded.groups import Group, starts
from mgpu_runtime.structure import children, rebuild


class Sharded(torch.Tensor):
    """A global tensor of ``sum(splits)`` rows, of which this process holds the pieces of ``group.held``."""

    _pieces: tuple[torch.Tensor, ...]
    _splits: tuple[int, ...]
    _group: Group
    # For gradient hooks (``hooks.py``), set on the few values that need them:
    _used: bool = False
    """The pieces went into a computation with autograd (so a hook on several pieces goes on each of them)."""
    _tie: Any = None
    """The node a hooked value's later uses go through, when it has one."""
    _holders: tuple[torch.Tensor, ...] | None = None
    """The tensors whose gradients are this value's after its hooks, when they are not its pieces."""
    _viewed: Any = None
    """``(full, version)``: the global tensor an indexing of this value gave a view of (``x[i]``, ``x[i][j]``),
    and its version then. A change in place through that view (``x[n][p] += d``) changes ``full``; the next use
    of this value first takes its pieces from ``full`` again (``sync_viewed``), as torch's views share storage."""
    _legacy_leaf: bool = False
    """Made by ``torch.autograd.Variable(x, ...)``, whose ``requires_grad=True`` C++ sets on this wrapper, not on its
    pieces: read once, at the value's first use (``adopt_requires_grad``)."""

    @staticmethod
    def __new__(cls, pieces: Sequence[torch.Tensor], splits: Sequence[int], group: Group) -> Sharded:
        first = pieces[0]
        device = first.device
        if len(pieces) > 1 and any(piece.device != device for piece in pieces):
            device = group.device
        value = torch.Tensor._make_wrapper_subclass(
            cls, (sum(splits), *first.shape[1:]), dtype=first.dtype, device=device, requires_grad=False
        )
        value._pieces = tuple(pieces)
        value._splits = tuple(splits)
        value._group = group
        return value

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        from mgpu_runtime.sharded.rules import apply

        return apply(func, args, kwargs or {})

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.detach.default and len(args) == 1 and type(args[0]) is Sharded and not kwargs:
            # ``torch.autograd.Variable(x)`` (PyTorch 0.3's wrapper, still accepted): C++ detaches its argument
            # below __torch_function__. The value detached is each piece detached.
            value = args[0]
            detached = Sharded([piece.detach() for piece in value._pieces], value._splits, value._group)
            detached._legacy_leaf = True
            return detached
        raise RuntimeError(
            f"mgpu_runtime: {func} reached torch's dispatcher with a Sharded tensor (a global value of the batch "
            "held in pieces); no rule of mgpu_runtime.sharded answered it. Please report this, with the line "
            "of your script that calls it."
        )

    # The metadata the loop and the rules read most, answered here: Python finds these before torch's own, so
    # they never go through __torch_function__ (which answers the same, at ten times the cost).
    def dim(self) -> int:
        return self._pieces[0].dim()

    @property
    def ndim(self) -> int:  # type: ignore[override]
        return self._pieces[0].dim()

    @property
    def shape(self) -> torch.Size:  # type: ignore[override]
        return torch.Size((sum(self._splits), *self._pieces[0].shape[1:]))

    def size(self, dim: int | None = None):
        shape = self.shape
        return shape if dim is None else shape[dim]

    def numel(self) -> int:
        count = sum(self._splits)
        for size in self._pieces[0].shape[1:]:
            count *= size
        return count

    def __len__(self) -> int:
        return sum(self._splits)

    @property
    def dtype(self) -> torch.dtype:  # type: ignore[override]
        return self._pieces[0].dtype

    def rows_of_part(self, part: int) -> tuple[int, int]:
        """``(start, rows)`` of ``part`` in the global value."""
        return starts(self._splits)[part], self._splits[part]


def adopt_requires_grad(value: Sharded) -> None:
    """A value made by ``Variable(x, requires_grad=True)`` (SAGAN's gradient penalty: the points between real and
    generated rows): the flag the constructor set on the wrapper goes on its pieces, the leaves autograd sees."""
    value._legacy_leaf = False
    with torch._C.DisableTorchFunctionSubclass():
        wanted = value.requires_grad  # the wrapper's own flag, not the rule that asks its pieces
    if wanted:
        value._pieces = tuple(piece.requires_grad_(True) if piece.is_leaf else piece for piece in value._pieces)


def is_sharded(value: Any) -> bool:
    return type(value) is Sharded


def sync_viewed(value: Sharded) -> None:
    """When the global tensor that an indexing of ``value`` gave a view of has changed in place since (``row =
    x[3]; row += 1``, ``x[n][p] += d``): ``value``'s pieces become their rows of it, as if ``value`` had been
    that tensor all along."""
    full, version = value._viewed
    if full._version != version:
        held = value._group.held
        firsts = starts(value._splits)
        value._group.note_mixing(full)
        value._pieces = tuple(
            value._group.place(full.narrow(0, firsts[part], value._splits[part]), piece)
            for part, piece in zip(held, value._pieces)
        )
        value._viewed = (full, full._version)


def materialize(value: Any) -> Any:
    """``value`` with every ``Sharded`` inside it (also in lists, tuples, dicts) replaced by its global tensor,
    computed differentiably and the same on every process."""
    if type(value) is Sharded:
        if value._viewed is not None:
            sync_viewed(value)
        if torch.is_grad_enabled():
            value._used = True
        return value._group.concatenate(value._pieces, value._splits)
    if type(value) in (list, tuple):
        if not any(type(part) is Sharded or type(part) in (list, tuple, dict) for part in value):
            return value
        return type(value)(materialize(part) for part in value)
    if isinstance(value, torch.Tensor) or value is None or isinstance(value, (int, float, str, bool)):
        return value
    parts = children(value)
    if parts is None:
        return value
    materialized = [materialize(part) for part in parts]
    if all(new is old for new, old in zip(materialized, parts)):
        return value
    return rebuild(value, materialized)
