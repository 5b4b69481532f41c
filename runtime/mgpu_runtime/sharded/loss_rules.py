"""torch's loss functions on ``Sharded`` values: local numerators over global denominators, one collective.

A mean loss weighs by what it averaged over (``mgpu_runtime.losses``): cross-entropy by the weight of its
non-ignored targets, element-wise losses by their elements, ``kl_div(reduction='batchmean')`` by rows, the
row losses (triplet, cosine embedding, margins) by rows. So each piece gives the sum of its losses and the
count it stands for, and the group sums both, in one collective: the loss is ``sum of numerators / sum of
denominators``, the global batch's value on every process, with the gradient of the one global loss.
``reduction='sum'`` sums; ``reduction='none'`` stays per piece, a ``Sharded`` value of per-row losses.

The batch's operands (``input``, ``target``, the two inputs of a ranking loss, the triplet's three, a
per-element ``weight`` of a binary cross-entropy) are cut like the batch; a per-class ``weight`` or
``pos_weight`` is every piece's. A call whose batch operands do not line up, or that uses the deprecated
``size_average``/``reduce`` arguments, is materialised instead (exact, slower).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from mgpu_runtime.losses import WATCHED, bind, loss_parts
from mgpu_runtime.sharded.rules import _materialized, _operand, _per_piece, _reference
from mgpu_runtime.sharded.tensor import Sharded

_BATCH = frozenset({"input", "target", "input1", "input2", "anchor", "positive", "negative", "var"})
_PER_ELEMENT_WEIGHT = frozenset({F.binary_cross_entropy, F.binary_cross_entropy_with_logits})
def loss_rule(func, args, kwargs):
    arguments = bind(func, args, kwargs)
    if arguments is None:
        return _materialized(func, args, kwargs)
    if arguments.get("size_average") is not None or arguments.get("reduce") is not None:
        return _materialized(func, args, kwargs)
    batch = _BATCH | ({"weight"} if func in _PER_ELEMENT_WEIGHT else set())
    operands = {name: value for name, value in arguments.items() if name in batch and isinstance(value, torch.Tensor)}
    first = operands.get("input", operands.get("input1", operands.get("anchor")))
    reference = _reference((), {name: value for name, value in operands.items() if type(value) is Sharded})
    if type(first) is not Sharded or reference is None or reference is not first and reference._splits != first._splits:
        return _materialized(func, args, kwargs)

    def local(index: int) -> dict[str, Any]:
        piece_arguments = {}
        for name, value in arguments.items():
            if name in operands:  # a loss's operands hold the batch's rows first, whatever their ranks
                piece_arguments[name] = _operand(value, index, first, True, value.dim())
            else:
                piece_arguments[name] = _operand(value, index, first, False, 0)
        return piece_arguments

    reduction = arguments.get("reduction", "mean")
    if reduction == "none":
        return _per_piece(func, (), {}, first, local=lambda index: ((), local(index)))
    numerators, denominators = [], []
    for index in range(len(first._pieces)):
        piece_arguments = local(index)
        if func in WATCHED:
            parts = loss_parts(func, piece_arguments)
            if parts is None:
                return _materialized(func, args, kwargs)
            numerator, denominator = parts.numerator, parts.denominator
        else:
            losses = func(**{**piece_arguments, "reduction": "none"})
            numerator, denominator = losses.sum(), losses.new_tensor(float(losses.numel()))
            if reduction == "sum":
                denominator = None
        numerators.append(numerator)
        denominators.append(denominator)
    group = first._group
    if reduction == "sum" or denominators[0] is None:
        (total,) = group.sum(numerators)
        return total
    total, count = group.sum(numerators, [d.to(n.dtype) for d, n in zip(denominators, numerators)])
    return total / count
