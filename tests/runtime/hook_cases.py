"""Gradient hooks of the loop on global values, to run on plain tensors and on ``Sharded`` ones and compare (float64).

Each case is ``case(batch) -> (loss, kept)``: the loss is backpropagated by the caller, and ``kept`` is a list of
tensors to compare after the backward (a retained ``.grad``, what an observing hook saw), read through
``kept_values``. The batch is ``sharded_cases.Batch``: ``out`` is the model's output, ``plain`` a per-row
tensor every process holds whole (the loop's own global value: muzero-general's ``gradient_scale_batch``).

``CASES`` are exact on both targets. ``WHOLE_AFTER_USE`` register, on a value already used, a hook that needs
the whole gradient: exact over processes (a rank's hook meets the others' in its collectives), refused by the
balanced runtime, which can only hand such a hook one replica's rows at a time (``mgpu_runtime.sharded.hooks``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tests.runtime.sharded_cases import Batch


def _scale(b: Batch) -> torch.Tensor:
    """A per-row divisor, held whole by every process (as muzero's gradient scale of each unroll step)."""
    return b.plain[:, 0].abs() + 1


def scaled_per_row(b: Batch):
    """muzero-general's trainer.py: the per-row loss of an unroll step, its gradient divided per row."""
    per_row = F.cross_entropy(b.out, b.y, reduction="none")
    per_row.register_hook(lambda grad: grad / _scale(b))
    return per_row.mean(), []


def normalised_by_the_batch(b: Batch):
    """A hook that needs every row: the gradient over its norm, less its mean."""
    per_row = (b.out.tanh() ** 2).sum(1)
    per_row.register_hook(lambda grad: grad / grad.norm())
    per_row.register_hook(lambda grad: grad - grad.mean() + 0.01)
    return (per_row * _scale(b)).sum(), []


def hooks_in_order(b: Batch):
    """Two hooks on one value run in the order they were registered (they do not commute)."""
    hidden = b.out.sigmoid()
    hidden.register_hook(lambda grad: grad + 1)
    hidden.register_hook(lambda grad: grad * 3)
    return (hidden * b.plain).sum(), []


def observed(b: Batch):
    """An observing hook (it returns None) sees the whole gradient; retain_grad() keeps it after the hooks."""
    seen: list[torch.Tensor] = []
    per_row = F.cross_entropy(b.out, b.y, reduction="none")
    per_row.retain_grad()
    per_row.register_hook(lambda grad: seen.append(grad * 1) or None)
    per_row.register_hook(lambda grad: grad * _scale(b))
    return per_row.mean(), [seen, per_row]


def used_before_the_hook(b: Batch):
    """muzero's hidden state: the heads use it, then its gradient is halved by a hook (which also sees the
    heads' gradient, as the gathered tensor's hook did), then the dynamics use it."""
    hidden = b.out.tanh()
    heads = (hidden * b.plain).sum(1)
    hidden.register_hook(lambda grad: grad * 0.5)
    hidden.retain_grad()
    dynamics = (hidden ** 2).sum(1)
    return (heads + dynamics).mean(), [hidden]


def observed_after_use(b: Batch):
    """Gradients a hook on a used value keeps (the one given, one computed from it) are whole after the backward."""
    seen: list[torch.Tensor] = []
    hidden = b.out.tanh()
    first = (hidden * b.plain).sum()
    hidden.register_hook(lambda grad: seen.extend([grad, grad * 2]) or None)
    return first + (hidden ** 2).sum(), [seen]


def used_before_row_wise(b: Batch):
    """A row-wise hook on a used value, reading the loop's own values: plain per-row, and held in pieces."""
    hidden = b.out.tanh()
    first = (hidden * b.plain).sum()
    weights = b.out.detach().softmax(1)
    hidden.retain_grad()
    hidden.register_hook(lambda grad: (grad * weights).clamp(-0.2, 0.2) / _scale(b)[:, None])
    hidden.register_hook(lambda grad: torch.where(grad > 0, grad, grad * 2).sum(1, keepdim=True) + grad)
    return first + (hidden ** 3).sum(), [hidden]


def hook_on_the_output(b: Batch):
    """A hook and a retained gradient on the model's output itself."""
    b.out.register_hook(lambda grad: grad * _scale(b)[:, None])
    b.out.retain_grad()
    return F.cross_entropy(b.out, b.y), [b.out]


def held_alike(b: Batch):
    """Values the loop holds whole, computed from the output: a sort over the batch (materialised) and the loss.
    Over processes every rank holds them alike and their gradient in parts; a hook is given the whole."""
    ranked = b.out.sort(0)[0]
    ranked.retain_grad()
    ranked.register_hook(lambda grad: grad / grad.norm())
    loss = (ranked ** 2).mean() + F.cross_entropy(b.out, b.y)
    seen: list[torch.Tensor] = []
    loss.register_hook(lambda grad: seen.append(grad) or None)
    loss.register_hook(lambda grad: grad.clamp(max=0.7))
    loss.retain_grad()
    return loss * 3, [ranked, seen, loss]


CASES = [
    scaled_per_row,
    normalised_by_the_batch,
    hooks_in_order,
    observed,
    used_before_the_hook,
    observed_after_use,
    used_before_row_wise,
    hook_on_the_output,
    held_alike,
]


def whole_after_use(b: Batch):
    hidden = b.out.tanh()
    first = (hidden * b.plain).sum()
    hidden.register_hook(lambda grad: grad / grad.norm())  # WHOLE AFTER USE
    return first + (hidden ** 2).sum(), []


WHOLE_AFTER_USE = [whole_after_use]


def kept_values(kept: list[Any]) -> list[torch.Tensor]:
    """The tensors a case kept, after its backward: a value's ``.grad``, or what a hook saw (each whole)."""
    from mgpu_runtime.sharded import Sharded, materialize

    values = []
    for item in kept:
        if isinstance(item, list):
            values.extend(materialize(seen) for seen in item)
            values.append(torch.tensor(float(len(item))))  # how many times the hook ran
        else:
            gradient = item.grad
            values.append(materialize(gradient) if type(gradient) is Sharded else gradient)
    return [value.detach() for value in values]
