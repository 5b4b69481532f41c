"""Per-replica copies of a module whose gradients flow back to the original parameters.

A replica is a shallow copy of every submodule (``Module._replicate_for_data_parallel``, as torch's own
``replicate`` does). Its parameters are:

* on the original's device: the original ``Parameter`` objects themselves, so several replicas on one device
  (CPU replicas, or ``device_ids=[0, 0]``) cost no memory and autograd sums their gradients into ``.grad``;
* on another device: a differentiable copy (``Tensor.to``), whose backward carries the gradient home.

Buffers follow ``nn.DataParallel``'s rule: the first replica shares the originals, so running statistics
updated in its forward persist; the others get copies, so concurrent in-place updates never race.
torch's ``replicate`` cannot be used: it only broadcasts to CUDA devices and always copies.

After replicating, every module that defines ``__data_parallel_replicate__(ctx, copy_id)`` is told its copy
number with a context shared by the copies of that module, as the Synchronized-BatchNorm package's
``DataParallelWithCallback``/``patch_replication_callback`` arrange around ``nn.DataParallel.replicate``:
its BatchNorm then synchronises its statistics across the replica threads instead of silently becoming
per-replica BatchNorm.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def replicate(module: nn.Module, devices: Sequence[torch.device]) -> list[nn.Module]:
    """One replica of ``module`` per entry of ``devices``; replica 0 on the module's own device is the module."""
    home = _home_device(module)
    replicas = [module] if devices[0] == home else []
    for device in devices[len(replicas) :]:
        replicas.append(_replica(module, device, home))
    _run_replication_callbacks(replicas)
    return replicas


class _CallbackContext:
    """What the copies of one module share in ``__data_parallel_replicate__`` (attributes they set)."""


def _run_replication_callbacks(replicas: Sequence[nn.Module]) -> None:
    if len(replicas) < 2 or not any(hasattr(m, "__data_parallel_replicate__") for m in replicas[0].modules()):
        return
    contexts = [_CallbackContext() for _ in replicas[0].modules()]
    for copy_id, replica in enumerate(replicas):
        for context, module in zip(contexts, replica.modules()):
            if hasattr(module, "__data_parallel_replicate__"):
                module.__data_parallel_replicate__(context, copy_id)


def _replica(module: nn.Module, device: torch.device, home: torch.device) -> nn.Module:
    copies: dict[nn.Module, nn.Module] = {}
    parameters: dict[torch.Tensor, torch.Tensor] = {}  # shared (tied) parameters stay shared in the replica

    def place_parameter(parameter: torch.Tensor) -> torch.Tensor:
        if parameter not in parameters:
            parameters[parameter] = parameter if device == home else parameter.to(device)
        return parameters[parameter]

    def copy(original: nn.Module) -> nn.Module:
        if original in copies:
            return copies[original]
        replica = original._replicate_for_data_parallel()
        copies[original] = replica
        for name, child in original._modules.items():
            replica._modules[name] = None if child is None else copy(child)
        for name, parameter in original._parameters.items():
            if parameter is None:
                replica._parameters[name] = None
            else:
                # setattr registers an original Parameter as a parameter, and a copy as a plain attribute
                setattr(replica, name, place_parameter(parameter))
        for name, buffer in original._buffers.items():
            replica._buffers[name] = None if buffer is None else buffer.to(device, copy=True)
        return replica

    return copy(module)


def _home_device(module: nn.Module) -> torch.device:
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")
