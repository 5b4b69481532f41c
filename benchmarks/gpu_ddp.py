"""The distributed runtime on a real GPU: exactness with two processes on one device, and wrapper overhead.

    python benchmarks/gpu_ddp.py             # prints JSON; skips (exit 0) without CUDA
    python benchmarks/gpu_ddp.py --rehearse  # the same code on the CPU over gloo, toy sizes (no verdicts)

Two measurements, written into ``results`` (each in fresh processes, so this process joins no job):

* ``exactness``: the same training (shuffled loader with an uneven last batch, class-weighted
  cross-entropy with ignored targets, 3 epochs) as the original single process with plain torch, and as
  its migration under ``torchrun --nproc_per_node=2`` with both ranks on GPU 0 over gloo
  (``MGPU_BACKEND=gloo``, ``MGPU_SHARE_DEVICE=1``: NCCL refuses two ranks on one device). The final
  weights must agree within 1e-5 and be identical on both ranks.
* ``streams``: the random streams of a rank above 0 (``global_view.DeviceStream``). The same dropout training
  runs twice under ``torchrun --nproc_per_node=2`` on GPU 0, once with draws on the GPU in the loop between
  steps (a ``torch.multinomial`` as decision-transformer's evaluation makes, and a ``torch.randn_like`` of the
  global batch) and once without: rank 1's dropout masks must be the same in both runs (under DataParallel the
  loop drew on ``cuda:0``, never on device 1), and the ``randn_like`` draw must be the same whole tensor on
  both ranks (rank 0's stream, ``cuda:0``'s).
* ``overhead``: median step time (forward, loss, backward, SGD step) of an 8-layer 4096-wide MLP in a
  world of one, ``mgpu_runtime.DistributedDataParallel`` against bare ``torch DistributedDataParallel`` on
  an NCCL group (what ``torchrun --nproc_per_node=1`` gives); target <= 1.02x.

The workers are this file run with ``--worker``. ``--rehearse`` runs all of it on the CPU (gloo for both
groups, a small MLP), so a mistake in this script shows in CI and not in the few minutes a GPU is lent.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

OVERHEAD_TARGET = 1.02
TOLERANCE = 1e-5
WORKER_TIMEOUT = 150
_LAUNCHER_PREFIXES = ("SLURM_", "MGPU_", "TORCHELASTIC_")
_LAUNCHER_VARIABLES = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
}


def run(results: dict, rehearse: bool = False) -> None:
    if rehearse:
        results["rehearsal"] = "CPU, toy sizes: checks this script's code, not the GPU; timings mean nothing"
    elif not torch.cuda.is_available():
        results["skipped"] = "no CUDA device: the distributed GPU check needs one"
        return
    else:
        results["device"] = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as scratch:
        for name, measure in (("exactness", _exactness), ("streams", _streams), ("overhead", _overhead)):
            try:
                results[name] = measure(pathlib.Path(scratch), rehearse)
            except Exception as failure:  # noqa: BLE001 - one failing half must not hide the other's numbers
                results[name] = {"error": f"{type(failure).__name__}: {failure}"}
    failed = [name for name in ("exactness", "streams", "overhead") if "error" in results[name]]
    if "error" not in results["exactness"] and not results["exactness"]["ok"]:
        failed.append("exactness: weights differ")
    if "error" not in results["streams"] and not results["streams"]["ok"]:
        failed.append("streams: a loop draw moved rank 1's dropout, or the batch's noise differs between ranks")
    if failed:
        results["error"] = "failed: " + ", ".join(failed)


def _exactness(scratch: pathlib.Path, rehearse: bool) -> dict:
    original, migrated = scratch / "original", scratch / "migrated"
    cpu_only = {"CUDA_VISIBLE_DEVICES": ""} if rehearse else {}
    _worker(["train", str(original), "--original"], env=cpu_only)
    shared_gpu = {"CUDA_VISIBLE_DEVICES": _first_visible_device(), "MGPU_BACKEND": "gloo", "MGPU_SHARE_DEVICE": "1"}
    _worker(
        ["train", str(migrated)],
        launcher=["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"],
        env=cpu_only or shared_gpu,
    )
    expected = torch.load(original / "rank0.pt")
    ranks = [torch.load(migrated / f"rank{rank}.pt") for rank in range(2)]
    difference = max((ranks[0][name] - value).abs().max().item() for name, value in expected.items())
    identical = all(torch.equal(ranks[1][name], value) for name, value in ranks[0].items())
    return {
        "max_weight_difference": difference,
        "ranks_identical": identical,
        "ok": difference <= TOLERANCE and identical,
    }


def _streams(scratch: pathlib.Path, rehearse: bool) -> dict:
    env = {"CUDA_VISIBLE_DEVICES": ""} if rehearse else {
        "CUDA_VISIBLE_DEVICES": _first_visible_device(), "MGPU_BACKEND": "gloo", "MGPU_SHARE_DEVICE": "1"
    }
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    runs = {}
    for name, draws in (("quiet", []), ("drawing", ["--loop-draws"])):
        out = scratch / f"streams-{name}"
        _worker(["streams", str(out), *draws], launcher=launcher, env=env)
        runs[name] = [torch.load(out / f"rank{rank}.pt") for rank in range(2)]
    quiet, drawing = runs["quiet"], runs["drawing"]
    masks_kept = all(torch.equal(a, b) for a, b in zip(quiet[1]["masks"], drawing[1]["masks"]))
    noise_alike = all(torch.equal(a, b) for a, b in zip(drawing[0]["noise"], drawing[1]["noise"]))
    return {"rank1_masks_kept": masks_kept, "noise_alike_on_ranks": noise_alike, "ok": masks_kept and noise_alike}


def _overhead(scratch: pathlib.Path, rehearse: bool) -> dict:
    out = scratch / "overhead.json"
    _worker(["overhead", str(out), *(["--rehearse"] if rehearse else [])], env={"CUDA_VISIBLE_DEVICES": ""} if rehearse else {})
    timing = json.loads(out.read_text())
    ratio = timing["mgpu_runtime_ms"] / timing["bare_ddp_ms"]
    return {**timing, "ratio": round(ratio, 4), "target": OVERHEAD_TARGET, "ok": ratio <= OVERHEAD_TARGET}


def _worker(arguments: list[str], launcher: list[str] | None = None, env: dict[str, str] | None = None) -> None:
    clean = {
        k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARIABLES and not k.startswith(_LAUNCHER_PREFIXES)
    }
    command = [sys.executable, *(launcher or []), __file__, "--worker", *arguments]
    for attempt in range(2):
        finished = subprocess.run(
            command, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=WORKER_TIMEOUT, check=False
        )
        # A gloo process that torch's C++ teardown aborted at exit, after the work (no Python frame left), is run
        # again once: rare, and not this script's measurement.
        if finished.returncode == 0 or "terminate called without an active exception" not in finished.stderr or attempt:
            break
    if finished.returncode != 0:
        raise RuntimeError(
            f"{' '.join(arguments)} exited {finished.returncode}:\n{finished.stdout[-2000:]}{finished.stderr[-3000:]}"
        )


def _first_visible_device() -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]


# Workers ---------------------------------------------------------------------------------------------


def _train_worker(out: pathlib.Path, original: bool) -> None:
    """The exactness training; the original is plain single-process torch on cuda:0 (the CPU without CUDA)."""
    from torch.utils.data import DataLoader, TensorDataset

    generator = torch.Generator().manual_seed(0)
    samples, classes = 203, 7
    x = torch.randn(samples, 32, generator=generator)
    y = torch.randint(classes, (samples,), generator=generator)
    y[::5] = -100
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, classes))
    criterion = nn.CrossEntropyLoss(weight=torch.linspace(0.5, 2.0, classes), ignore_index=-100)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    if original:
        device, rank, bare = torch.device("cuda" if torch.cuda.is_available() else "cpu", 0), 0, model
        model, criterion = model.to(device), criterion.to(device)
    else:
        import mgpu_runtime

        mgpu_runtime.setup()
        device, rank, bare = mgpu_runtime.device(), mgpu_runtime.rank(), model
        model = mgpu_runtime.DistributedDataParallel(model)
        criterion = mgpu_runtime.DistributedCriterion(criterion.to(device))
        loader = mgpu_runtime.distribute_loader(loader)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        for inputs, targets in loader:
            optimizer.zero_grad()
            criterion(model(inputs.to(device)), targets.to(device)).backward()
            optimizer.step()
    out.mkdir(parents=True, exist_ok=True)
    torch.save({name: value.detach().cpu() for name, value in bare.state_dict().items()}, out / f"rank{rank}.pt")


def _streams_worker(out: pathlib.Path, loop_draws: bool) -> None:
    """Dropout training over the ranks; each rank keeps its dropout masks, and (``loop_draws``) the loop draws on
    the device between steps, keeping the whole of each ``randn_like`` of the batch."""
    import mgpu_runtime
    from mgpu_runtime.sharded import materialize
    from torch.utils.data import DataLoader, TensorDataset

    mgpu_runtime.setup()
    device = mgpu_runtime.device()
    torch.manual_seed(3)
    dropout = nn.Dropout(0.5)
    model = mgpu_runtime.DistributedDataParallel(nn.Sequential(nn.Linear(8, 32), dropout, nn.Linear(32, 2)).to(device))
    masks: list[torch.Tensor] = []
    dropout.register_forward_hook(lambda module, inputs, output: masks.append((output == 0).cpu()))
    data = TensorDataset(torch.randn(36, 8, generator=torch.Generator().manual_seed(0)))
    loader = mgpu_runtime.distribute_loader(DataLoader(data, batch_size=12))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    noise = []
    for _ in range(2):
        for (inputs,) in loader:
            inputs = inputs.to(device)
            optimizer.zero_grad()
            model(inputs).pow(2).mean().backward()
            optimizer.step()
            if loop_draws:
                torch.multinomial(torch.ones(50, device=device), 5)
                noise.append(materialize(torch.randn_like(inputs)).cpu())
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"masks": masks, "noise": noise}, out / f"rank{mgpu_runtime.rank()}.pt")


def _overhead_worker(out: pathlib.Path, rehearse: bool) -> None:
    """Median step times of the runtime's wrapper and bare DDP, measured in alternating rounds."""
    import mgpu_runtime
    import torch.distributed as dist

    mgpu_runtime.setup()
    device = mgpu_runtime.device()
    width, layers, rows = (64, 2, 32) if rehearse else (4096, 8, 512)

    def mlp() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(*[layer for _ in range(layers) for layer in (nn.Linear(width, width), nn.ReLU())]).to(device)

    wrapped = mgpu_runtime.DistributedDataParallel(mlp())
    on_gpu = device.type == "cuda"
    bare = nn.parallel.DistributedDataParallel(
        mlp(),
        device_ids=[device.index] if on_gpu else None,
        process_group=dist.new_group(backend="nccl" if on_gpu else "gloo"),
    )
    batch = torch.randn(rows, width, device=device)
    steppers = {}
    for name, model in (("mgpu_runtime_ms", wrapped), ("bare_ddp_ms", bare)):
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)

        def step(model: nn.Module = model, optimizer: torch.optim.Optimizer = optimizer) -> None:
            optimizer.zero_grad()
            model(batch).square().mean().backward()
            optimizer.step()

        steppers[name] = step
    rounds: dict[str, list[float]] = {name: [] for name in steppers}
    synchronize = torch.cuda.synchronize if on_gpu else (lambda: None)
    for round_index in range(12):
        for name, step in steppers.items():
            synchronize()
            started = time.perf_counter()
            for _ in range(10):
                step()
            synchronize()
            if round_index >= 2:  # the first rounds warm up allocator, kernels and buckets
                rounds[name].append((time.perf_counter() - started) * 100)
    out.write_text(json.dumps({name: round(statistics.median(times), 3) for name, times in rounds.items()}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs="+", metavar="ARGUMENT", help=argparse.SUPPRESS)
    parser.add_argument("--original", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loop-draws", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rehearse", action="store_true", help="run this script's code on the CPU, toy sizes")
    arguments = parser.parse_args()
    if arguments.worker:
        kind, out = arguments.worker[0], pathlib.Path(arguments.worker[1])
        if kind == "train":
            _train_worker(out, arguments.original)
        elif kind == "streams":
            _streams_worker(out, arguments.loop_draws)
        else:
            _overhead_worker(out, arguments.rehearse)
        return 0
    results: dict = {}
    run(results, arguments.rehearse)
    print(json.dumps(results, indent=2, default=str))
    return 1 if "error" in results else 0


if __name__ == "__main__":
    sys.exit(main())
