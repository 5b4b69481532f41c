"""Shared helpers for the balanced-runtime tests: small float64 models and the exactness check.

Every exactness test runs the same loop code twice: as the original, on a module under ``nn.DataParallel``
on the emulated devices (``mgpu_runtime.emulation``, the reference of the runtime contract), and as the
migration, through the balanced wrappers on an identical copy; it compares the loss and every parameter
gradient.
"""

from __future__ import annotations

import types

import copy
from collections import OrderedDict, namedtuple
from dataclasses import dataclass, fields
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mgpu_runtime.balanced import DataParallelModel
from mgpu_runtime.emulation.data_parallel import DataParallel as EmulatedDataParallel
from mgpu_runtime.sharded import materialize

TOLERANCE = 1e-6
FEATURES, CLASSES, VOCABULARY = 5, 4, 11


def use_cpu_replicas(monkeypatch: pytest.MonkeyPatch, count: int | None) -> None:
    """Pretend to have ``count`` devices through the ``MGPU_CPU_REPLICAS`` contract (None: unset)."""
    if count is None:
        monkeypatch.delenv("MGPU_CPU_REPLICAS", raising=False)
    else:
        monkeypatch.setenv("MGPU_CPU_REPLICAS", str(count))


def max_abs_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return (actual.detach() - expected.detach()).abs().max().item()


def assert_matches_data_parallel(
    make_module: Callable[[], nn.Module],
    parallel_loss: Callable[[DataParallelModel], torch.Tensor],
    original_loss: Callable[[nn.Module], torch.Tensor],
) -> None:
    """The loss and every gradient through DataParallelModel equal those of the original loop code under
    ``nn.DataParallel`` on as many emulated devices as there are CPU replicas, within TOLERANCE."""
    original = make_module()
    twin = copy.deepcopy(original)
    migrated = DataParallelModel(twin)  # emulates the MGPU_CPU_REPLICAS devices
    torch.manual_seed(0)
    expected = original_loss(EmulatedDataParallel(original))
    expected.backward()
    torch.manual_seed(0)
    actual = parallel_loss(migrated)
    actual.backward()
    assert actual.shape == expected.shape
    assert max_abs_diff(materialize(actual), expected) <= TOLERANCE, (actual, expected)
    for (name, parameter), reference in zip(twin.named_parameters(), original.parameters()):
        assert parameter.grad is not None, name
        assert max_abs_diff(parameter.grad, reference.grad) <= TOLERANCE, name


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def features(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, FEATURES, dtype=torch.float64, generator=seeded(seed))


def labels(rows: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, CLASSES, (rows,), generator=seeded(seed))


class Classifier(nn.Module):
    """Two layers; returns logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.hidden = nn.Linear(FEATURES, 16)
        self.head = nn.Linear(16, CLASSES)
        self.double()

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.hidden(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


Pair = namedtuple("Pair", ["logits", "features"])


@dataclass
class DataclassOutput:
    logits: torch.Tensor
    features: torch.Tensor
    note: str = "unchanged"


class StructuredClassifier(Classifier):
    """Returns logits and features as a tuple, list, dict, namedtuple or dataclass."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor) -> Any:
        hidden = self.features(x)
        logits = self.head(hidden)
        return {
            "tuple": lambda: (logits, hidden),
            "list": lambda: [logits, hidden],
            "dict": lambda: {"logits": logits, "features": hidden},
            "namedtuple": lambda: Pair(logits, hidden),
            "dataclass": lambda: DataclassOutput(logits, hidden),
        }[self.kind]()


def logits_of(output: Any, kind: str) -> Any:
    """Where each structured output keeps its logits."""
    return {
        "tuple": lambda: output[0],
        "list": lambda: output[0],
        "dict": lambda: output["logits"],
        "namedtuple": lambda: output.logits,
        "dataclass": lambda: output.logits,
    }[kind]()


@dataclass
class LMOutput(OrderedDict):
    """A stand-in for transformers' ModelOutput: a dataclass that is also a mapping of its non-None fields,
    indexable by name or by position among them."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple | None = None

    def __post_init__(self) -> None:
        first = fields(self)[0].name
        if not isinstance(getattr(self, first), torch.Tensor) and getattr(self, first) is not None:
            # As transformers' ModelOutput: built from an iterator of (key, value) pairs (DataParallel's gather
            # rebuilds a mapping so), its first field holds the iterator.
            pairs = dict(getattr(self, first))
            for field in fields(self):
                setattr(self, field.name, pairs.get(field.name))
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None:
                super().__setitem__(field.name, value)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return super().__getitem__(key)
        return tuple(self.values())[key]


class TokenModel(nn.Module):
    """A tiny language model: (batch, tokens) ids -> (batch, tokens, vocabulary) logits, loss inside
    forward when labels are given (mean over non-ignored tokens, like transformers' models)."""

    def __init__(self, flatten: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.Embedding(VOCABULARY, 8)
        self.head = nn.Linear(8, VOCABULARY)
        self.flatten = flatten
        self.double()

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        logits = self.head(torch.tanh(self.embedding(ids)))
        if self.flatten:
            return logits.reshape(-1, VOCABULARY)
        loss = None if labels is None else F.cross_entropy(logits.reshape(-1, VOCABULARY), labels.reshape(-1))
        return LMOutput(loss=loss, logits=logits)


def token_ids(rows: int, tokens: int = 3, seed: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCABULARY, (rows, tokens), generator=seeded(seed))


def patch_replication_callback(wrapper: nn.Module) -> None:
    """What the synchronized-BatchNorm packages' ``patch_replication_callback`` does to a DataParallel: its
    ``replicate``, then every layer of every replica told its copy number, with one context per layer."""
    old = wrapper.replicate

    def replicate(module, device_ids):
        replicas = old(module, device_ids)
        contexts = [types.SimpleNamespace() for _ in replicas[0].modules()]
        for copy_id, replica in enumerate(replicas):
            for context, layer in zip(contexts, replica.modules()):
                if hasattr(layer, "__data_parallel_replicate__"):
                    layer.__data_parallel_replicate__(context, copy_id)
        return replicas

    wrapper.replicate = replicate
