"""Per-replica copies of a module whose gradients flow back to the original parameters.

A replica is a shallow copy of every submodule (``Module._replicate_for_data_parallel``, as torch's own
``replicate`` does). Its parameters are:

* on the original's device: a view of the original (``view_as``), as torch's broadcast gives the first device an
  alias, so several replicas on one device (CPU replicas, or ``device_ids=[0, 0]``) cost no memory and autograd
  sums their gradients into ``.grad``; under ``torch.no_grad()`` the first replica holds the original ``Parameter``
  objects themselves, as torch's does there. A ``forward`` that rebinds a parameter's data (``u.data = ...``, the
  SpectralNorm of many GAN repositories) so changes the module only where DataParallel's did;
* on another device: a differentiable copy (``Tensor.to``), whose backward carries the gradient home.

Either way the replica lists them in ``parameters()``. torch's own replicas have listed none since torch 1.5, so a
``forward`` that finds its device with ``next(self.parameters()).device`` (fatchord/WaveRNN's models, written for
torch 1.0) stops with ``StopIteration`` under ``nn.DataParallel`` on several GPUs; it ran there before, and runs
here, each replica on its own device.

Buffers follow ``nn.DataParallel``'s rule: the first replica shares the originals, so running statistics
updated in its forward persist; the others get copies, so concurrent in-place updates never race.
Every replica is a copy, the first one too, as torch's: attributes a ``forward`` sets on its module (a step
counter, an auxiliary loss kept on ``self``) are lost with the replica, as under ``nn.DataParallel``.
torch's ``replicate`` cannot be used: it only broadcasts to CUDA devices and always copies.

torch's ``replicate`` never calls ``__data_parallel_replicate__``: the Synchronized-BatchNorm packages'
wrappers do, from their own ``replicate`` (``patch_replication_callback`` replaces the wrapper's
``replicate`` method). So does a ``DataParallelModel`` they patch, since its forward replicates through its
``replicate`` method; a plain one leaves such layers per replica, as ``nn.DataParallel`` does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from mgpu_runtime.broadcast_gradients import zeros_once_reached


def replicate(module: nn.Module, devices: Sequence[torch.device]) -> list[nn.Module]:
    """One replica of ``module`` per entry of ``devices``; the first, on the module's own device, shares its
    buffers."""
    home = _home_device(module)
    recording = torch.is_grad_enabled()
    replicas = [
        _replica(module, device, home, index == 0 and device == home, recording) for index, device in enumerate(devices)
    ]
    if recording and len(replicas) > 1:
        _zero_gradients_when_reached(module, replicas)
    return replicas


def _zero_gradients_when_reached(module: nn.Module, replicas: Sequence[nn.Module]) -> None:
    """``nn.DataParallel`` broadcasts the parameters in one autograd Function, whose backward gives a parameter no
    replica used (a decoder skipped by ``forward(x, only_encode=True)``, ERFNet's first phase) a zero gradient as
    soon as any parameter's gradient passes through it; weight decay and momentum then move it. Here each
    parameter is placed on its own, so the same is done by hand (``mgpu_runtime.broadcast_gradients``)."""
    originals = [parameter for parameter in module.parameters() if parameter.requires_grad]
    placed = [parameter for replica in replicas for parameter in replica.parameters() if parameter.grad_fn is not None]
    if originals and placed:
        zeros_once_reached(placed, originals)


def _replica(
    module: nn.Module, device: torch.device, home: torch.device, first: bool, recording: bool
) -> nn.Module:
    """``first``: the first replica, on the module's own device, which shares its buffers (and, when no gradient is
    recorded, its parameters)."""
    copies: dict[nn.Module, nn.Module] = {}
    parameters: dict[torch.Tensor, torch.Tensor] = {}  # shared (tied) parameters stay shared in the replica

    def place_parameter(parameter: torch.Tensor) -> torch.Tensor:
        if parameter not in parameters:
            if device != home:
                parameters[parameter] = parameter.to(device)
            else:
                parameters[parameter] = parameter if first and not recording else parameter.view_as(parameter)
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
                # setattr registers an original Parameter as a parameter, and a copy or a view as a plain attribute
                # (an RNN also points its flat weights at it there) ...
                placed = place_parameter(parameter)
                setattr(replica, name, placed)
                # ... which parameters() then lists too, as DataParallel's replicas did before torch 1.5
                replica._parameters[name] = placed
        for name, buffer in original._buffers.items():
            replica._buffers[name] = buffer if buffer is None or first else buffer.to(device, copy=True)
        return replica

    return copy(module)


def _home_device(module: nn.Module) -> torch.device:
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")
