"""Where a step's cost goes: the runtime against bare torch DDP, phase by phase (issue 22).

    python benchmarks/contract_phases.py [--processes 2] [--models text cnn lm] [--steps 120]

The models, data and both sides are ``bench_contract.py``'s (runtime: the migration's loop on global values;
bare: torch's DDP and a ``DistributedSampler`` of the same global batch). One torchrun job (gloo, CPU, one
thread a process) trains each model each way twice, alternating, and rank 0 prints the median milliseconds of
each phase of a step over the steps after the first 20: loading the batch, the model's forward, the loss, the
accuracy, the backward pass, the optimizer step, and reading the accuracy with ``.item()``. It also prints the
median time of one all-reduce of three floats, the floor of any collective the loop makes on this machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_contract  # noqa: E402 -- the benchmark's models, data and collate, beside this file

WORKER = "--worker"
PHASES = ("data", "forward", "loss", "accuracy", "backward", "optimizer", "item")


def _phases(name: str, side: str, steps: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler

    import mgpu_runtime

    models, _ = bench_contract._models()
    torch.manual_seed(0)
    module = models[name]()
    samples = bench_contract._data(name, (steps + 1) * bench_contract.BATCH)
    collate = bench_contract._pad if name == "text" else None
    job = mgpu_runtime.distributed.process_group.job()
    if side == "runtime":
        model = mgpu_runtime.DistributedDataParallel(module)
        loader = mgpu_runtime.distribute_loader(DataLoader(samples, batch_size=bench_contract.BATCH, shuffle=True, collate_fn=collate))
    else:
        model = torch.nn.parallel.DistributedDataParallel(module)
        job.gradients.note_synchronised(list(module.parameters()))  # torch's DDP sums these (bench_contract.py)
        per_rank = bench_contract.BATCH // dist.get_world_size()
        loader = DataLoader(samples, batch_size=per_rank, sampler=DistributedSampler(samples), collate_fn=collate)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    times: dict[str, list[float]] = {phase: [] for phase in PHASES}
    batches = iter(loader)
    for step in range(steps):
        marks = [time.perf_counter()]
        x, y = next(batches)
        marks.append(time.perf_counter())
        optimizer.zero_grad()
        output = model(x)
        marks.append(time.perf_counter())
        if name == "lm":
            loss = F.cross_entropy(output.view(-1, bench_contract.VOCAB), y.view(-1), ignore_index=-100, reduction="sum")
            loss = loss / y.ne(-100).sum()
        else:
            loss = F.cross_entropy(output, y)
        marks.append(time.perf_counter())
        accuracy = (output.argmax(-1) == y).float().mean()
        marks.append(time.perf_counter())
        if side == "runtime":
            loss.backward()
        else:
            with job.gradients.own_computation():  # torch's own autograd
                loss.backward()
        marks.append(time.perf_counter())
        optimizer.step()
        marks.append(time.perf_counter())
        accuracy.item()
        marks.append(time.perf_counter())
        if step >= 20:
            for phase, start, end in zip(PHASES, marks, marks[1:]):
                times[phase].append((end - start) * 1e3)
    return {phase: statistics.median(values) for phase, values in times.items()}


def worker(models: list[str], steps: int) -> None:
    import torch
    import torch.distributed as dist

    import mgpu_runtime

    mgpu_runtime.setup()
    three = torch.zeros(3)
    took = []
    for _ in range(300):
        started = time.perf_counter()
        dist.all_reduce(three)
        took.append(time.perf_counter() - started)
    if mgpu_runtime.is_main_process():
        print(f"W={mgpu_runtime.world_size()}: one all-reduce of 3 floats, median {statistics.median(took) * 1e3:.3f} ms")
    for name in models:
        for side in ("runtime", "bare", "runtime", "bare"):
            phases = _phases(name, side, steps)
            if mgpu_runtime.is_main_process():
                listed = "  ".join(f"{phase} {value:.2f}" for phase, value in phases.items())
                print(f"W={mgpu_runtime.world_size()} {name} {side:7}: {listed}  (sum {sum(phases.values()):.2f} ms)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[2])
    parser.add_argument("--models", nargs="+", default=["text", "cnn", "lm"])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument(WORKER, action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        worker(arguments.models, arguments.steps)
        return
    for processes in arguments.processes:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
                   __file__, WORKER, "--models", *arguments.models, "--steps", str(arguments.steps)]
        environment = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "MGPU_LOG": "all"}
        done = subprocess.run(command, env=environment, check=True, timeout=3600, capture_output=True, text=True)
        print(done.stdout, end="", flush=True)


if __name__ == "__main__":
    main()
