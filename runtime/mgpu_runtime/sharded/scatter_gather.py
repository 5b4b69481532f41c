"""DataParallel's scatter and gather, over a group: what each replica of the model takes, and what the loop gets.

Both targets run the wrapped module's forward as ``nn.DataParallel`` ran it on its devices, and only the
group differs (a process per device, or the replicas of one process):

``scatter``: the forward's arguments are global values (``Sharded`` batches, or plain tensors held alike,
such as noise drawn for the batch). DataParallel cut every tensor argument with ``torch.chunk`` over its
devices, and so does this: part i gets chunk i of each. A ``Sharded`` argument already cut that way (the
distributed loader's batches, a model's outputs fed to the next model) gives its pieces without any
communication; one cut otherwise is materialised first. As DataParallel does, tuples, lists, dicts and
namedtuples are walked and any other object is every part's; 0-dim tensors are every part's too (DataParallel
fails on them). A batch of fewer chunks than devices runs on the first ones only (*active*); a process
whose device is not among them still runs its replica on no rows, as DDP needs every rank's backward (a
forward that cannot take zero rows, ``x.view(x.size(0), -1)``, runs a stand-in row instead: ``distributed/idle.py``).

``gather``: the outputs become what DataParallel's gather gave the loop: tensors concatenated along the
rows (a ``Sharded`` value whose parts are the active devices' outputs, their row counts exchanged in one
small collective over processes; each piece a view of its output, so that autograd sees the gathered value's
uses apart from those inside ``forward``, as it saw DataParallel's new tensor), a 0-dim tensor (a loss computed in ``forward``) a vector with one element
per active device (one element when the batch made one chunk: DataParallel on several devices gathers
then too), ``None`` kept, containers rebuilt. A Python number or string, which DataParallel cannot gather,
is an error that says so; a plain dataclass, which it cannot either, is gathered field by field, as the one
device the original could only run on returned it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from mgpu_runtime.sharded.groups import Group, starts
from mgpu_runtime.sharded.tensor import Sharded, adopt_requires_grad, materialize
from mgpu_runtime.structure import children, chunk_sizes, rebuild

MODEL_OUTPUT = "mgpu_model_output"
"""The mark on the autograd node of a replica's output as the loop receives it: behind it is the model's forward."""


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def walk(value: Any, leaf: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with ``leaf`` applied to every tensor in the containers DataParallel's scatter walks."""
    if isinstance(value, torch.Tensor):
        return leaf(value)
    if _is_namedtuple(value):
        return type(value)(*(walk(part, leaf) for part in value))
    if isinstance(value, (tuple, list)):
        return type(value)(walk(part, leaf) for part in value)
    if isinstance(value, dict):
        return type(value)((key, walk(part, leaf)) for key, part in value.items())
    return value


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors ``walk`` reaches, in its order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        parts = list(value)
    elif isinstance(value, dict):
        parts = list(value.values())
    else:
        return []
    return [tensor for part in parts for tensor in _tensors(part)]


def active_devices(inputs: tuple, kwargs: dict, devices: int) -> int:
    """How many of ``devices`` DataParallel would run for these arguments (``torch.chunk``'s count, the least
    over the tensors; every device for arguments without tensors of rows; one for no arguments at all)."""
    batched = [tensor for tensor in _tensors((inputs, kwargs)) if tensor.dim() > 0]
    if batched:
        return max(1, min(len(chunk_sizes(len(tensor), devices)) for tensor in batched))
    return devices if inputs or kwargs else 1


def scatter(inputs: tuple, kwargs: dict, group: Group, active: int) -> list[tuple[tuple, dict]]:
    """Each held part's arguments: chunk i of every tensor for part i (no rows for a part past ``active``),
    placed on the part's device (``group.place_on``)."""
    per_part = []
    for index, part in enumerate(group.held):

        def local(tensor: torch.Tensor, index: int = index, part: int = part) -> torch.Tensor:
            if tensor.dim() == 0:
                return group.place_on(materialize(tensor), index)
            sizes = chunk_sizes(len(tensor), group.parts)
            sizes += [0] * (group.parts - len(sizes))
            if type(tensor) is Sharded and tensor._splits == tuple(sizes) and tensor._group.held[: len(group.held)] == group.held:
                if tensor._legacy_leaf:
                    adopt_requires_grad(tensor)
                piece = tensor._pieces[index]
                if torch.is_grad_enabled():
                    tensor._used = True  # a later gradient hook on it goes on its pieces (sharded/hooks.py)
            else:
                piece = materialize(tensor).narrow(0, starts(sizes)[part], sizes[part])
                group.note_mixing(piece)  # a replica's input cut from a value every rank holds
            if part >= active:
                piece = piece.narrow(0, 0, 0)
            return group.place_on(piece, index)

        per_part.append((walk(inputs, local), walk(kwargs, local)))
    return per_part


def own_parts(scattered: tuple[Any, Any], devices: int, where: str) -> list[tuple[tuple, dict]]:
    """What a DataParallel subclass's own ``scatter`` returned (each part's inputs, each part's keyword arguments),
    as ``(inputs, kwargs)`` per part: one empty part for no arguments, as DataParallel's forward made it; more
    parts than ``devices`` (the GPUs, as ``where`` names them) is an error, as DataParallel had no replica for them."""
    part_inputs, part_kwargs = scattered
    if not part_inputs and not part_kwargs:
        part_inputs, part_kwargs = ((),), ({},)
    if not 0 < len(part_inputs) <= devices or len(part_kwargs) != len(part_inputs):
        raise RuntimeError(
            f"mgpu_runtime: the wrapper's scatter gave {len(part_inputs)} parts of inputs and {len(part_kwargs)} of "
            f"keyword arguments for {devices} {where}: nn.DataParallel ran one replica per part, at most one per GPU"
        )
    return [(tuple(inputs), dict(kwargs)) for inputs, kwargs in zip(part_inputs, part_kwargs)]


def gather(outputs: list[Any], active: int, group: Group) -> Any:
    """The global value of the held parts' ``outputs`` of one forward (see the module doc)."""
    idle = [part >= active for part in group.held]
    per_part = [_output_tensors(output) for output in outputs]
    batched = [index for index, tensor in enumerate(per_part[0]) if tensor.dim() > 0]
    rows = [[0 if idle[k] else len(per_part[k][index]) for index in batched] for k in range(len(outputs))]
    table = iter(group.row_table(rows)) if batched else iter(())
    leaves = [iter(tensors) for tensors in per_part]

    def leaf(_: torch.Tensor) -> Any:
        tensors = [next(it) for it in leaves]
        first = tensors[0]
        if first.dim() == 0:
            vectors = [t.reshape(1)[:0] if idle[k] else t.reshape(1) for k, t in enumerate(tensors)]
            return Sharded(vectors, [1] * active + [0] * (group.parts - active), group)
        return Sharded([t[:0] if idle[k] else _gathered_piece(t) for k, t in enumerate(tensors)], next(table), group)

    return _gathered(outputs[0], leaf, active)


def _gathered_piece(output: torch.Tensor) -> torch.Tensor:
    """A replica's output as a piece of the gathered value: a view of it, a tensor of its own for autograd, as
    DataParallel's gather made a new one. A hook on the gathered value, or its retained ``.grad``, sees the
    gradient of the loop's uses, not also of the uses inside ``forward`` (a state the heads read, returned too).

    The view is an alias, whose backward hands the gradient on as it is. ``view_as``'s backward reshapes it,
    which gives a dimension of one element another stride (a gradient of shape ``(1, 4, 2, 2)`` and strides
    ``(16, 1, 8, 4)`` came out with ``(4, 1, 8, 4)``), and torch's CPU BatchNorm backward misreads such a
    gradient: other weight gradients from the same values (pytorch-semseg's ``permute(0, 2, 3, 1)`` before its
    cross-entropy, on a piece of one row: a silent change of the gradient, its loss the original's)."""
    if not output.requires_grad:
        return output
    piece = torch.ops.aten.alias.default(output)
    piece.grad_fn.metadata[MODEL_OUTPUT] = True  # where the loop's graph ends (sharded/gradients.py)
    return piece


def _output_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors ``_gathered`` reaches, in its order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        parts = list(value)
    elif isinstance(value, dict) or dataclasses.is_dataclass(value) and not isinstance(value, type):
        parts = children(value) or []
    else:
        return []
    return [tensor for part in parts for tensor in _output_tensors(part)]


def _gathered(value: Any, leaf: Callable[[torch.Tensor], Any], active: int, one_device: bool = False) -> Any:
    if isinstance(value, torch.Tensor):
        return leaf(value)
    if value is None:
        return None
    if _is_namedtuple(value):
        return type(value)(*(_gathered(part, leaf, active, one_device) for part in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_gathered(part, leaf, active, one_device) for part in value)
    if isinstance(value, dict) or dataclasses.is_dataclass(value) and not isinstance(value, type):
        # A plain dataclass DataParallel cannot gather (it fails to iterate it): its fields are gathered as the
        # one-device run returned them, rows concatenated, its other values as they are.
        one_device = one_device or not isinstance(value, dict)
        return rebuild(value, [_gathered(part, leaf, active, one_device) for part in children(value) or []])
    if one_device:
        return value
    raise TypeError(
        f"mgpu_runtime: the model's forward returned a {type(value).__name__} ({value!r:.60}), which nn.DataParallel "
        f"cannot gather from {active} devices (its gather raises for it): the original ran only on one device. "
        "Return tensors (or None) from forward, or compute this value outside the model."
    )
