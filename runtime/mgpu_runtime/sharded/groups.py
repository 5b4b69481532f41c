"""Where the parts of a global value are, and the collectives that combine them: the one thing the targets differ in.

A global value of ``R`` rows is cut into parts along dimension 0 (``splits``: the rows of each part, as
DataParallel's scatter cut them); a process holds the pieces of some parts (``held``):

* ``RankGroup`` (``--to ddp``): one part per process of the job, each process holding its own. Combining
  is a collective over the processes (``torch.distributed``), differentiable: the sum of parts is an
  all-reduce whose backward sums the ranks' gradient parts again, and a materialised value is an all-gather
  whose backward sums the parts of its gradient and keeps this rank's rows (see the package doc).
* ``ReplicaGroup`` (``--to balanced``): one part per replica, all held by the one process, each on its
  replica's device. Combining moves the pieces to the output device and adds or concatenates them; plain
  autograd carries the gradients back.

Both answer the same questions, so the op rules (``rules.py``) are written once.
"""

from __future__ import annotations

import contextlib
import pickle
from abc import ABC, abstractmethod
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import ExceptionWrapper


class Group(ABC):
    """How the parts of a global value are held and combined."""

    parts: int
    """Parts of a global value: the processes of the job, or the replicas."""
    held: tuple[int, ...]
    """The parts whose pieces this process holds, in order."""
    device: torch.device
    """Where a combined value (a reduction, a materialised tensor) is placed."""
    seed_scale: float
    """What a backward from a value held alike everywhere starts at: ``1/W`` over processes, 1 in one process."""

    @abstractmethod
    def sum(self, *quantities: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """For each quantity (one partial per held piece, all of one shape), its sum over every part, placed on
        ``device``; all quantities in one collective. Differentiable."""

    @abstractmethod
    def concatenate(self, pieces: Sequence[torch.Tensor], splits: Sequence[int]) -> torch.Tensor:
        """The global value of these held pieces of a value cut in ``splits``, on ``device``. Differentiable."""

    @abstractmethod
    def row_counts(self, rows: Sequence[int]) -> tuple[int, ...]:
        """Every part's rows, given the rows of the held pieces (a collective over processes)."""

    @abstractmethod
    def objects(self, pieces: Sequence[list[Any]]) -> list[Any]:
        """The concatenation, over every part, of per-row Python values (file names ...) held in pieces."""

    def place(self, value: torch.Tensor, piece: torch.Tensor) -> torch.Tensor:
        """``value`` (a tensor every process holds alike) where it can meet ``piece``."""
        return value

    def place_on(self, value: torch.Tensor, index: int) -> torch.Tensor:
        """``value`` on the device of the ``index``-th held part (a replica's input)."""
        return value

    def note_mixing(self, value: torch.Tensor) -> None:  # noqa: B027 - one process needs nothing here
        """``value``, held alike by every part, goes into one part's own computation (an operand of a per-piece
        operation, a replica's input); in one process nothing follows from it."""

    @abstractmethod
    def row_table(self, rows: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
        """Given, for each held part, the rows of each of several values, each value's rows in every part."""


def starts(splits: Sequence[int]) -> list[int]:
    """The first row of each part."""
    return [0, *accumulate(splits)][:-1]


class ReplicaGroup(Group):
    """The replicas of one process, each piece on its replica's device (the balanced runtime). A forward that
    ran on the first ``active`` devices only holds their parts; the others have no rows."""

    seed_scale = 1.0

    def __init__(self, devices: Sequence[torch.device], output: torch.device, active: int | None = None) -> None:
        self.devices = tuple(devices)
        self.parts = len(self.devices)
        self.held = tuple(range(self.parts if active is None else active))
        self.device = output

    def sum(self, *quantities: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        totals = []
        for partials in quantities:
            total = partials[0].to(self.device)
            for partial in partials[1:]:
                total = total + partial.to(self.device)
            totals.append(total)
        return totals

    def concatenate(self, pieces: Sequence[torch.Tensor], splits: Sequence[int]) -> torch.Tensor:
        return torch.cat([piece.to(self.device) for piece in pieces])

    def row_counts(self, rows: Sequence[int]) -> tuple[int, ...]:
        return (*rows, *[0] * (self.parts - len(rows)))

    def objects(self, pieces: Sequence[list[Any]]) -> list[Any]:
        return [value for piece in pieces for value in piece]

    def place(self, value: torch.Tensor, piece: torch.Tensor) -> torch.Tensor:
        return value if value.device == piece.device else value.to(piece.device)

    def place_on(self, value: torch.Tensor, index: int) -> torch.Tensor:
        device = self.devices[index]
        return value if value.device == device else value.to(device, non_blocking=True)

    def row_table(self, rows: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
        idle = [0] * (self.parts - len(rows))
        return [(*(part[index] for part in rows), *idle) for index in range(len(rows[0]))]

    def __eq__(self, other: object) -> bool:
        return type(other) is ReplicaGroup and (other.devices, other.device, other.held) == (
            self.devices, self.device, self.held
        )

    def __hash__(self) -> int:
        return hash((self.devices, self.device, self.held))


class Monitor:
    """What a rank group tells the job's lockstep check of its collectives (``distributed/lockstep.py``); the
    default tells nothing."""

    def counts(self, like: torch.Tensor) -> torch.Tensor | None:
        """Elements a reduction carries so that every rank sees whether all made the same ones (None: none)."""
        return None

    def check(self, counts: torch.Tensor, what: str) -> None:
        """After the reduction: the counts it carried."""

    def waiting(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Around the collective: this rank waits in it."""
        return contextlib.nullcontext()


class RankGroup(Group):
    """The processes of the job, one part each (the distributed runtime)."""

    def __init__(
        self, rank: int, world_size: int, device: torch.device, metadata: Any = None, monitor: Monitor | None = None
    ) -> None:
        self.rank = rank
        self.parts = world_size
        self.held = (rank,)
        self.device = device
        self.seed_scale = 1.0 / world_size
        self._metadata = metadata
        """The process group for small host-side exchanges (row counts, objects): gloo, also under NCCL."""
        self.monitor = monitor or Monitor()
        self.mixings = 0
        """How many times a value held alike by every rank, computed with autograd (a collective's result, or
        something computed from one), went into a rank's own computation (``note_mixing``)."""

    def note_mixing(self, value: torch.Tensor) -> None:
        """From now on the gradient ``value`` receives differs between the ranks. A leaf (a parameter) cannot
        be downstream of a collective, and is not counted."""
        if value.requires_grad and value.grad_fn is not None and torch.is_grad_enabled():
            self.mixings += 1

    def sum(self, *quantities: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        values = [partials[0] for partials in quantities]
        return list(_SumOverRanks.apply(self, len(values), *values))

    def concatenate(self, pieces: Sequence[torch.Tensor], splits: Sequence[int]) -> torch.Tensor:
        return _GatherOverRanks.apply(tuple(splits), self, pieces[0])

    def row_counts(self, rows: Sequence[int]) -> tuple[int, ...]:
        return self.row_table([[rows[0]]])[0]

    def row_table(self, rows: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
        mine = torch.tensor(rows[0], dtype=torch.int64)
        everyone = [torch.empty_like(mine) for _ in range(self.parts)]
        self.monitor.counts(torch.zeros(1))  # counted, not carried: an all-gather sums nothing
        with self.monitor.waiting("an exchange of the rows of the model's outputs or of a selection"):
            dist.all_gather(everyone, mine, group=self._metadata)
        table = torch.stack(everyone).tolist()
        return [tuple(table[part][index] for part in range(self.parts)) for index in range(len(rows[0]))]

    def take_rank_zero_stream(self, device: torch.device) -> None:
        """Rank 0's random stream on the GPU ``device`` becomes this rank's, before a draw for a global value:
        under DataParallel the loop drew it on ``cuda:0``, whose stream rank 0's is (``global_view``)."""
        state = torch.cuda.get_rng_state(device)
        self.monitor.counts(torch.zeros(1))
        with self.monitor.waiting("the broadcast of rank 0's GPU random stream before a draw for the batch"):
            dist.broadcast(state, src=0, group=self._metadata)
        if self.rank:
            torch.cuda.set_rng_state(state, device)

    def objects(self, pieces: Sequence[list[Any]]) -> list[Any]:
        gathered: list[Any] = [None] * self.parts
        self.monitor.counts(torch.zeros(1))
        with self.monitor.waiting("a gather of the batch's per-row values"):
            dist.all_gather_object(gathered, list(pieces[0]), group=self._metadata)
        return [value for piece in gathered for value in piece]

    def first_failure(self, failure: ExceptionWrapper | None) -> ExceptionWrapper | None:
        """Whether any rank's replica raised in this forward (``failure``: this rank's error, or None), and the
        error of the lowest such rank, the one DataParallel re-raised of its replicas. One flag summed over the
        ranks when none did; the errors themselves only when one did."""
        flag = torch.tensor([0 if failure is None else 1], dtype=torch.int64)
        counts = self.monitor.counts(flag)
        what = "the check that every rank's replica ran its forward (fail_together)"
        with self.monitor.waiting(what):
            packed = flag if counts is None else torch.cat([flag, counts.to(torch.int64)])
            dist.all_reduce(packed, group=self._metadata)
        if counts is not None:
            self.monitor.check(packed[1:], what)
        if not packed[0].item():
            return None
        sent: tuple[str, ExceptionWrapper] | None = None
        if failure is not None:
            name = failure.exc_type.__name__
            try:
                pickle.loads(pickle.dumps(failure.exc_type))
            except Exception:  # a class the other ranks cannot load (defined in a function): a stand-in of its name
                failure.exc_type = RuntimeError
            sent = (name, failure)
        gathered: list[Any] = [None] * self.parts
        self.monitor.counts(torch.zeros(1))
        with self.monitor.waiting("a gather of the errors the replicas raised (fail_together)"):
            dist.all_gather_object(gathered, sent, group=self._metadata)
        name, raised = next(item for item in gathered if item is not None)
        if raised.exc_type.__name__ != name:
            raised.exc_type = type(name, (RuntimeError,), {"__module__": raised.exc_type.__module__})
        return raised

    def __eq__(self, other: object) -> bool:
        return type(other) is RankGroup and (other.rank, other.parts) == (self.rank, self.parts)

    def __hash__(self) -> int:
        return hash((self.rank, self.parts))


def _summed_parts(gradient: torch.Tensor, group: RankGroup, since: int) -> torch.Tensor:
    """The true gradient of a collective's result from this rank's part: the parts summed over the ranks. When no
    value held alike went into a rank's own computation since the result was made, every rank's part is the
    same (a backward from values held alike starts at 1/W everywhere), and the sum is W times this one's."""
    if group.mixings == since:
        return gradient * group.parts
    summed = gradient.contiguous().clone()
    dist.all_reduce(summed)
    return summed


def _carrier_dtype(values: Sequence[torch.Tensor]) -> torch.dtype:
    """One dtype that carries every value exactly enough: at least float32 for floating values (a half-precision
    sum of token counts overflows at 65504), int64 for counts and flags."""
    floating = [value.dtype for value in values if value.is_floating_point()]
    if not floating:
        return torch.int64
    dtype = floating[0]
    for other in floating[1:]:
        dtype = torch.promote_types(dtype, other)
    return torch.promote_types(dtype, torch.float32)


class _SumOverRanks(torch.autograd.Function):
    """Sums of several tensors over the ranks in one all-reduce. Backward: each rank's gradient of a sum is a
    part of the true one (package doc), so the parts are summed again (``_summed_parts``), and that is every
    input's gradient."""

    @staticmethod
    def forward(ctx, group: RankGroup, count: int, *values: torch.Tensor):
        ctx.group, ctx.mixings = group, group.mixings
        monitor = group.monitor
        ctx.shapes = [value.shape for value in values]
        ctx.dtypes = [value.dtype for value in values]
        carrier = _carrier_dtype(values)
        packed = torch.cat([value.detach().reshape(-1).to(carrier) for value in values])
        counts = monitor.counts(packed)
        sizes = [value.numel() for value in values]
        what = "a sum of global values (a loss, a metric, a count of the batch)"
        with monitor.waiting(what):
            if counts is None:
                dist.all_reduce(packed)
            else:
                packed = torch.cat([packed, counts])
                dist.all_reduce(packed)
                packed, counts = packed[: -len(counts)], packed[-len(counts) :]
        if counts is not None:
            monitor.check(counts, what)
        # Each total a tensor of its own, not a view of the packed sums: the loop may change one in place
        # (a detection loss's `loss_l /= num_pos`), which autograd forbids on a view a custom Function returns.
        totals = [
            part.reshape(shape).to(dtype, copy=True)
            for part, shape, dtype in zip(packed.split(sizes), ctx.shapes, ctx.dtypes)
        ]
        for total, value in zip(totals, values):
            if not value.is_floating_point():
                ctx.mark_non_differentiable(total)
        return tuple(totals)

    @staticmethod
    def backward(ctx, *gradients: torch.Tensor):
        present = [(index, gradient) for index, gradient in enumerate(gradients) if gradient is not None]
        result: list[torch.Tensor | None] = [None] * len(gradients)
        if present:
            carrier = _carrier_dtype([gradient for _, gradient in present])
            packed = torch.cat([gradient.reshape(-1).to(carrier) for _, gradient in present])
            packed = _summed_parts(packed, ctx.group, ctx.mixings)
            sizes = [gradient.numel() for _, gradient in present]
            for (index, gradient), part in zip(present, packed.split(sizes)):
                result[index] = part.reshape(gradient.shape).to(gradient.dtype)
        return (None, None, *result)


# What a dtype that gloo and NCCL cannot gather travels as, exactly: bool as uint8; int16 and the unsigned
# integers wider than a byte as the next signed integer that holds them (YOLOv4's `labels.to(torch.int16)`, read
# with `.numpy()`, failed with "Invalid scalar type"); uint64 bit for bit as int64.
_GATHERED_AS = {
    torch.bool: torch.uint8,
    torch.int16: torch.int32,
    torch.uint16: torch.int32,
    torch.uint32: torch.int64,
}


def _gatherable(value: torch.Tensor) -> torch.Tensor:
    if value.dtype == torch.uint64:
        return value.view(torch.int64)
    if value.is_complex():
        return torch.view_as_real(value)
    carrier = _GATHERED_AS.get(value.dtype)
    return value.to(carrier) if carrier is not None else value


def _restored(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.uint64:
        return value.view(torch.uint64)
    if dtype.is_complex:
        return torch.view_as_complex(value.contiguous())
    return value.to(dtype)


class _GatherOverRanks(torch.autograd.Function):
    """The global tensor from every rank's rows (an all-gather; gloo needs equal sizes, so pieces are padded to
    the largest part). Backward: the parts of the global gradient are summed over the ranks, and this rank
    keeps its rows."""

    @staticmethod
    def forward(ctx, splits: tuple[int, ...], group: RankGroup, piece: torch.Tensor) -> torch.Tensor:
        ctx.splits, ctx.group, ctx.mixings = splits, group, group.mixings
        monitor = group.monitor
        largest = max(splits)
        carried = _gatherable(piece.detach())
        padded = carried.new_zeros((largest, *carried.shape[1:]))
        padded[: piece.shape[0]] = carried
        gathered = [torch.empty_like(padded) for _ in splits]
        monitor.counts(torch.zeros(1))  # counted, not carried: an all-gather sums nothing
        with monitor.waiting("a gather of a global value (materialised for an operation with no rule of its own)"):
            dist.all_gather(gathered, padded)
        full = torch.cat([part[:rows] for part, rows in zip(gathered, splits)])
        return _restored(full, piece.dtype)

    @staticmethod
    def backward(ctx, gradient: torch.Tensor):
        summed = _summed_parts(gradient, ctx.group, ctx.mixings)
        rank = ctx.group.rank
        start = sum(ctx.splits[:rank])
        return None, None, summed[start : start + ctx.splits[rank]]
