"""Loop code over a global batch, to run on plain tensors and on ``Sharded`` ones and compare (float64).

Each case is ``case(batch) -> value``: the batch holds ``out`` (what a model gave, computed from the leaf
``x`` and the parameter ``w``), integer targets ``y``, sequences ``tokens``, a mask and plain per-row tensors,
each either whole (the reference) or cut in pieces. A case returns a loss (its value and gradients are
compared) or any tensor (compared materialised). Shapes, the code of real training loops: token-normalised
sums, masked means, focal losses over a count, OHEM top-k, batch-hard triplet mining, memory banks,
contrastive similarities, distillation, mixup, CTC, accuracy counts.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from tests.fixture_cases import HARNESS

CLASSES = 5
FEATURES = 6
STEPS = 4


@dataclass
class Batch:
    x: torch.Tensor  # (B, FEATURES), a leaf
    w: torch.Tensor  # (FEATURES, CLASSES), a parameter
    out: torch.Tensor  # x @ w: the model's output
    y: torch.Tensor  # (B,) classes
    tokens: torch.Tensor  # (B, STEPS) classes with padding 0
    mask: torch.Tensor  # (B,) bool
    plain: torch.Tensor  # (B, CLASSES) a per-row tensor every process holds whole


def global_data(rows: int, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, CLASSES, (rows, STEPS), generator=generator)
    lengths = torch.randint(1, STEPS + 1, (rows,), generator=generator)
    for row, length in enumerate(lengths.tolist()):
        tokens[row, length:] = 0
    return {
        "x": torch.randn(rows, FEATURES, generator=generator, dtype=torch.float64),
        "w": torch.randn(FEATURES, CLASSES, generator=generator, dtype=torch.float64),
        "y": torch.randint(0, CLASSES, (rows,), generator=generator),
        "tokens": tokens,
        "mask": torch.rand(rows, generator=generator) > 0.4,
        "plain": torch.randn(rows, CLASSES, generator=generator, dtype=torch.float64),
    }


def token_sum_over_count(b: Batch):
    logits = (b.out.unsqueeze(1) * torch.arange(1, STEPS + 1, dtype=b.out.dtype).view(1, STEPS, 1))
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), b.tokens.view(-1), ignore_index=0, reduction="sum")
    return loss / b.tokens.ne(0).sum()


def weighted_cross_entropy(b: Batch):
    weight = torch.linspace(0.5, 2.0, CLASSES, dtype=b.out.dtype)
    return F.cross_entropy(b.out, b.y, weight=weight, ignore_index=0, label_smoothing=0.1)


def masked_mean(b: Batch):
    per_row = b.out.pow(2).sum(-1)
    return (per_row * b.mask).sum() / b.mask.sum().clamp(min=1)


def focal_over_positives(b: Batch):
    target = F.one_hot(b.y, CLASSES).to(b.out.dtype)
    p = b.out.sigmoid()
    pt = torch.where(target > 0, p, 1 - p)
    loss = -(1 - pt).pow(2) * pt.clamp(min=1e-6).log()
    num_pos = (b.y > 1).sum().clamp(min=1)
    return loss.sum() / num_pos


def ohem_top_k(b: Batch):
    losses = F.cross_entropy(b.out, b.y, reduction="none")
    kept = max(1, len(b.out) // 2)
    return losses.topk(kept)[0].mean()


def batch_hard_triplet(b: Batch):
    distances = torch.cdist(b.out, b.out)
    same = b.y.unsqueeze(1) == b.y.unsqueeze(0)
    hardest_positive = (distances * same).max(1)[0]
    hardest_negative = (distances + 1e6 * same).min(1)[0]
    return F.relu(hardest_positive - hardest_negative + 0.3).mean()


def memory_bank(b: Batch):
    memory = torch.zeros(2 * len(b.out), CLASSES, dtype=b.out.dtype)
    index = torch.arange(len(b.out)) * 2
    memory.index_copy_(0, index, F.normalize(b.out, dim=1).detach())
    logits = F.normalize(b.out, dim=1) @ memory.t() / 0.1
    return logits.logsumexp(1).mean() + memory.sum() * 0


def contrastive(b: Batch):
    z = F.normalize(b.out, dim=1)
    similarity = z @ z.T / 0.5
    similarity = similarity - 1e9 * torch.eye(len(z), dtype=z.dtype)
    targets = torch.arange(len(z)).roll(1)
    return F.cross_entropy(similarity, targets)


def distillation(b: Batch):
    teacher = (b.plain * 2).detach()
    temperature = 3.0
    soft = F.kl_div(F.log_softmax(b.out / temperature, 1), F.softmax(teacher / temperature, 1), reduction="batchmean")
    return soft * temperature**2 + 0.5 * F.cross_entropy(b.out, b.y)


def mixup(b: Batch):
    generator = torch.Generator().manual_seed(11)
    permutation = torch.randperm(len(b.x), generator=generator)
    lam = 0.3
    mixed = lam * b.x + (1 - lam) * b.x[permutation, :]
    out = mixed @ b.w
    return lam * F.cross_entropy(out, b.y) + (1 - lam) * F.cross_entropy(out, b.y[permutation])


def legacy_variables(b: Batch):
    """PyTorch 0.3's wrappers, still accepted: ``Variable(x)`` detaches (C++ below __torch_function__), and
    ``volatile`` only warns (mean-teacher's ``Variable(ema_logit.detach().data, requires_grad=False)``)."""
    import warnings

    from torch.autograd import Variable

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        target = Variable(b.out.detach().data, requires_grad=False)
        inputs = Variable(b.x, volatile=True)
    return ((b.out - target * 0.5) ** 2).mean() + (inputs @ b.w).sum() * 0.1


def plain_shaped_as_global(b: Batch):
    """A plain value expanded, viewed or reshaped as a global one (WaveRNN's MOL loss: `y.expand_as(means)`)."""
    column = b.plain[:1, :1]
    scale = b.plain[:1].view_as(b.out[:1]).reshape_as(b.out[:1])
    return ((b.out - column.expand_as(b.out)) ** 2 * scale).mean()


def accuracy(b: Batch):
    correct = (b.out.argmax(1) == b.y).sum()
    return correct.float() / b.y.size(0) + b.out.sum() * 0


def ctc(b: Batch):
    log_probs = b.out.unsqueeze(1).expand(-1, 3, -1).log_softmax(2).permute(1, 0, 2)  # (T=3, B, C)
    targets = (b.y % (CLASSES - 1) + 1).unsqueeze(1)
    input_lengths = torch.full((len(b.y),), 3, dtype=torch.long)
    target_lengths = torch.ones(len(b.y), dtype=torch.long)
    return F.ctc_loss(log_probs, targets, input_lengths, target_lengths)


def losses_of_torch(b: Batch):
    target = b.plain
    return (
        F.mse_loss(b.out, target)
        + F.l1_loss(b.out, target, reduction="sum") / 100
        + F.smooth_l1_loss(b.out, target, beta=0.5)
        + F.binary_cross_entropy_with_logits(b.out, target.sigmoid(), pos_weight=torch.ones(CLASSES, dtype=b.out.dtype))
        + F.nll_loss(F.log_softmax(b.out, 1), b.y)
        + F.multilabel_soft_margin_loss(b.out, (target > 0).to(b.out.dtype))
        + F.cosine_embedding_loss(b.out, target, torch.where(b.mask, 1, -1))
        + F.triplet_margin_loss(b.out, target, target.flip(1))
        + F.huber_loss(b.out, target, delta=0.7)
    )


def reductions(b: Batch):
    o = b.out
    return (
        o.mean(0).sum()
        + o.sum(dim=(0, 1))
        + o.amax(0).sum()
        + o.max()
        + o.min(1)[0].sum()
        + o.std()
        + o.var(0).sum()
        + o.norm()
        + o.logsumexp(1).mean()
        + o.abs().max(0)[0].sum()
        + o.cumsum(1).mean()
        + o.sort(1)[0][:, -1].mean()
        + (o > 0).any().float()
        + (o > -100).all().float()
        + torch.count_nonzero(o > 0).float()
    )


def indexing(b: Batch):
    o = b.out
    picked = o[torch.arange(len(o)), b.y]
    return (
        o[:, 0].sum()
        + o[..., 1:3].pow(2).mean()
        + o[:, None, 2].sum()
        + o[b.mask].sum()
        + picked.mean()
        + o[0].sum()
        + o[1:].sum()
        + o[o > 0.5].sum()
        + o[torch.tensor([0, len(o) - 1])].sum()
    )


def in_place(b: Batch):
    o = b.out.clone()
    o[:, 0] = 0
    o.masked_fill_(b.mask.unsqueeze(1), 0.5)
    o[b.mask] = 1.0
    o *= 2
    o[0] = 3.0
    o.clamp_(max=2.5)
    return o.sum() + (o * b.out).mean()


def shapes(b: Batch):
    o = b.out
    three = o.unsqueeze(1).expand(-1, 2, -1)
    return (
        o.view(len(o), -1).sum(1).mean()
        + o.flatten().pow(2).sum()
        + three.flatten(1).mean()
        + three.permute(0, 2, 1).reshape(len(o), -1)[:, 1].sum()
        + three.transpose(1, 2).mean()
        + o.t().sum(1).mean()
        + o.unsqueeze(0).sum()
        + o.unsqueeze(-1).squeeze(-1).mean()
        + torch.cat([o, o * 2], dim=1).mean()
        + torch.cat([o, o * 2], dim=0).mean()
        + torch.stack([o, o], dim=1).sum()
        + torch.stack([o, o]).mean()
        + o.reshape(-1, 1).mean()
        + o.repeat(1, 2).sum()
        + o.chunk(2, dim=1)[1].sum()
    )


def products(b: Batch):
    o = b.out
    projection = torch.linspace(-1, 1, CLASSES * 3, dtype=o.dtype).view(CLASSES, 3)
    return (o @ projection).sum() + (o.T @ o).trace() + F.linear(o, projection.t()).mean() + torch.mm(o, projection).mean()


def plain_operands(b: Batch):
    o = b.out
    rows = torch.arange(len(o), dtype=o.dtype).unsqueeze(1)
    noise = torch.randn(len(o), CLASSES, generator=torch.Generator().manual_seed(5), dtype=o.dtype)
    return ((o + b.plain) * rows).mean() + (o * noise).sum() + torch.where(o > 0, o, b.plain).sum()


def paired_rows(b: Batch):
    """Layers whose two operands are both rows of the batch, one plain and whole (SfmLearner's
    ``F.grid_sample(reference_image, grid_from_depth)``), ``F.pairwise_distance`` and ``F.bilinear``."""
    o = b.out
    images = b.plain.view(-1, 1, 1, CLASSES).expand(-1, 2, 3, CLASSES)
    grid = torch.tanh(o[:, :2]).view(-1, 1, 1, 2).expand(-1, 3, 2, 2)
    sampled = F.grid_sample(images, grid, align_corners=True)
    weight = torch.linspace(-1, 1, 2 * CLASSES * CLASSES, dtype=o.dtype).view(2, CLASSES, CLASSES)
    return sampled.pow(2).sum() + F.pairwise_distance(o, b.plain).sum() + F.bilinear(b.plain, o, weight).mean()


def python_values(b: Batch):
    """``.item()``, numpy, ``if``, iteration: the global values."""
    o = b.out
    total = o.sum().item()
    as_numpy = o.detach().numpy()
    rows = [row.sum() for row in o]
    scale = 2.0 if o.mean() > 0 else 3.0
    return o.sum() * scale + sum(rows) * 0 + float(as_numpy.sum() - total) + len(o) + o.shape[0] + o.size(0)


class _ClampedSquare(torch.autograd.Function):
    """A loss of the project's own, written as a custom autograd Function (its backward by hand)."""

    @staticmethod
    def forward(ctx, value, bound):
        ctx.save_for_backward(value)
        ctx.bound = bound
        return value.clamp(-bound, bound).square()

    @staticmethod
    def backward(ctx, grad):
        (value,) = ctx.saved_tensors
        inside = (value.abs() <= ctx.bound).to(grad.dtype)
        return grad * 2 * value * inside, None


def custom_function(b: Batch):
    """torch's Function.apply never asks __torch_function__: the runtime gives it the global tensors."""
    per_row = _ClampedSquare.apply(b.out, 1.5)
    return per_row.sum(1).mean() + _ClampedSquare.apply(b.out[:, 0], 0.5).sum() / b.out.shape[0]


CASES = [
    token_sum_over_count,
    weighted_cross_entropy,
    masked_mean,
    focal_over_positives,
    ohem_top_k,
    batch_hard_triplet,
    memory_bank,
    contrastive,
    distillation,
    mixup,
    legacy_variables,
    plain_shaped_as_global,
    accuracy,
    ctc,
    losses_of_torch,
    reductions,
    indexing,
    in_place,
    shapes,
    products,
    plain_operands,
    paired_rows,
    python_values,
    custom_function,
]


def difference(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if a.shape != b.shape:
        return math.inf
    return (a - b).abs().max().item() if a.numel() else 0.0


ROOT = Path(__file__).resolve().parents[2]


def job_results(script: Path, processes: int, directory: Path) -> dict[str, float]:
    """``script`` (a ``distributed_scripts`` job writing per case and batch size the largest difference from the
    whole batch's) under torchrun, gloo, ``processes`` ranks, on the CPU: what rank 0 wrote."""
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("MGPU_", "SLURM_")) and k not in ("RANK", "WORLD_SIZE")},
        "PYTHONPATH": os.pathsep.join([str(HARNESS), str(ROOT / "runtime"), str(ROOT)]),
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
    }
    output = directory / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", str(script), str(output)],
        env=environment, capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return json.loads(output.read_text())
