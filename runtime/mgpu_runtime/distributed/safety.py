"""The safety net: a multi-process run whose model was never wrapped fails loudly instead of drifting apart.

Without DDP every process would train its own copy of the model on its own share of each batch, and the
run would look healthy. The check is functional, so it holds whatever did (or did not) the wrapping:
before an optimizer's first step, every process compares a fingerprint of each parameter's gradient
(present or not, sum, sum of squares) with the other processes'. Gradients that DDP synchronised are
identical everywhere (an all-reduce leaves every rank the same bytes); unsynchronised ones differ, and the
step raises with the reason and the fix. One small all-gather per optimizer, once, so it costs nothing
measurable; it is installed only in a world of more than one process.
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch.optim import Optimizer
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

_verified: weakref.WeakSet[Optimizer] = weakref.WeakSet()


class UnsynchronizedTrainingError(RuntimeError):
    """Processes are about to step parameters whose gradients were never averaged across them."""


def install() -> RemovableHandle:
    """Check every optimizer's first step (for all optimizers, present and future)."""
    return register_optimizer_step_pre_hook(_check_first_step)


def _check_first_step(optimizer: Optimizer, args: tuple, kwargs: dict) -> None:
    if optimizer in _verified:
        return
    _verified.add(optimizer)
    parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    differing = _parameters_differing_across_ranks(parameters)
    if differing:
        shapes = ", ".join(str(tuple(parameters[index].shape)) for index in differing[:5])
        raise UnsynchronizedTrainingError(
            f"mgpu_runtime: {len(differing)} of the {len(parameters)} parameters that "
            f"{type(optimizer).__name__} is about to step (shapes {shapes}{', ...' if len(differing) > 5 else ''}) "
            f"have different gradients in the {dist.get_world_size()} processes. The model they belong to was "
            "never wrapped in DistributedDataParallel, so each process would train its own copy on its own share "
            "of every batch. Wrap it before training: model = mgpu_runtime.DistributedDataParallel(model)."
        )


def _parameters_differing_across_ranks(parameters: list[torch.Tensor]) -> list[int]:
    # nccl gathers only CUDA tensors; gloo takes CPU ones.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    local = (
        torch.stack([_fingerprint(parameter).to(device) for parameter in parameters])
        if parameters
        else torch.zeros(0, 3, dtype=torch.float64, device=device)
    )
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    everyone = torch.stack(gathered).cpu()
    agrees = torch.isclose(everyone, everyone[0], rtol=1e-6, atol=0.0, equal_nan=True).all(dim=2).all(dim=0)
    return [index for index, same in enumerate(agrees.tolist()) if not same]


def _fingerprint(parameter: torch.Tensor) -> torch.Tensor:
    """Whether the parameter has a gradient, and that gradient's sum and sum of squares."""
    if parameter.grad is None:
        return torch.zeros(3, dtype=torch.float64, device=parameter.device)
    gradient = parameter.grad.detach().double()
    return torch.stack([torch.ones_like(gradient.sum()), gradient.sum(), gradient.square().sum()])
