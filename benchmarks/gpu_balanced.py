"""The balanced runtime on a real GPU: exactness, single-device overhead, and the memory the gather costs.

    python benchmarks/gpu_balanced.py             # prints JSON; skips (exit 0) without CUDA
    python benchmarks/gpu_balanced.py --rehearse  # the same code on CPU replicas, small sizes (no verdicts)

Three measurements, written into ``results``:

* ``exactness``: ``DataParallelModel(device_ids=[0, 0])`` + ``DataParallelCriterion`` against the bare
  module (a repeated device is the only way to get two CUDA replicas on one GPU), float32 and float64,
  cross-entropy with class weights and ``ignore_index``, uneven batch.
* ``overhead``: median step time (forward, loss, backward) of an 8-layer 4096-wide fp16 MLP, bare versus
  ``DataParallelModel(device_ids=[0])`` (target <= 1.02x) and ``nn.DataParallel(device_ids=[0])``.
* ``memory``: peak allocated memory of one language-model step (batch 32 x 512 tokens, 32k vocabulary
  head, bf16 autocast) with ``nn.DataParallel(device_ids=[0, 0])`` versus the balanced pair. The verdict
  is direct: no operation of the balanced step may make a tensor as large as the whole logits (which
  ``nn.DataParallel`` gathers on GPU 0, then upcasts and holds the gradient of), while the ``nn.DataParallel``
  step, the control, must be seen making one. With both replicas on one GPU the pieces share that GPU, so
  the peak difference is reported, not judged: it is at most the gathered copies.

``--rehearse`` runs every line of this on the CPU (two ``MGPU_CPU_REPLICAS``, tiny sizes, no timing or
memory verdicts), so a mistake in this script shows in CI and not in the few minutes a GPU is lent.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mgpu_runtime.balanced import DataParallelCriterion, DataParallelModel

OVERHEAD_TARGET = 1.02


@dataclass(frozen=True)
class Sizes:
    """What the measurements run on: the real sizes on a GPU, toy ones for the CPU rehearsal."""

    device: str
    mlp_width: int = 4096
    mlp_layers: int = 8
    mlp_batch: int = 1024
    rounds: int = 60
    warmup: int = 10
    lm_batch: int = 32
    lm_tokens: int = 512
    lm_vocabulary: int = 32_000
    lm_width: int = 1024

    @property
    def rehearsal(self) -> bool:
        return self.device == "cpu"


GPU = Sizes("cuda")
REHEARSAL = Sizes(
    "cpu", mlp_width=64, mlp_layers=2, mlp_batch=32, rounds=3, warmup=1, lm_batch=4, lm_tokens=8, lm_vocabulary=300,
    lm_width=24,
)


def run(results: dict, sizes: Sizes = GPU) -> None:
    if sizes.rehearsal:
        # Two CPU replicas stand in for device_ids=[0, 0]; without them the runtime would not split at all.
        os.environ.setdefault("MGPU_CPU_REPLICAS", "2")
        results["rehearsal"] = "CPU, toy sizes: checks this script's code, not the GPU; timings mean nothing"
    elif not torch.cuda.is_available():
        results["skipped"] = "no CUDA device: the balanced GPU check needs one"
        return
    else:
        results["device"] = torch.cuda.get_device_name(0)
    results["exactness"] = _recorded(lambda: _exactness(sizes))
    results["overhead"] = _recorded(lambda: _overhead(sizes))
    results["memory"] = _recorded(lambda: _memory(sizes))
    # A top-level "error" is what gpu_check.py counts as a failure: a section that raised, a wrong result, or
    # whole logits made by the balanced pair. An overhead above target is a measurement, reported with
    # its "ok", not a failure.
    failed = [name for name in ("exactness", "overhead", "memory") if "error" in results[name]]
    failed += [
        f"exactness in {dtype}"
        for dtype, check in results["exactness"].items()
        if isinstance(check, dict) and not check["ok"]
    ]
    if results["memory"].get("ok") is False:
        failed.append("memory: the balanced pair made the whole logits (or the watch saw no gather)")
    if failed:
        results["error"] = "failed: " + ", ".join(failed)


def _recorded(measure: Callable[[], dict]) -> dict:
    # One failing measurement (e.g. nn.DataParallel refusing a repeated device) must not hide the others.
    try:
        return measure()
    except Exception as failure:  # noqa: BLE001 - reported in the results
        return {"error": f"{type(failure).__name__}: {failure}"}


def _synchronize(sizes: Sizes) -> None:
    if not sizes.rehearsal:
        torch.cuda.synchronize()


def _exactness(sizes: Sizes) -> dict:
    report = {}
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(0)
        bare = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 10)).to(sizes.device, dtype)
        twin = copy.deepcopy(bare)
        x = torch.randn(37, 64, device=sizes.device, dtype=dtype)
        y = torch.randint(0, 10, (37,), device=sizes.device)
        y[-12:] = -100  # the second piece is mostly padding
        weight = torch.linspace(0.5, 2.0, 10, device=sizes.device, dtype=dtype)
        criterion = nn.CrossEntropyLoss(weight=weight, ignore_index=-100)
        expected = criterion(bare(x), y)
        expected.backward()
        actual = DataParallelCriterion(criterion)(DataParallelModel(twin, device_ids=[0, 0])(x), y)
        actual.backward()
        gradient_diff = max(
            (p.grad - q.grad).abs().max().item() for p, q in zip(twin.parameters(), bare.parameters())
        )
        tolerance = 1e-4 if dtype == torch.float32 else 1e-9
        loss_diff = (actual - expected).abs().item()
        report[str(dtype).removeprefix("torch.")] = {
            "loss_abs_diff": loss_diff,
            "max_grad_abs_diff": gradient_diff,
            "ok": loss_diff <= tolerance and gradient_diff <= tolerance,
        }
    return report


def _overhead(sizes: Sizes) -> dict:
    torch.manual_seed(0)
    width, dtype = sizes.mlp_width, torch.float32 if sizes.rehearsal else torch.float16
    module = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(sizes.mlp_layers)])
    module = module.to(sizes.device, dtype)
    x = torch.randn(sizes.mlp_batch, width, device=sizes.device, dtype=dtype)
    target = torch.randn(sizes.mlp_batch, width, device=sizes.device, dtype=dtype)
    # One device: on the GPU device_ids=[0]; in the rehearsal one CPU replica (replica 0).
    balanced_model = DataParallelModel(module, device_ids=[0])
    balanced_loss = DataParallelCriterion(nn.MSELoss())
    torch_model = nn.DataParallel(module, device_ids=[0])
    steps = {
        "bare": lambda: F.mse_loss(module(x), target),
        "balanced": lambda: balanced_loss(balanced_model(x), target),
        "nn.DataParallel": lambda: F.mse_loss(torch_model(x), target),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for round_index in range(sizes.warmup + sizes.rounds):
        for name, loss_of_step in steps.items():  # interleaved, so clock and thermal drift hit all alike
            module.zero_grad(set_to_none=True)
            _synchronize(sizes)
            start = time.perf_counter()
            loss_of_step().backward()
            _synchronize(sizes)
            if round_index >= sizes.warmup:
                times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(samples) for name, samples in times.items()}
    return {
        "shape": f"{sizes.mlp_layers} layers x {width} wide, batch {sizes.mlp_batch}, {dtype}, forward+loss+backward",
        "median_step_ms": {name: round(seconds * 1e3, 4) for name, seconds in median.items()},
        "balanced_over_bare": round(median["balanced"] / median["bare"], 4),
        "nn_data_parallel_over_bare": round(median["nn.DataParallel"] / median["bare"], 4),
        "target": OVERHEAD_TARGET,
        "ok": median["balanced"] / median["bare"] <= OVERHEAD_TARGET,
    }


class _LanguageModel(nn.Module):
    """Embedding, one hidden layer, a large vocabulary head; logits as one row per token."""

    def __init__(self, vocabulary: int, width: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.body = nn.Sequential(nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, vocabulary, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embedding(ids))).flatten(0, 1)


def _memory(sizes: Sizes) -> dict:
    torch.manual_seed(0)
    batch, tokens, vocabulary = sizes.lm_batch, sizes.lm_tokens, sizes.lm_vocabulary
    module = _LanguageModel(vocabulary, sizes.lm_width).to(sizes.device)
    ids = torch.randint(0, vocabulary, (batch, tokens), device=sizes.device)
    labels = torch.randint(0, vocabulary, (batch * tokens,), device=sizes.device)
    torch_model = nn.DataParallel(module, device_ids=[0, 0])
    balanced_model = DataParallelModel(module, device_ids=[0, 0])
    balanced_loss = DataParallelCriterion(nn.CrossEntropyLoss())
    steps = {
        "nn.DataParallel": lambda: F.cross_entropy(torch_model(ids), labels),
        "balanced": lambda: balanced_loss(balanced_model(ids), labels),
    }
    logits = batch * tokens * vocabulary
    report: dict = {
        "shape": f"batch {batch} x {tokens} tokens x {vocabulary} vocabulary, bf16 autocast, device_ids=[0, 0]",
        "bf16_logits_gib": round(logits * 2 / 2**30, 3),
    }
    for name, step in steps.items():
        report[name] = _recorded(lambda step=step: _memory_of_step(module, step, sizes, logits))
    gathered = [report[name].get("holds_whole_logits") for name in steps]
    if None not in gathered:
        # The control must see the whole logits (else the watch is blind); the balanced pair must not make them.
        report["ok"] = gathered == [True, False]
    peaks = [report[name].get("peak_step_gib") for name in steps]
    if all(isinstance(peak, float) for peak in peaks):
        report["saved_gib"] = round(peaks[0] - peaks[1], 3)
    return report


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operation of the calling thread creates.

    The replicas' forward runs in worker threads, which this mode does not see; they only ever hold their
    own piece. Every place that could join the pieces into the whole batch (a gather, the combined loss)
    runs in the calling thread, which it does see.
    """

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.Tensor):
                self.largest = max(self.largest, value.numel())
        return out


def _memory_of_step(module: nn.Module, loss_of_step: Callable[[], torch.Tensor], sizes: Sizes, logits: int) -> dict:
    """Whether the step's forward makes a tensor as large as the whole logits, and (on a GPU) its peak memory
    above what was allocated before it (parameters, gradients, inputs)."""

    def train_step(watch: _LargestTensor | None = None) -> None:
        with torch.autocast(sizes.device, dtype=torch.bfloat16):
            if watch is None:
                loss = loss_of_step()
            else:
                with watch:
                    loss = loss_of_step()
        loss.backward()

    module.zero_grad(set_to_none=True)
    watch = _LargestTensor()
    train_step(watch)  # also allocates the gradients, which both variants keep between steps
    report: dict = {"largest_forward_tensor": watch.largest, "holds_whole_logits": watch.largest >= logits}
    if sizes.rehearsal:
        report["peak_step_gib"] = "not measured on the CPU"
        return report
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    train_step()
    torch.cuda.synchronize()
    report["peak_step_gib"] = round((torch.cuda.max_memory_allocated() - before) / 2**30, 3)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rehearse", action="store_true", help="run this script's code on the CPU, toy sizes")
    arguments = parser.parse_args()
    collected: dict = {}
    run(collected, REHEARSAL if arguments.rehearse else GPU)
    if "skipped" in collected:
        print(f"gpu_balanced: skipped: {collected['skipped']}")
    print(json.dumps(collected, indent=2))
    return 1 if "error" in collected else 0


if __name__ == "__main__":
    raise SystemExit(main())
