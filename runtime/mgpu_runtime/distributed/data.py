"""``distribute_loader``: each rank's slice of exactly the global batches the original loader produces.

The original loader, run in one process, produced global batches; the DataParallel original split each
over its GPUs. Here rank ``r`` yields the ``r``-th contiguous span of every global batch, in the original
order, with spans cut as ``torch.chunk`` (DataParallel's scatter) cuts them (``slicing.py``). Nothing is padded or repeated, so
counting what each rank saw and summing (``reduce_sum``) counts every sample once. ``len()`` is the
original's: the number of global batches.

Randomness is drawn once, on rank 0, as the original process would have drawn it, and shared: a sampler
that shuffles from the global generator draws on rank 0 at the same moment and from the same state as in
the original run, whether or not the script seeds. Rank 0's generator states (torch's CPU one, NumPy's and
Python's, which a sampler of the script's own may draw from: ``generators.py``) travel with the batches and the
other ranks take them, so after the sampler's draws every rank's generators are where the original process's
were; the wrapped model's forward draws from its device's own stream (``global_view.py``), so it never makes
the loop's generators drift apart. Each new epoch (``iter()``) draws anew, as the original did.

Two ways to get there, by what the loader is:

* A plain ``DataLoader`` over a map-style dataset (the common case): rank 0 runs the original batch
  sampler and broadcasts its index batches (a few dozen at a time); every rank loads only its span of each,
  with the original dataset, ``collate_fn``, workers, pinning and worker seeding, so data loading is
  divided among the ranks rather than repeated. With the default collate (slice-invariant: collating a
  span gives the span of the collated batch) ``collate_fn`` sees the rank's span of samples; a
  ``collate_fn`` of the script's own may pad to the batch's longest sample or otherwise depend on the whole
  batch, so every rank loads and collates the whole global batch and keeps its span of rows, which is what
  DataParallel scattered. A dataset that draws per sample (random augmentation) draws, on a rank loading
  its span only, numbers of the original's distribution but not the original's numbers;
  ``distribute_loader(loader, whole_batches=True)`` (which ``mgpu-migrate`` writes where the file builds random
  transforms) or ``MGPU_WHOLE_BATCHES=1`` loads the whole batch there too, for exactly the original's. A rank
  whose span is empty loads the batch's first sample and cuts it to zero rows, so it still has a batch of
  the right structure to run forward and backward on. Batches are kept in order (``in_order=True``), which
  keeping ranks aligned requires.
* Anything else (an ``IterableDataset``, ``batch_size=None``, a ``DataLoader`` subclass, any iterable of
  batches): rank 0 iterates the original and sends each rank its span of every collated batch
  (``slicing.py``), like DataParallel's scatter. Rank 0 then does all the loading, as the original did.

What the loop gets is the global batch (``mgpu_runtime.sharded``): its tensors of the batch's rows are
``Sharded`` values, of which this rank holds its span, and everything else (a per-batch tensor of another
size, a list of file names, a number) is the whole global batch's, the same on every rank; a list of
per-row values that a rank loaded only its span of is gathered from the ranks (one small collective). In a
world of one ``distribute_loader`` returns the loader itself.
"""

from __future__ import annotations

import inspect
import os
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, Sampler, default_collate

from mgpu_runtime.distributed.generators import generator_states, take_generator_states
from mgpu_runtime.distributed.process_group import job, rank, setup, world_size
from mgpu_runtime.distributed.slicing import Span, batch_rows, global_batch, spans, take_rows
from mgpu_runtime.structure import tensors

# Index batches per broadcast: bounded memory for huge datasets, few collectives per epoch. Only torch's own
# samplers are read that far ahead: they draw at the start of an epoch and keep no state a script saves.
_INDEX_BATCHES_PER_BROADCAST = 64
# How a DataLoader is rebuilt around the sharded batch sampler: every setting but the sampling ones.
_KEPT_LOADER_SETTINGS = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
)
_LOADER_PARAMETERS = inspect.signature(DataLoader.__init__).parameters

T = TypeVar("T")


WHOLE_BATCHES_VARIABLE = "MGPU_WHOLE_BATCHES"
"""``MGPU_WHOLE_BATCHES=1``: every rank loads the whole global batch and keeps its rows. A dataset that draws
random numbers per sample (``transforms.RandomCrop``, a flip in ``__getitem__``) then draws exactly the
original's numbers, at W times the loading work; by default each rank loads only its rows, whose draws have
the original's distribution but not its numbers."""


def whole_batches_asked() -> bool:
    value = os.environ.get(WHOLE_BATCHES_VARIABLE, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{WHOLE_BATCHES_VARIABLE}={value!r}: expected 0 or 1")
    return value == "1"


def distribute_loader(loader: Iterable[Any], whole_batches: bool = False) -> Iterable[Any]:
    """The distributed twin of ``loader`` (see the module doc); ``loader`` itself in a world of one.
    ``whole_batches=True`` (what ``mgpu-migrate`` writes for a dataset whose transforms draw per sample) has every
    rank load the whole global batch, as ``MGPU_WHOLE_BATCHES=1`` does: its random draws are the original's."""
    setup()
    if world_size() == 1:
        return loader
    if (
        type(loader) is DataLoader
        and not isinstance(loader.dataset, IterableDataset)
        and loader.batch_sampler is not None
    ):
        return _IndexShardedLoader(loader, whole_batches)
    return _ScatteredLoader(loader)


def distribute_loaders(loaders: Any, whole_batches: bool = False) -> Any:
    """Each loader of a dict, list or tuple of loaders through ``distribute_loader``, in a container of the same
    kind and keys (the transfer-learning tutorial's ``dataloaders``, built by a project function and handed to a
    loop that reads ``dataloaders[phase]``); ``loaders`` itself in a world of one."""
    if not isinstance(loaders, (dict, list, tuple)):
        raise TypeError(f"distribute_loaders takes a dict, list or tuple of loaders, not {type(loaders).__name__}")
    setup()
    if world_size() == 1:
        return loaders
    if isinstance(loaders, dict):
        return type(loaders)((key, distribute_loader(loader, whole_batches)) for key, loader in loaders.items())
    return type(loaders)(distribute_loader(loader, whole_batches) for loader in loaders)


class _LoaderTwin(ABC):
    """What both twins share: the original's length and attributes."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self._loader = loader

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        # dataset, batch_size, sampler ...: the original's, so code that reads them keeps working.
        if name == "_loader":
            raise AttributeError(name)
        return getattr(self._loader, name)

    def __iter__(self) -> Iterator[Any]:
        return self._batches_and_spans()

    @abstractmethod
    def _batches_and_spans(self) -> Iterator[Any]:
        """Each global batch, as this rank holds it."""


class _IndexShardedLoader(_LoaderTwin):
    def __init__(self, loader: DataLoader, whole_batches: bool = False) -> None:
        super().__init__(loader)
        # A collate_fn of the script's own may not be slice-invariant (padding to the batch's longest sample,
        # per-batch normalisation): it collates the whole global batch, of which the rank keeps its rows.
        # So does a dataset that draws (random augmentation: whole_batches=True, or MGPU_WHOLE_BATCHES=1).
        self._whole_batches = whole_batches or loader.collate_fn is not default_collate or whole_batches_asked()
        self._shards = _ShardedBatchSampler(loader.batch_sampler, self._whole_batches)
        settings = {name: getattr(loader, name) for name in _KEPT_LOADER_SETTINGS if name in _LOADER_PARAMETERS}
        if "in_order" in _LOADER_PARAMETERS:
            settings["in_order"] = True
        self._local = DataLoader(loader.dataset, batch_sampler=self._shards, **settings)

    def _batches_and_spans(self) -> Iterator[Any]:
        # The loader's iterator is made now, as `iter(loader)` makes the original's: that draws its workers' base
        # seed from torch's generator (with workers, the sampler's first order too), before the script's next draw.
        return self._spans_of(iter(self._local))

    def _spans_of(self, batches: Iterator[Any]) -> Iterator[Any]:
        group = job().group
        for batch in batches:
            span = self._shards.handed_out.popleft()
            if not self._whole_batches and not span.rows:
                batch = take_rows(batch, 0, 0, batch_rows(batch))
            yield global_batch(batch, span, group, whole=self._whole_batches)


class _ShardedBatchSampler(Sampler[list[Any]]):
    """The original batch sampler's batches, drawn on rank 0, cut down to this rank's span of indices."""

    def __init__(self, batch_sampler: Iterable[list[Any]], whole: bool) -> None:
        self._batch_sampler = batch_sampler
        self._whole = whole
        self.handed_out: deque[Span] = deque()
        """The span of each index batch handed to the DataLoader and not yet yielded (it prefetches)."""

    def __len__(self) -> int:
        return len(self._batch_sampler)

    def __iter__(self) -> Iterator[list[Any]]:
        self.handed_out.clear()
        ahead = _INDEX_BATCHES_PER_BROADCAST if _draws_up_front(self._batch_sampler) else 1
        for indices in _shared_from_rank_zero(self._batch_sampler, ahead):
            span = spans(len(indices), world_size())[rank()]
            self.handed_out.append(span)
            start, stop = span.start, span.start + span.rows
            if self._whole:
                yield indices
            else:
                # An empty span still loads one sample, cut to zero rows later, for a batch of the right structure.
                yield indices[start:stop] if stop > start else indices[:1]


class _ScatteredLoader(_LoaderTwin):
    def _batches_and_spans(self) -> Iterator[Any]:
        group = job().group
        batches = iter(self._loader) if rank() == 0 else None
        while True:
            pieces = _pieces(next(batches, None)) if batches is not None else None
            received: list[Any] = [None]
            group.monitor.counts(torch.zeros(1))
            with group.monitor.waiting("the loader's scatter of rank 0's next batch"):
                dist.scatter_object_list(received, pieces, src=0)
            if received[0] is None:
                return
            piece, span, generator_state, cut = received[0]
            if batches is None:
                take_generator_states(generator_state)  # as in _shared_from_rank_zero
            yield global_batch(piece, span, group, whole=False, cut=cut)


def _pieces(batch: Any) -> list[tuple[Any, Span, Any, list[bool]] | None]:
    """Every rank's span of ``batch`` (its per-row lists whole: they are small and every rank needs them) with
    the span, rank 0's generator state and which tensors were cut; after the last batch (None), None for every
    rank."""
    if batch is None:
        return [None] * world_size()
    rows = batch_rows(batch)
    state = generator_states()
    cut = [tensor.dim() > 0 and tensor.shape[0] == rows for tensor in tensors(batch)]
    return [
        (take_rows(batch, span.start, span.start + span.rows, rows, lists=False), span, state, cut)
        for span in spans(rows, world_size())
    ]


def _draws_up_front(batch_sampler: Iterable[list[Any]]) -> bool:
    """Whether reading the sampler ahead changes nothing the script sees: torch's own batch sampler over one of
    torch's samplers, which draw their order when an epoch starts. A sampler of the script's own may draw from
    the global generator as it goes, or keep a position the script saves with the checkpoint (audioset's
    TrainSampler): it is read one batch at a time, as the original DataLoader read it (its own workers'
    prefetch comes on top, as in the original)."""
    sampler = getattr(batch_sampler, "sampler", None)
    return all(
        part is not None and type(part).__module__.startswith("torch.utils.data.") for part in (batch_sampler, sampler)
    )


def _shared_from_rank_zero(items: Iterable[T], ahead: int = _INDEX_BATCHES_PER_BROADCAST) -> Iterator[T]:
    """The items of ``items``, iterated on rank 0 only and broadcast to every rank in chunks of ``ahead``.

    With each chunk goes rank 0's global generator state, which the other ranks take: only rank 0 drew the
    sampler's randomness, and every other draw of the loop is the same on every rank (``global_view.py``), so
    every rank's generator stays where the original process's was.
    """
    iterator = iter(items) if rank() == 0 else None
    while True:
        chunk = [
            (list(islice(iterator, ahead)), generator_states())
            if iterator is not None
            else None
        ]
        monitor = job().lockstep
        monitor.counts(torch.zeros(1))
        with monitor.waiting("the loader's broadcast of rank 0's next index batches"):
            dist.broadcast_object_list(chunk, src=0)
        items_now, generator_state = chunk[0]
        if iterator is None:
            take_generator_states(generator_state)
        yield from items_now
        if len(items_now) < ahead:
            return
