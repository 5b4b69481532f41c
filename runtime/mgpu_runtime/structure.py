"""How containers of tensors are taken apart and rebuilt, shared by scatter (inputs, targets) and gather (outputs).

One definition of "container" keeps the two directions symmetric: tuples, lists, namedtuples, mappings
(dicts, ``OrderedDict``, HF's ``ModelOutput``) and dataclasses. Everything else is a leaf.

How many rows each piece of a batch gets is defined here too, once for both families: ``chunk_sizes``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch


def children(value: Any) -> list[Any] | None:
    """The values inside a container, in a fixed order; None for a leaf (tensors included)."""
    if isinstance(value, torch.Tensor):
        return None
    if isinstance(value, (tuple, list)):
        return list(value)
    # Dataclasses before mappings: HF's ModelOutput is both, and only the dataclass view lists its absent
    # (None) fields, which it needs to be rebuilt.
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [getattr(value, field.name) for field in _init_fields(value)]
    if isinstance(value, Mapping):
        return list(value.values())
    return None


def rebuild(template: Any, values: Sequence[Any]) -> Any:
    """A container of ``template``'s type and shape holding ``values`` (as ordered by ``children``)."""
    if _is_namedtuple(template):
        return type(template)(*values)
    if isinstance(template, (tuple, list)):
        return type(template)(values)
    if dataclasses.is_dataclass(template):
        fields = _init_fields(template)
        return dataclasses.replace(template, **{field.name: v for field, v in zip(fields, values)})
    return type(template)(zip(template.keys(), values))


def tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside ``value``, depth-first."""
    if isinstance(value, torch.Tensor):
        yield value
        return
    for part in children(value) or ():
        yield from tensors(part)


def holds_tensor(value: Any) -> bool:
    """Whether a tensor sits anywhere inside ``value``."""
    return next(tensors(value), None) is not None


def chunk_sizes(rows: int, parts: int) -> list[int]:
    """The row counts ``torch.chunk`` gives ``rows`` rows over ``parts`` pieces, which DataParallel's scatter uses.

    Pieces of ``ceil(rows / parts)`` rows and a smaller last one, so possibly fewer pieces than ``parts``
    (4 rows over 3 gives 2 and 2, 6 over 4 gives 2, 2 and 2). Matching ``chunk`` keeps every piece what
    DataParallel's replica held, BatchNorm statistics included, and avoids a 1-row piece where DataParallel
    had none (BatchNorm refuses one row in training). An empty batch gives no pieces.
    """
    if rows <= 0:
        return []
    size = -(-rows // parts)
    full, rest = divmod(rows, size)
    return [size] * full + ([rest] if rest else [])


def _init_fields(value: Any) -> list[dataclasses.Field]:
    return [field for field in dataclasses.fields(value) if field.init]


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")
