"""The loss watch's cost on a CPU training step (issue 12): interleaved blocks with it on and off.

    python benchmarks/bench_loss_watch.py [--processes 2] [--blocks 40] [--steps 5] [--dropout 0.1] [--same]

Starts one torchrun job (gloo, CPU) training a small token tagger (embedding, two transformer encoder layers
of width 64 with dropout, a token-mean cross-entropy with ``ignore_index``, as HF-style token tasks compute
it) through ``mgpu_runtime.DistributedDataParallel`` and ``distribute_loader``. While a batch of the loader
is out, the watch (a ``TorchFunctionMode``) sees every torch call of forward, loss and backward, makes the
loss global (one two-number collective, plus the lockstep counts) and draws dropout for the global batch.
The job alternates blocks of steps with ``MGPU_LOSS_WATCH`` unset and set to 0 (read at each batch; every
rank switches at the same step), each pair in a random order, and prints the median step time of each side
and the difference. ``--same`` keeps the watch on in both sides: the difference it prints is the
benchmark's own bias. A step is the next batch of the loader, a forward, the loss, a backward and an Adam step.
``--dropout 0`` leaves out the global dropout masks, which cost each rank the draws of the whole batch's mask:
what remains is the watch's dispatch of every torch call and the loss's collective.
"""

from __future__ import annotations

import argparse

from interleaved import WORKER, launch, run_blocks
BATCH, LENGTH, VOCAB = 32, 24, 500


def worker(blocks: int, steps: int, dropout: float, same: bool) -> None:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import mgpu_runtime

    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 64)
            layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=dropout, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(64, 9)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.encoder(self.embed(ids)))

    mgpu_runtime.setup()
    torch.manual_seed(0)
    model = mgpu_runtime.DistributedDataParallel(Tagger())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = mgpu_runtime.DistributedCriterion(nn.CrossEntropyLoss(ignore_index=-100))
    rows = (2 * blocks + 1) * steps * BATCH
    ids = torch.randint(0, VOCAB, (rows, LENGTH))
    labels = torch.where(torch.rand(rows, LENGTH) < 0.2, -100, ids % 9)  # padding: not labelled
    batches = iter(mgpu_runtime.distribute_loader(DataLoader(TensorDataset(ids, labels), batch_size=BATCH, shuffle=True)))

    def step() -> None:
        x, y = next(batches)
        optimizer.zero_grad()
        criterion(model(x).flatten(0, 1), y.flatten()).backward()
        optimizer.step()

    label = ("A/A (both sides on)" if same else "loss watch on / off") + f", dropout {dropout}"
    run_blocks(step, "MGPU_LOSS_WATCH", blocks, steps, same, label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--same", action="store_true", help="A/A run: the watch on in both sides (the bias)")
    parser.add_argument(WORKER, action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        worker(arguments.blocks, arguments.steps, arguments.dropout, arguments.same)
        return
    worker_arguments = ["--blocks", str(arguments.blocks), "--steps", str(arguments.steps), "--dropout", str(arguments.dropout)]
    launch(__file__, arguments.processes, [*worker_arguments, *(["--same"] if arguments.same else [])], "MGPU_LOSS_WATCH")

if __name__ == "__main__":
    main()
