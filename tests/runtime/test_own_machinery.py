"""A DataParallel subclass's own scatter under ddp: where its moves to GPUs go (mgpu_runtime.distributed.own_machinery).

The moves are those of the original's scatter for every GPU, run by each process on the global batch: to this
rank's GPU they go to the process's device, to another rank's they are skipped (the part is dropped anyway).
Checked here on the CPU, the process's device standing for its GPU: no CUDA is touched.
"""

from __future__ import annotations

import torch

from mgpu_runtime.distributed import own_machinery
from mgpu_runtime.distributed.own_machinery import gpu_place, gpus_of_this_rank

CPU = torch.device("cpu")


def test_where_each_kind_of_device_argument_goes_on_rank_1():
    unchanged = own_machinery._UNCHANGED
    assert gpu_place("cuda:1", 1, CPU) == CPU
    assert gpu_place(torch.device("cuda", 1), 1, CPU) == CPU
    assert gpu_place(1, 1, CPU) == CPU
    assert gpu_place("cuda", 1, CPU) == CPU  # the current GPU: this process's
    assert gpu_place("cuda:0", 1, CPU) is None
    assert gpu_place(2, 1, CPU) is None
    for other in ("cpu", torch.float64, None, True, "not a device", torch.zeros(1)):
        assert gpu_place(other, 1, CPU) is unchanged


def test_moves_inside_the_scatter_go_to_this_process_or_nowhere_and_torch_is_given_back():
    to, cuda = torch.Tensor.to, torch.Tensor.cuda
    x = torch.arange(4.0)
    with gpus_of_this_rank(1, CPU):
        assert x.to("cuda:0", non_blocking=True) is x  # another rank's part: left where it is
        assert x.cuda(2) is x
        mine = x.to("cuda:1", non_blocking=True)
        assert mine.device == CPU and torch.equal(mine, x)
        assert x.to(device="cuda:1").device == CPU
        assert x.cuda().device == CPU
        assert x.to(torch.float64).dtype == torch.float64  # not a device: as torch does it
    assert torch.Tensor.to is to and torch.Tensor.cuda is cuda


def test_torch_is_given_back_when_the_scatter_raises():
    to = torch.Tensor.to
    try:
        with gpus_of_this_rank(0, CPU):
            raise ValueError("the scatter failed")
    except ValueError:
        pass
    assert torch.Tensor.to is to
