"""The runtime contract's cost per step, against bare torch DDP doing the same work (issue 22).

    python benchmarks/bench_contract.py [--processes 2 3 4] [--blocks 9] [--steps 4] [--models lm cnn text]
                                        [--fail-together]

For each world size, one torchrun job (gloo, CPU, one thread a process) trains each model two ways, in
alternating blocks of steps (each pair in a random order, the same on every rank):

* **runtime**: what a migration runs: ``mgpu_runtime.DistributedDataParallel``, ``distribute_loader`` over
  the original loader (global batches, each rank loading its rows), the loop on ``Sharded`` values (the loss of
  the global batch, a token count, an accuracy of the global batch read with ``.item()``);
* **bare**: what a hand-written DDP script runs for the same global batch: torch's DDP, a
  ``DistributedSampler`` loader of ``batch / W`` rows per rank, the loss and the accuracy of the rank's rows;
* **exact** (with ``--exact``): a hand-written DDP script that trains and reads what the migration does, the
  values of the global batch, with the fewest collectives a careful author would write: the loss's token count
  and the accuracy's correct rows summed in one all-reduce before the backward pass (the loss is the rank's
  summed loss over the global count, times W, since DDP averages the gradients). Its ratio to **bare** is the
  price of the global values themselves; the runtime's ratio to it is what the runtime adds to that price.

The models: ``lm``, a 2-layer transformer language model with dropout (token loss over ``ignore_index``);
``cnn``, a convolutional classifier with BatchNorm; ``text``, an embedding and GRU classifier over batches
padded to their longest sequence by a ``collate_fn`` of the script's own (each rank then collates the whole
global batch and keeps its rows). Rank 0 prints, per model, the median step time of each side over the
blocks, their ratio, and the ratio of the medians of each block pair. ``--memory`` instead runs each side in a
job of its own and prints each rank's peak resident memory (``ru_maxrss``), and the ratio.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import time

WORKER = "--worker"
BATCH = 24
VOCAB, LENGTH, CLASSES = 400, 32, 10


def _models():
    import torch
    from torch import nn

    class LanguageModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 96)
            layer = nn.TransformerEncoderLayer(96, 4, 192, dropout=0.1, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(96, VOCAB)

        def forward(self, ids):
            return self.head(self.encoder(self.embed(ids)))

    class ConvNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            )
            self.head = nn.Linear(32, CLASSES)

        def forward(self, images):
            return self.head(self.features(images).flatten(1))

    class TextClassifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 64, padding_idx=0)
            self.rnn = nn.GRU(64, 64, batch_first=True)
            self.head = nn.Linear(64, CLASSES)

        def forward(self, ids):
            output, _ = self.rnn(self.embed(ids))
            return self.head(output.mean(1))

    return {"lm": LanguageModel, "cnn": ConvNet, "text": TextClassifier}, torch


def _data(name: str, rows: int):
    import torch

    generator = torch.Generator().manual_seed(1)
    if name == "lm":
        ids = torch.randint(1, VOCAB, (rows, LENGTH), generator=generator)
        return [(ids[i], torch.where(ids[i] % 5 == 0, -100, ids[i])) for i in range(rows)]
    if name == "cnn":
        images = torch.randn(rows, 3, 32, 32, generator=generator)
        return [(images[i], int(i % CLASSES)) for i in range(rows)]
    lengths = torch.randint(8, LENGTH, (rows,), generator=generator)
    return [(torch.randint(1, VOCAB, (int(length),), generator=generator), int(i % CLASSES)) for i, length in enumerate(lengths)]


def _pad(samples):
    import torch
    from torch.nn.utils.rnn import pad_sequence

    ids, labels = zip(*samples)
    return pad_sequence(list(ids), batch_first=True), torch.tensor(labels)


def _forever(loader):
    while True:
        yield from loader


def _trainer(name: str, side: str, rows: int):
    """One step of ``name`` trained the ``side`` way, as a closure over its own model, data and optimizer."""
    models, torch = _models()
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler

    import mgpu_runtime

    torch.manual_seed(0)
    module = models[name]()
    samples = _data(name, rows)
    collate = _pad if name == "text" else None
    world = dist.get_world_size()
    if side == "runtime":
        model = mgpu_runtime.DistributedDataParallel(module)
        loader = mgpu_runtime.distribute_loader(DataLoader(samples, batch_size=BATCH, shuffle=True, collate_fn=collate))
    elif side == "exact" and name == "text":
        # Padded to the longest sequence of the global batch, as under DataParallel (the GRU's mean runs over the
        # padding): each rank collates the global batch and keeps its rows, as the runtime's loader does.
        model = torch.nn.parallel.DistributedDataParallel(module)
        whole = DataLoader(samples, batch_size=BATCH, shuffle=True, collate_fn=collate)
        loader = ((x.chunk(world)[dist.get_rank()], y.chunk(world)[dist.get_rank()]) for x, y in _forever(whole))
    else:  # bare, exact
        model = torch.nn.parallel.DistributedDataParallel(module)
        sampler = DistributedSampler(samples, shuffle=True)
        loader = DataLoader(samples, batch_size=BATCH // world, sampler=sampler, collate_fn=collate)
    if side != "runtime":
        # torch's DDP sums these gradients itself: the job's sum before an optimizer step (of gradients no runtime
        # wrapper reduced, sharded/gradients.py) must not sum them again (W times the gradient, and a collective).
        mgpu_runtime.distributed.process_group.job().gradients.note_synchronised(list(module.parameters()))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = iter(loader)

    def step() -> None:
        nonlocal batches
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        optimizer.zero_grad()
        output = model(x)
        if side == "exact":
            hits = (output.argmax(-1) == y).sum()
            if name == "lm":
                counts = torch.stack([y.ne(-100).sum(), hits, torch.tensor(y.numel())])
            else:
                counts = torch.stack([hits, torch.tensor(len(y))])
            dist.all_reduce(counts)  # one collective: the global denominators, the global correct rows
            summed = F.cross_entropy(output.reshape(-1, output.shape[-1]), y.reshape(-1), ignore_index=-100, reduction="sum")
            loss = summed * world / counts[0]
            accuracy = counts[-2].float() / counts[-1]
            with mgpu_runtime.distributed.process_group.job().gradients.own_computation():
                loss.backward()
            optimizer.step()
            accuracy.item()
            return
        if name == "lm":
            loss = F.cross_entropy(output.view(-1, VOCAB), y.view(-1), ignore_index=-100, reduction="sum")
            loss = loss / y.ne(-100).sum()
        else:
            loss = F.cross_entropy(output, y)
        accuracy = (output.argmax(-1) == y).float().mean()
        if side == "runtime":
            loss.backward()
        else:
            with mgpu_runtime.distributed.process_group.job().gradients.own_computation():  # torch's own autograd
                loss.backward()
        optimizer.step()
        accuracy.item()

    return step


def worker(
    models: list[str], blocks: int, steps: int, memory_side: str | None, exact: bool = False, together: bool = False
) -> None:
    import mgpu_runtime

    mgpu_runtime.setup()
    if together:
        mgpu_runtime.fail_together()  # the runtime's side only: the others wrap in torch's DDP
    rows = (2 * blocks + 2) * steps * BATCH
    for name in models:
        if memory_side is not None:
            step = _trainer(name, memory_side, rows)
            for _ in range((blocks + 1) * steps):
                step()
            continue
        names = ("runtime", "bare", "exact") if exact else ("runtime", "bare")
        sides = {side: _trainer(name, side, rows) for side in names}
        for step in sides.values():
            for _ in range(steps):  # warm-up
                step()
        timings: dict[str, list[float]] = {side: [] for side in names}
        order = random.Random(0)
        for _ in range(blocks):
            for side in order.sample(list(names), len(names)):
                mgpu_runtime.barrier()
                started = time.perf_counter()
                for _ in range(steps):
                    sides[side]()
                timings[side].append((time.perf_counter() - started) / steps)
        if mgpu_runtime.is_main_process():
            runtime, bare = statistics.median(timings["runtime"]), statistics.median(timings["bare"])
            pairs = statistics.median(r / b for r, b in zip(timings["runtime"], timings["bare"]))
            print(f"W={mgpu_runtime.world_size()} {name}: runtime {runtime * 1e3:.2f} ms, bare DDP {bare * 1e3:.2f} ms "
                  f"per step (medians of {blocks} blocks of {steps}): {runtime / bare:.3f}x; median of pair ratios "
                  f"{pairs:.3f}x", flush=True)
            if exact:
                own = statistics.median(timings["exact"])
                print(f"W={mgpu_runtime.world_size()} {name}: hand-written exact DDP {own * 1e3:.2f} ms: "
                      f"{own / bare:.3f}x bare; runtime {runtime / own:.3f}x exact", flush=True)
    if memory_side is not None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"W={mgpu_runtime.world_size()} rank {mgpu_runtime.rank()} {memory_side}: peak {peak:.1f} MiB", flush=True)


def _launch(processes: int, arguments: list[str]) -> str:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               __file__, WORKER, *arguments]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "MGPU_LOG": "all"}
    done = subprocess.run(command, env=environment, check=True, timeout=3600, capture_output=True, text=True)
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--blocks", type=int, default=9)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--models", nargs="+", default=["lm", "cnn", "text"])
    parser.add_argument("--memory", action="store_true", help="peak memory per rank, each side in its own job")
    parser.add_argument("--exact", action="store_true", help="also a hand-written DDP reading the global values")
    parser.add_argument("--fail-together", action="store_true", help="the runtime side after fail_together() (MGP141)")
    parser.add_argument(WORKER, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    common = ["--models", *arguments.models, "--blocks", str(arguments.blocks), "--steps", str(arguments.steps)]
    common += ["--fail-together"] * arguments.fail_together
    if arguments.worker:
        worker(arguments.models, arguments.blocks, arguments.steps, arguments.side, arguments.exact, arguments.fail_together)
        return
    for processes in arguments.processes:
        if not arguments.memory:
            print(_launch(processes, [*common, *["--exact"] * arguments.exact]), end="", flush=True)
            continue
        for name in arguments.models:
            peaks = {}
            for side in ("runtime", "bare"):
                output = _launch(processes, [*common[:1], name, *common[len(arguments.models) + 1 :], "--side", side])
                peaks[side] = max(float(line.rsplit(" ", 2)[-2]) for line in output.splitlines() if "peak" in line)
            print(f"W={processes} {name}: peak memory per rank, runtime {peaks['runtime']:.1f} MiB, bare DDP "
                  f"{peaks['bare']:.1f} MiB: {peaks['runtime'] / peaks['bare']:.3f}x", flush=True)


if __name__ == "__main__":
    main()
