"""Every case of ``tests/runtime/hook_cases.py`` over real processes: each rank holds its rows, as the loader gives.

    torchrun --nproc_per_node=W hook_cases_job.py OUT.json

Each rank computes the case on its piece (``RankGroup``), with autograd's convention installed
(``mgpu_runtime.sharded.gradients``): a hook on a global value is given the whole gradient (its collectives
meet the other ranks'). Then the gradient of ``x`` is gathered from its pieces and that of the parameter ``w``
summed over the ranks, as DDP and the step would, and what the case kept is made whole. Rank 0 writes, per case
and batch size, the largest difference from the same case on the whole batch in this process.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from mgpu_runtime.sharded import RankGroup, Sharded, materialize
from mgpu_runtime.sharded.gradients import Gradients
from mgpu_runtime.structure import chunk_sizes
from tests.runtime.hook_cases import CASES, WHOLE_AFTER_USE, kept_values
from tests.runtime.sharded_cases import Batch, difference, global_data

ROWS = (7, 5, 2)


def main(output: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = RankGroup(rank, world, torch.device("cpu"))
    gradients = Gradients(group)
    gradients.install()
    results = {}
    for rows in ROWS:
        splits = chunk_sizes(rows, world)
        splits += [0] * (world - len(splits))
        start = sum(splits[:rank])

        def cut(tensor: torch.Tensor, start: int = start, splits: list[int] = splits) -> Sharded:
            return Sharded([tensor[start : start + splits[rank]]], splits, group)

        for case in [*CASES, *WHOLE_AFTER_USE]:
            data = global_data(rows)
            whole = _whole(case, data, gradients)
            x = data["x"][start : start + splits[rank]].clone().requires_grad_(True)
            w = data["w"].clone().requires_grad_(True)
            sharded_x = Sharded([x], splits, group)
            batch = Batch(sharded_x, w, sharded_x @ w, cut(data["y"]), cut(data["tokens"]), cut(data["mask"]), data["plain"])
            loss, kept = case(batch)
            loss.backward()
            x_gradient = materialize(Sharded([x.grad], splits, group))
            w_gradient = w.grad.clone()
            dist.all_reduce(w_gradient)
            found = [materialize(loss).detach(), x_gradient, w_gradient, *kept_values(kept)]
            worst = max(difference(a, b) for a, b in zip(found, whole)) if len(found) == len(whole) else float("inf")
            results[f"{case.__name__}/{rows}"] = worst
    if rank == 0:
        with open(output, "w") as file:
            json.dump(results, file)
    gradients.uninstall()
    dist.destroy_process_group()


def _whole(case, data, gradients):
    x = data["x"].clone().requires_grad_(True)
    w = data["w"].clone().requires_grad_(True)
    with gradients.own_computation():  # one process's own arithmetic: autograd as it is
        loss, kept = case(Batch(x, w, x @ w, data["y"], data["tokens"], data["mask"], data["plain"]))
        loss.backward()
    return [loss.detach(), x.grad, w.grad, *kept_values(kept)]


if __name__ == "__main__":
    main(sys.argv[1])
