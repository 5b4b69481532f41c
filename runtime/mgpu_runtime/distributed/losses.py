"""Losses whose value is the global batch's and whose gradient is the original's.

The original computed each loss over the global batch. Each rank here sees its span of ``b_r`` of the
``B`` rows, and the DDP hook (``ddp.py``) sums the ranks' gradients weighted by ``w_r = b_r / B``, which is
exact for a mean over the rank's rows and for nothing else. A mean over tokens, valid rows or elements
weighs by what it averaged over, and a sum by nothing at all. So a loss is split into a numerator and a
denominator summed over ranks (one two-number collective), and the rank returns

    value     = (sum of numerators) / (sum of denominators)        the global loss, on every rank
    gradient  = of numerator_r / (sum of denominators * w_r)        so that the weighted sum is the original's

Because the value is the global one, whatever the script computes from it (a weighted sum of several
losses, a square, a log) has the original's gradient too.

Two ways a loss gets there:

* **Watched** (``watching``): while a batch of the distributed loader is out (``data.py`` enters the watch
  for each batch it yields, until the next is asked for), every call of a torch loss function that
  ``mgpu_runtime.losses`` knows (``F.cross_entropy``, ``F.nll_loss``, ``F.mse_loss``, ``F.l1_loss``,
  the BCEs ..., also through their ``nn`` modules, in the loop, in a loss function or inside the model's
  ``forward``) with ``reduction='mean'``/``'batchmean'``/``'sum'`` is made global this way: cross-entropy
  over the weight of its non-ignored targets, element-wise losses over their elements, sums summed.
  ``reduction='none'`` is left to the script. Outside the model's forward, so are full reductions
  (``torch.sum(x)``, ``x.mean()``, no ``dim``) of a tensor that requires grad and holds the rank's rows:
  the penalty of a loss function, the sum of a ``reduction='none'`` loss (``mgpu_runtime.losses``).
* **``DistributedCriterion(criterion)``**, the codemod's wrapper: a criterion whose computation went through
  a watched function is already global; any other (a callable that reduces by its own arithmetic) is taken
  to be a mean over the rank's rows (numerator ``loss * b_r``, denominator ``b_r``), or a sum when its
  ``reduction`` says so. With no distributed batch out (data left whole: every rank computed the same
  global loss) it is the criterion itself, and so is it in a world of one.

The watch also draws dropout as the original did: one mask for the global batch, of which the rank keeps
its rows, and so random numbers drawn per row (``torch.randn(b_size, nz)``, ``torch.randn_like(std)``,
``mgpu_runtime.randomness``), so masks are the original's and every rank's generator advances as
the original process's did (the loader keeps the ranks' generators in step with rank 0's, ``data.py``).

An optimizer's ``step()`` runs unwatched (global step hooks take the mode off the stack for it): its
arithmetic is neither a loss nor a draw for the rows, and it is half the calls of a CPU step.

Every watched call is a collective, so every rank must make the same loss calls in the same order, as DDP
already requires of forward and backward. A rank with no rows contributes zero to both sums and a zero
gradient.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode

from mgpu_runtime.distributed import lockstep
from mgpu_runtime.distributed.process_group import setup, world_size
from mgpu_runtime.distributed.share import current_share, gradient_weight
from mgpu_runtime.losses import (
    FULL_REDUCTIONS,
    WATCHED,
    LossParts,
    loss_parts,
    reduction_parts,
)
from mgpu_runtime.randomness import (
    DRAWS,
    PER_ROW,
    apply_mask,
    dropout_call,
    global_mask,
    per_row_draw,
)


class DistributedCriterion(nn.Module):
    """Wraps a criterion (module or function) at construction: ``criterion = DistributedCriterion(criterion)``."""

    def __init__(self, criterion: Callable[..., Any]) -> None:
        super().__init__()
        setup()
        self.criterion = criterion

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        reduction = getattr(self.criterion, "reduction", None)
        if world_size() == 1 or current_share() is None or reduction == "none":
            return self.criterion(*args, **kwargs)
        with watching() as watch:
            before = watch.calls
            loss = self.criterion(*args, **kwargs)
            if watch.calls > before:
                return loss
        what = type(self.criterion).__name__ if isinstance(self.criterion, nn.Module) else _name(self.criterion)
        if reduction == "sum":
            return global_loss(LossParts(loss, None), what)
        rows = current_share().rows
        return global_loss(LossParts(loss * rows if rows else torch.nan_to_num(loss) * 0.0, torch.tensor(rows)), what)


def global_loss(parts: LossParts, what: str) -> torch.Tensor:
    """The global loss of this rank's ``parts`` (see the module doc): one collective, reducing the loss ``what``."""
    numerator = parts.numerator
    denominator = parts.denominator
    if denominator is None:  # a sum: each rank's counts once; only rank 0's "1" makes the denominators sum to 1
        denominator = torch.tensor(float(dist.get_rank() == 0))
    # At least float32: a half-precision sum of token counts overflows at 65504.
    dtype = torch.promote_types(numerator.dtype, torch.float32)
    totals = torch.stack([numerator.detach().to(dtype), denominator.to(numerator.device, dtype)])
    # Each rank's count of loss reductions rides along: a loss some ranks skip is named, not summed with
    # another collective's tensor or waited for until the timeout (lockstep.py).
    totals = torch.cat([totals, lockstep.loss_counts(totals)])
    with lockstep.loss_reduction(what):
        dist.all_reduce(totals)
    lockstep.check_loss_counts(totals[2:], what)
    total_numerator, total_denominator = totals[:2].unbind()
    weight = gradient_weight(world_size())
    if weight == 0.0:
        # No rows here: a zero that still reaches the parameters, so DDP's backward runs on every rank.
        contribution = torch.nan_to_num(numerator) * 0.0
    else:
        contribution = numerator / (total_denominator.to(numerator.dtype) * weight)
    value = (total_numerator / total_denominator).to(numerator.dtype)
    # Exactly the global value on every rank (x - x is exactly 0), with the contribution's gradient.
    return value + (contribution - contribution.detach())


_SEEN = DRAWS | PER_ROW | WATCHED | FULL_REDUCTIONS


class _GlobalLosses(TorchFunctionMode):
    """Makes each watched loss call of this thread global (see the module doc) and counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.model_depth = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _SEEN:  # nearly every call: the fast path (the mode's own dispatch costs far more)
            return func(*args, **kwargs)
        share = current_share()
        parts = None
        if share is not None and func in DRAWS:
            call = dropout_call(args, kwargs, share.rows)
            if call is not None:
                source, p, inplace = call
                mask = global_mask(source, share.total, p)[share.start : share.start + share.rows]
                return apply_mask(source, mask, inplace)
        elif share is not None and func in PER_ROW:
            draw = per_row_draw(func, args, kwargs, share.rows)
            if draw is not None:
                return draw(share.total)[share.start : share.start + share.rows]
        elif share is not None and func in WATCHED:
            parts = loss_parts(func, args, kwargs)
        elif share is not None and func in FULL_REDUCTIONS and not self.model_depth:
            parts = reduction_parts(func, args, kwargs, share.rows)
        if parts is None:
            return func(*args, **kwargs)
        self.calls += 1
        return global_loss(parts, _name(func))


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or type(function).__name__


_active = threading.local()
WATCH_VARIABLE = "MGPU_LOSS_WATCH"
"""``MGPU_LOSS_WATCH=0``: no watch (read at each batch). Losses stay the rank's own, weighted by its rows (exact
for per-row means only), dropout and per-row draws the rank's own; ``DistributedCriterion`` still combines by rows."""


@contextlib.contextmanager
def watching() -> Iterator[_GlobalLosses]:
    """Watch this thread's loss calls (see the module doc); re-entering keeps the watch already active."""
    active = getattr(_active, "mode", None)
    if active is not None or world_size() == 1 or os.environ.get(WATCH_VARIABLE, "").strip() == "0":
        yield active or _GlobalLosses()
        return
    mode = _GlobalLosses()
    _active.mode = mode
    try:
        with mode:
            try:
                yield mode
            finally:
                _resume_after_step()  # a step that raised left the watch off the stack
    finally:
        _active.mode = None


def _pause_for_step(optimizer, args, kwargs) -> None:
    """An optimizer's step runs unwatched: its arithmetic on parameters and their gradients is neither a loss
    nor a draw for the batch's rows (a full sum of a gradient whose first dimension happens to equal the
    rank's rows is no loss), and a CPU optimizer makes about half the torch calls of a step, each of which the
    mode's dispatch would slow down."""
    mode = getattr(_active, "mode", None)
    depth = torch._C._len_torch_function_stack()
    if mode is None or getattr(_active, "paused", None) is not None or not depth:
        return
    if torch._C._get_function_stack_at(depth - 1) is not mode:
        return  # another mode entered above the watch: leave the stack as it is
    torch._C._pop_torch_function_stack()
    _active.paused = mode


def _resume_after_step(*_: Any) -> None:
    mode = getattr(_active, "paused", None)
    if mode is not None:
        _active.paused = None
        torch._C._push_on_torch_function_stack(mode)


register_optimizer_step_pre_hook(_pause_for_step)
register_optimizer_step_post_hook(_resume_after_step)


@contextlib.contextmanager
def inside_model() -> Iterator[None]:
    """The wrapped model's forward: its full reductions are the model's computation, not loss terms."""
    mode = getattr(_active, "mode", None)
    if mode is None:
        yield
        return
    mode.model_depth += 1
    try:
        yield
    finally:
        mode.model_depth -= 1
