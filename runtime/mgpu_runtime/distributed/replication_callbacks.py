"""``replication_callbacks=True``: a synchronized BatchNorm's copies, told each other over the ranks.

The Synchronized-BatchNorm package (vendored as ``sync_batchnorm/`` by first-order-model, SimCLR,
EfficientDet and many segmentation projects) normalises over the whole batch of one DataParallel forward.
Its ``DataParallelWithCallback`` calls each layer's ``__data_parallel_replicate__(ctx, copy_id)`` on every
replica it makes: the layer becomes parallel (``_is_parallel``), the copy with id 0 keeps the master
(``_sync_master``) and the others get a pipe to it (``_slave_pipe``). In the forward of a training replica, each
copy sends its sums (``input_sum``, ``input_ssum``, ``sum_size``) to the master, which adds them up, computes
the mean and the inverse deviation with the layer's ``_compute_mean_std`` (through the callback its master was
built with: the module's own layer, so what that method assigns, ``self.running_mean = ...``, is the module's),
and sends them back; autograd carries the gradients of those statistics back to every copy.

Under DDP each process holds one replica, and the master would wait forever for copies that are in the other
processes. ``DistributedDataParallel(module, replication_callbacks=True)`` (what ``mgpu-migrate`` writes for such
a wrapper) gives each of those layers, for the time of each forward, what the callback gave the replica of this
rank: parallel, and a pipe whose ``run_slave(message)`` sums the message's statistics over the ranks (one
collective, whose backward sums the ranks' gradients of the statistics, as the master's broadcast did) and
computes the mean and inverse deviation with the layer's own ``_compute_mean_std`` where DataParallel's master
copy computed them: on the module's own layer for the package (its ``SyncMaster`` holds the callback bound when
the layer was built, so the running statistics ``_compute_mean_std`` assigns are kept), on a replica of the layer
(its own dict of buffers, as DataParallel's replica 0 had) for a layer whose callback binds a new master to the
replica. After the forward the layer is as the module's was
under DataParallel: not parallel, so saved or evaluated it is a plain BatchNorm. Another layer that meets its
copies through ``__data_parallel_replicate__`` in a way the runtime does not know is refused at the wrap.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from mgpu_runtime.distributed.sync_batchnorm import _SharedStatistics

# What the package's layers hold and call: how the runtime knows the protocol it reproduces.
_PROTOCOL_STATE = ("_sync_master", "_slave_pipe", "_is_parallel", "_parallel_id")
_PROTOCOL_METHODS = ("__data_parallel_replicate__", "_compute_mean_std")


def told_copies(module: nn.Module) -> list[nn.Module]:
    """The layers of ``module`` a replication callback tells their copies: the Synchronized-BatchNorm package's.
    Raises for a layer with a callback of another kind, which the runtime cannot link over the ranks."""
    layers = []
    for name, layer in module.named_modules():
        if not hasattr(layer, "__data_parallel_replicate__"):
            continue
        if not all(hasattr(layer, attribute) for attribute in _PROTOCOL_STATE + _PROTOCOL_METHODS):
            raise TypeError(
                f"mgpu_runtime.DistributedDataParallel: `{name or 'the model'}` ({type(layer).__module__}."
                f"{type(layer).__qualname__}) meets its copies through __data_parallel_replicate__ in a way the "
                "runtime does not know (the Synchronized-BatchNorm package's layers it does); under DDP each process "
                "holds one replica. Use torch.nn.SyncBatchNorm in its place, or migrate with --to balanced"
            )
        layers.append(layer)
    return layers


class _RankPipe:
    """What a layer's ``_slave_pipe`` is during a forward: its statistics summed over the ranks."""

    def __init__(self, layer: nn.Module) -> None:
        self._layer = layer
        self._on_the_layer = _master_computes_on_the_layer(layer)

    def run_slave(self, message: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        input_sum, input_ssum, size = message[0], message[1], message[2]
        channels = input_sum.numel()
        packed = torch.cat(
            [input_sum.to(torch.float64), input_ssum.to(torch.float64), input_sum.new_full((1,), float(size), dtype=torch.float64)]
        )
        total = _SharedStatistics.apply(packed)
        summed = total[:channels].to(input_sum.dtype)
        squares = total[channels : 2 * channels].to(input_ssum.dtype)
        rows = int(round(total[-1].item()))
        # The package's layer, whose method nn.Module does not declare: the layer itself when DataParallel's master
        # copy computes on it (the running statistics it assigns stay), else a replica of it (they are lost).
        computing: Any = self._layer if self._on_the_layer else _replica_of(self._layer)
        mean, inverse_deviation = computing._compute_mean_std(summed, squares, rows)
        return mean, inverse_deviation

    def __reduce__(self) -> Any:
        return (type(None), ())  # a pickle of the layer mid-forward holds no pipe, as a fresh layer


def _master_computes_on_the_layer(layer: nn.Module) -> bool:
    """Whether, under DataParallel, the master copy's ``_compute_mean_std`` runs on the module's own layer: the
    package's ``SyncMaster`` holds the callback ``_data_parallel_master`` bound when the layer was built, so the
    statistics it assigns (``self.running_mean = ...``) are the module's. What replica 0's
    ``__data_parallel_replicate__(ctx, 0)`` does is played on a copy of the layer holding a copy of its master
    (the layer is left as it is): a layer whose callback binds a new master to the replica computes on the replica."""
    probe: Any = _replica_of(layer)
    master = layer.__dict__.get("_sync_master")
    if master is None:
        return False
    probe.__dict__["_sync_master"] = copy.copy(master)
    probe.__dict__["_sync_master"].__dict__ = dict(master.__dict__)
    probe.__data_parallel_replicate__(_Context(), 0)
    callbacks = [
        value
        for value in vars(probe.__dict__["_sync_master"]).values()
        if inspect.ismethod(value) and value.__func__.__name__ == "_data_parallel_master"
    ]
    return bool(callbacks) and all(callback.__self__ is layer for callback in callbacks)


class _Context:
    """The context replication callbacks share between the copies of one layer."""


def _replica_of(layer: nn.Module) -> nn.Module:
    """A shallow copy of ``layer`` with its own dict of buffers (DataParallel's replica 0 on the first device)."""
    replica = layer.__class__.__new__(layer.__class__)
    replica.__dict__ = dict(layer.__dict__)
    replica._buffers = dict(layer._buffers)
    return replica


@contextlib.contextmanager
def linked(layers: Sequence[nn.Module]) -> Iterator[None]:
    """For the time of one forward, each layer as the callback left this rank's replica (see the module doc)."""
    if not layers:
        yield
        return
    saved = [{name: layer.__dict__.get(name) for name in _PROTOCOL_STATE[1:]} for layer in layers]
    for layer in layers:
        # Copy 1's path (the pipe) on every rank: the master's would wait for copies of its own process.
        layer.__dict__.update(_is_parallel=True, _parallel_id=1, _slave_pipe=_RankPipe(layer))
    try:
        yield
    finally:
        for layer, state in zip(layers, saved):
            layer.__dict__.update(state)
