"""Per-replica outputs that behave like the gathered output, gathering only what is used, when it is used.

``nn.DataParallel`` gathers the whole output on one device after every forward, which for a language model
means the full logits (and later their gradient) on GPU 0. ``DataParallelModel`` instead returns a
``ParallelOutput``: the pieces stay where they were computed. ``DataParallelCriterion`` consumes the pieces
directly; any other use (indexing, unpacking, attributes, methods, ``torch.*`` functions, operators,
``float()``, formatting, ``isinstance``) sees the gathered value, built on first use and cached.
Selecting part of a structured output (``out[0]``, ``out.logits``, ``out["loss"]``) stays lazy, so an
HF-style model's ``.loss`` is gathered without its logits.

How pieces combine (``gather``):

* tensors with dimensions are concatenated along ``dim`` on the output device;
* floating scalars (one per replica, typically a loss computed inside ``forward``): a torch loss function's
  mean or sum, returned as computed, combines as what it averaged over (``piece_losses.py``): the sum of
  its numerators (summed losses) over the sum of its denominators (non-ignored tokens, elements), exactly
  the unsplit batch's loss. Any other scalar becomes the **mean weighted by each piece's batch rows**,
  which is the unsplit batch's mean for a mean over rows only. It stays a 0-dim tensor,
  so ``loss.backward()``, ``loss.item()`` and the ``if n_gpu > 1: loss = loss.mean()`` of scripts written
  for ``nn.DataParallel`` (whose vector of per-device losses is averaged with equal weights) all give the
  exact value: the mean of a 0-dim tensor is itself;
* integer scalars (counts such as correct predictions) are summed;
* containers are rebuilt with combined contents; other values (None, numbers, strings) are taken from the
  first replica.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from mgpu_runtime.balanced.devices import Devices
from mgpu_runtime.balanced.piece_losses import combine_marked
from mgpu_runtime.device_losses import mark_device_losses
from mgpu_runtime.structure import children, holds_tensor, rebuild


@dataclass(frozen=True)
class Pieces:
    """One output per replica, with what is needed to combine them."""

    values: Sequence[Any]
    sizes: Sequence[int]
    """Batch rows each replica received; the weights of scalar losses."""
    dim: int
    devices: Devices

    def select(self, part: Callable[[Any], Any]) -> Pieces:
        return replace(self, values=[part(value) for value in self.values])

    def combine(self) -> Any:
        return _combine(self.values, self.sizes, self.dim, self.devices.output)


def as_output(pieces: Pieces) -> Any:
    """What a caller of the parallel module gets: a ``ParallelOutput``, or the plain value if it holds no tensor.

    A value without tensors (None, a flag, a string) is the same on every replica and cannot be wrapped
    usefully: ``outputs.hidden_states is None`` must stay true. A plain ``list`` or ``tuple`` is returned as
    one, holding an output per element, so ``type(outputs) == list`` holds as it did for DataParallel's
    gathered list.
    """
    first = pieces.values[0]
    if not holds_tensor(first):
        return first
    if type(first) in _PLAIN_SEQUENCES:
        return type(first)(as_output(pieces.select(operator.itemgetter(index))) for index in range(len(first)))
    return ParallelOutput(pieces)


_PLAIN_SEQUENCES = (list, tuple)


def pieces_of(value: Any) -> Pieces | None:
    """The per-replica pieces behind ``value`` (also a plain list or tuple of one forward's outputs); None for
    a plain value."""
    if type(value) is ParallelOutput:
        return value._pieces
    if type(value) not in _PLAIN_SEQUENCES:
        return None
    outputs = [element._pieces for element in value if type(element) is ParallelOutput]
    if not outputs or any(holds_tensor(element) for element in value if type(element) is not ParallelOutput):
        return None
    first = outputs[0]
    if any((part.sizes, part.dim, part.devices) != (first.sizes, first.dim, first.devices) for part in outputs):
        return None
    per_replica = [
        type(value)(element._pieces.values[replica] if type(element) is ParallelOutput else element for element in value)
        for replica in range(len(first.values))
    ]
    return replace(first, values=per_replica)


def gather(value: Any) -> Any:
    """The gathered value of a ``ParallelOutput`` (differentiable, on the output device), also inside a plain
    list or tuple; a plain value as is."""
    return _gather_nested(value)


_NOT_GATHERED = object()


class ParallelOutput:
    """The output of a balanced parallel forward; see the module docstring."""

    __slots__ = ("_gathered", "_pieces")

    def __init__(self, pieces: Pieces) -> None:
        self._pieces = pieces
        self._gathered = _NOT_GATHERED

    def _gathered_value(self) -> Any:
        if self._gathered is _NOT_GATHERED:
            self._gathered = self._pieces.combine()
        return self._gathered

    def _select(self, part: Callable[[Any], Any]) -> Any:
        return as_output(self._pieces.select(part))

    def _modified(self) -> Any:
        """The gathered value, about to be changed in place: from now on it is the only piece, so whatever
        reads the output next (the criterion included) sees the change, as with DataParallel's output."""
        value = self._gathered_value()
        pieces = self._pieces
        self._pieces = Pieces([value], (sum(pieces.sizes),), pieces.dim, pieces.devices)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        self._modified()[key] = _gather_nested(value)

    @property
    def _first(self) -> Any:
        return self._pieces.values[0]

    @property
    def _is_tensor(self) -> bool:
        return isinstance(self._first, torch.Tensor)

    # isinstance() consults __class__: `isinstance(out, torch.Tensor)`, `isinstance(outputs, dict)` and
    # `torch.is_tensor(out)` answer as they would for the gathered value, which has the first piece's type.
    @property
    def __class__(self) -> type:
        return type(self._first)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return func(*_gather_nested(args), **_gather_nested(kwargs or {}))

    def __getattr__(self, name: str) -> Any:
        # Protocol lookups (copy, pickle, numpy) and our own slots must never trigger a gather.
        if name.startswith("__") or name in ParallelOutput.__slots__:
            raise AttributeError(name)
        # The gathered value has the first piece's type, so the first piece says whether the attribute exists
        # (for a tensor, its type: reading a non-leaf's `.grad` just to check would warn).
        if self._is_tensor:
            if not hasattr(type(self._first), name):
                raise AttributeError(f"'Tensor' object has no attribute '{name}'")
            if name.endswith("_") and not name.startswith("_"):  # in place: squeeze_, clamp_, masked_fill_ ...
                return _in_place(self, name)
            return getattr(self._gathered_value(), name)
        if callable(getattr(self._first, name)):
            return getattr(self._gathered_value(), name)
        return self._select(operator.attrgetter(name))

    def __getitem__(self, key: Any) -> Any:
        if self._is_tensor:
            return self._gathered_value()[key]
        return self._select(operator.itemgetter(key))

    def __iter__(self):
        first = self._first
        if isinstance(first, Mapping):
            return iter(first)  # the keys, the same on every replica
        if isinstance(first, (tuple, list)):
            return (self[index] for index in range(len(first)))
        return iter(self._gathered_value())

    def __len__(self) -> int:
        if self._is_tensor:
            if self._first.dim() == 0:
                raise TypeError("len() of a 0-d tensor")
            return self.shape[0]
        if isinstance(self._first, (Mapping, tuple, list)):
            return len(self._first)
        return len(self._gathered_value())

    def __bool__(self) -> bool:
        if self._is_tensor:
            return bool(self._gathered_value())
        return bool(self._first)

    def __contains__(self, item: Any) -> bool:
        if isinstance(self._first, Mapping):
            return item in self._first
        return item in self._gathered_value()

    # Metadata of a tensor output, answered without gathering.
    @property
    def shape(self) -> torch.Size:
        if not self._is_tensor:
            return self.__getattr__("shape")
        first, dim = self._first, self._pieces.dim
        if first.dim() == 0 or len(self._pieces.values) == 1:
            return first.shape
        rows = sum(piece.shape[dim] for piece in self._pieces.values)
        return torch.Size((*first.shape[:dim], rows, *first.shape[dim + 1 :]))

    def size(self, dim: int | None = None):
        if not self._is_tensor:
            return self.__getattr__("size")(dim)
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        if not self._is_tensor:
            return self.__getattr__("dim")()
        return self._first.dim()

    @property
    def ndim(self) -> int:
        return self.dim()

    @property
    def dtype(self) -> torch.dtype:
        if not self._is_tensor:
            return self.__getattr__("dtype")
        return self._first.dtype

    @property
    def device(self) -> torch.device:
        if not self._is_tensor:
            return self.__getattr__("device")
        if len(self._pieces.values) == 1:
            return self._first.device
        return self._pieces.devices.output

    def __repr__(self) -> str:
        return repr(self._gathered_value())

    def __format__(self, spec: str) -> str:
        return format(self._gathered_value(), spec)

    def __deepcopy__(self, memo: dict) -> Any:
        return copy.deepcopy(self._gathered_value(), memo)

    __hash__ = object.__hash__  # identity, as for tensors; defining __eq__ below would otherwise remove it


def _in_place(output: ParallelOutput, name: str) -> Callable[..., Any]:
    def method(*args: Any, **kwargs: Any) -> ParallelOutput:
        getattr(output._modified(), name)(*_gather_nested(args), **_gather_nested(kwargs))
        return output

    return method


def _delegate_to_gathered(name: str) -> Callable[..., Any]:
    def method(self: ParallelOutput, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._gathered_value(), name)(*args, **kwargs)

    method.__name__ = name
    return method


# Special methods are looked up on the type, never through __getattr__, so each one is spelled out.
for _name in (
    # __reduce_ex__: pickling and copying give the gathered value, as for any other use.
    *(f"__{op}__" for op in ("str", "float", "int", "index", "complex", "array", "reduce_ex")),
    *(f"__{op}__" for op in ("neg", "pos", "abs", "invert")),
    *(f"__{op}__" for op in ("eq", "ne", "lt", "le", "gt", "ge")),
    *(
        f"__{prefix}{op}__"
        for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul")
        + ("and", "or", "xor", "lshift", "rshift")
        for prefix in ("", "r")
    ),
):
    setattr(ParallelOutput, _name, _delegate_to_gathered(_name))
del _name


def _combine(values: Sequence[Any], sizes: Sequence[int], dim: int, device: torch.device | None) -> Any:
    first = values[0]
    if len(values) == 1:
        return first
    if isinstance(first, torch.Tensor):
        moved = [value.to(device) for value in values]
        if first.dim() > 0:
            return torch.cat(moved, dim)
        if first.is_floating_point() or first.is_complex():
            marked = combine_marked(values, device)
            # DataParallel gathered these as a vector of per-device losses: the combined loss stands for it.
            return mark_device_losses(_weighted_mean(moved, sizes) if marked is None else marked)
        return torch.stack(moved).sum()
    parts = children(first)
    if parts is None:
        return first
    per_replica = [children(value) for value in values]
    return rebuild(
        first,
        [_combine([replica[index] for replica in per_replica], sizes, dim, device) for index in range(len(parts))],
    )


def _weighted_mean(scalars: Sequence[torch.Tensor], sizes: Sequence[int]) -> torch.Tensor:
    """The mean of per-piece means, each weighted by its piece's rows: the mean over the whole batch."""
    total = sum(sizes)
    return torch.stack([scalar * (size / total) for scalar, size in zip(scalars, sizes)]).sum()


def _gather_nested(value: Any) -> Any:
    """``value`` with every ``ParallelOutput`` inside it (as in ``torch.cat([a, b])``) gathered."""
    if type(value) is ParallelOutput:
        return value._gathered_value()
    parts = children(value)
    if parts is None:
        return value
    return rebuild(value, [_gather_nested(part) for part in parts])
