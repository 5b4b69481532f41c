"""A rank that holds no part of a batch: DataParallel ran no replica on its device, DDP still needs its backward.

``torch.chunk`` cuts a batch of ``R`` rows into chunks of ``ceil(R / W)`` rows, which can be fewer than ``W``:
5 rows over 3 devices is 2 + 2 + 1, but 4 rows is 2 + 2, and the last batch of an epoch, 19 rows over 8 GPUs,
is 7 chunks of 3 and 1. DataParallel ran replicas on the first devices only. Here every rank runs its
replica's forward and backward, since DDP's gradient reduction waits for every rank; a rank past the chunks
(an *idle* rank) runs it on no rows, and its gradients are zeros.

Most forwards take zero rows. Some cannot: ``x.view(x.size(0), -1)``, the flatten of half the classifiers
written before ``torch.flatten``, cannot infer ``-1`` from zero elements, and ssd.pytorch's heads end that
way. For those, ``run`` runs the forward again on a stand-in of one row per tensor (ones: a valid index, length
and mask, and finite through a log), or of two where one fails (a ``BatchNorm1d`` over the flattened features in
training, MobileFaceNet's head, takes no single value per channel), without gradient, and keeps nothing of it but
its structure: each output
tensor cut to no rows, and, for the parameters that forward reached, a zero that autograd connects to them, so
that the backward gives each of them a zero gradient, as the forward on no rows would have, and DDP's reducer
sees the parameters a real row uses. Nothing of the stand-in's values reaches a gradient, so a value it makes
infinite cannot turn one into NaN. Its effects on the rank are undone: the module's buffers (BatchNorm's running
statistics) are put back and its draws from the generators are given back (``torch.random.fork_rng``), as the
device DataParallel left idle drew nothing and kept nothing.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from mgpu_runtime.sharded.scatter_gather import walk

_IDLE: contextvars.ContextVar[bool] = contextvars.ContextVar("mgpu_runtime_idle_replica", default=False)


class marked:
    """While active, the next replica forward (``take``) is an idle rank's."""

    def __init__(self, idle: bool) -> None:
        self._idle = idle
        self._token: contextvars.Token[bool] | None = None

    def __enter__(self) -> None:
        self._token = _IDLE.set(self._idle)

    def __exit__(self, *_: object) -> None:
        assert self._token is not None
        _IDLE.reset(self._token)


def take() -> bool:
    """Whether the replica forward about to run is an idle rank's; a module it runs in turn is not told again."""
    idle = _IDLE.get()
    if idle:
        _IDLE.set(False)
    return idle


def run(call: Callable[..., Any], module: nn.Module, inputs: tuple, kwargs: dict) -> Any:
    """``call(*inputs, **kwargs)``, the idle rank's forward of ``module`` on no rows; if that raises, the
    stand-in forward's structure instead (see the module doc). If all raise, the first error is raised, with a
    note that says why this rank ran on no rows."""
    saved = [(buffer, buffer.detach().clone()) for buffer in module.buffers()]
    try:
        return call(*inputs, **kwargs)
    except Exception as no_rows:
        _put_back(saved)
        for rows in (1, 2):  # two where one fails: a BatchNorm1d in training takes no single value per channel
            try:
                return _stand_in(call, module, inputs, kwargs, saved, rows)
            except Exception:
                continue
        no_rows.add_note(
            "mgpu_runtime: this process holds no rows of this batch (torch.chunk made fewer chunks than "
            "there are processes; DataParallel ran no replica on the devices past them), and the model's "
            "forward fails on zero rows, and on stand-in rows too"
        )
        raise no_rows from None


def _stand_in(call: Callable[..., Any], module: nn.Module, inputs: tuple, kwargs: dict, saved: list, rows: int) -> Any:
    def filled(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 0 or tensor.shape[0] > 0:
            return tensor
        return tensor.new_ones((rows, *tensor.shape[1:]))

    stand_in = (walk(inputs, filled), walk(kwargs, filled))
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            output = call(*stand_in[0], **stand_in[1])
    finally:
        _put_back(saved)
    trainable = {id(parameter) for parameter in module.parameters() if parameter.requires_grad}
    reached = [parameter for parameter in _leaves(output) if id(parameter) in trainable]
    link = _zero_linked_to(reached)
    return walk(output, lambda tensor: _no_rows(tensor, link))


def _no_rows(tensor: torch.Tensor, link: torch.Tensor | None) -> torch.Tensor:
    kept = tensor.detach() if tensor.dim() == 0 else tensor.detach()[:0]
    if link is None or not tensor.requires_grad:  # a table the forward returns as it is (SSD's priors) stays one
        return kept
    return kept + link.to(kept.dtype)


def _zero_linked_to(parameters: list[torch.Tensor]) -> torch.Tensor | None:
    """A 0-dim zero whose backward gives each of ``parameters`` a zero gradient (a sum over none of its elements)."""
    if not parameters:
        return None
    return torch.stack([parameter.reshape(-1)[:0].sum().to(torch.float64) for parameter in parameters]).sum()


def _leaves(output: Any) -> Iterator[torch.Tensor]:
    """The leaf tensors (parameters) the autograd graph of ``output``'s tensors reaches."""
    pending: list[Any] = []

    def root(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.grad_fn is not None:
            pending.append(tensor.grad_fn)
        return tensor

    walk(output, root)
    seen: set[int] = set()
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None:
            yield variable
        pending.extend(following for following, _ in node.next_functions if following is not None)


def _put_back(saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for buffer, value in saved:
            buffer.copy_(value)
