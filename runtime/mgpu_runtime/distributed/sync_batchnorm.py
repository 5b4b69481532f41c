"""``SyncBatchNorm`` that runs on the CPU: the statistics of the global batch, with the original's gradient.

torch's ``SyncBatchNorm`` refuses CPU tensors once a process group exists, which a migrated script always
has, even as one process: a ``--sync-bn`` migration could not run where its original ran. On the CPU the
runtime gives such layers this forward instead (``DistributedDataParallel`` does it when it wraps):

* one process, or evaluation: plain BatchNorm (one process holds the whole batch);
* several processes, training: the per-channel sum, sum of squares and count are summed over the ranks
  (one collective), and the batch is normalised with the global mean and biased variance; running
  statistics are updated with the global mean and unbiased variance, as BatchNorm over the whole batch
  would. The collective's backward sums the ranks' gradients of the statistics, so that after the DDP
  hook's sum the gradient is the one of BatchNorm over the global batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from mgpu_runtime.pickling import as_class


class _SharedStatistics(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local: torch.Tensor) -> torch.Tensor:
        total = local.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, gradient: torch.Tensor) -> torch.Tensor:
        # Each rank's gradient of the statistics comes from its own rows; they depend on every rank's sums.
        summed = gradient.clone()
        dist.all_reduce(summed)
        return summed


class CpuSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """``nn.SyncBatchNorm``'s layer (same parameters, buffers and ``state_dict``) with a forward that runs on
    the CPU (see the module doc). Not a subclass of it: torch's DDP refuses any ``SyncBatchNorm`` on a CPU."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(input)
        self._check_input_dim(input)
        channels = input.shape[1]
        dims = [0, *range(2, input.dim())]
        count = torch.tensor([input.numel() // channels], dtype=input.dtype, device=input.device)
        total = _SharedStatistics.apply(torch.cat([input.sum(dims), (input * input).sum(dims), count]))
        rows = total[-1]
        mean = total[:channels] / rows
        variance = total[channels : 2 * channels] / rows - mean * mean
        shape = [1, channels] + [1] * (input.dim() - 2)
        output = (input - mean.view(shape)) * torch.rsqrt(variance.view(shape) + self.eps)
        if self.affine:
            output = output * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:
            self._update_running_statistics(mean.detach(), variance.detach() * rows / (rows - 1))
        return output

    def __reduce_ex__(self, protocol: int):
        return as_class(self, nn.SyncBatchNorm)  # the layer the original held

    @torch.no_grad()
    def _update_running_statistics(self, mean: torch.Tensor, unbiased_variance: torch.Tensor) -> None:
        self.num_batches_tracked.add_(1)
        factor = 1.0 / self.num_batches_tracked.item() if self.momentum is None else self.momentum
        self.running_mean.mul_(1 - factor).add_(mean * factor)
        self.running_var.mul_(1 - factor).add_(unbiased_variance * factor)


def run_on_cpu(module: nn.Module) -> None:
    """Give every ``nn.SyncBatchNorm`` in ``module`` the CPU-capable forward."""
    for layer in module.modules():
        if type(layer) is nn.SyncBatchNorm:
            layer.__class__ = CpuSyncBatchNorm
