"""A loss computed inside the model's forward, standing for DataParallel's vector of per-device losses.

``nn.DataParallel`` on N devices gathers a loss returned by ``forward`` as a vector of N per-device losses,
and scripts written for it say so: ``loss.mean()``, ``loss.sum()``, or espnet's
``loss = 1. / ngpu * model(x); loss.backward(loss.new_ones(ngpu))``. Both families return the exact loss
of the whole batch instead (``balanced/outputs.py``, ``distributed/losses.py``), as a 0-dim tensor, so the
mean and the sum of it are itself and ``loss.backward()`` is exact. A gradient of N values for it, though,
does not fit a 0-dim tensor: torch refuses it (a crash at the first step where the original trained).

``DeviceLosses`` is that 0-dim loss, marked as standing for every device's: a ``backward`` with a gradient of
N equal values (``new_ones(n)``, ``torch.ones(n)``, ``c * ones``) is the gradient of each device's loss
taken once, N times the gradient of the exact loss, which with espnet's ``1. / ngpu`` scaling is exactly
the original's gradient. Unequal per-device weights have no meaning once the devices' losses are one exact
loss, so they raise. Every 0-dim floating result computed from it (``1. / ngpu * loss``, ``loss.mean()``)
is marked too; anything else is a plain tensor, and pickling, ``torch.save`` and ``deepcopy`` see a plain
tensor (a checkpoint holding the loss loads with ``weights_only=True``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass

from mgpu_runtime.structure import children, rebuild


class DeviceLosses(torch.Tensor):
    """A 0-dim loss standing for DataParallel's per-device losses (see the module doc)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.backward:
            args, kwargs = _summed_gradient(args, kwargs)
        with DisableTorchFunctionSubclass():
            result = func(*args, **kwargs)
        return _marked(result) if type(result) is torch.Tensor else result

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        return copy.deepcopy(self.as_subclass(torch.Tensor), memo)


def mark_device_losses(output: Any) -> Any:
    """``output`` with each 0-dim floating tensor (a loss computed in ``forward``) a ``DeviceLosses``."""
    if isinstance(output, torch.Tensor):
        return _marked(output)
    parts = children(output)
    if parts is None:
        return output
    marked = [mark_device_losses(part) for part in parts]
    if all(new is old for new, old in zip(marked, parts)):
        return output  # nothing to mark: the model's own object, not a rebuilt copy
    return rebuild(output, marked)


def _marked(tensor: torch.Tensor) -> torch.Tensor:
    if (
        tensor.dim() == 0
        and tensor.is_floating_point()
        and type(tensor) is torch.Tensor
    ):
        return tensor.as_subclass(DeviceLosses)
    return tensor


def _summed_gradient(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``backward``'s arguments with a gradient of N per-device values turned into their sum."""
    in_kwargs = "gradient" in kwargs
    gradient = kwargs["gradient"] if in_kwargs else (args[1] if len(args) > 1 else None)
    if not isinstance(gradient, torch.Tensor) or gradient.dim() != 1:
        return args, kwargs
    with DisableTorchFunctionSubclass():
        if gradient.numel() == 0 or not bool((gradient == gradient[0]).all()):
            raise ValueError(
                "mgpu_runtime: loss.backward(gradient) with per-device values that are not all equal "
                f"({gradient.tolist()}): the loss is the exact loss of the whole batch, no longer one per device; "
                "weigh the loss itself (or call loss.backward())"
            )
        summed = gradient.sum()
    if in_kwargs:
        return args, {**kwargs, "gradient": summed}
    return (args[0], summed, *args[2:]), kwargs
