"""The balanced model's outputs are what DataParallel's gather gave, held on the replicas (``Sharded``), gathering
only what is used; one set of types for 0, 1 and N devices."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mgpu_runtime.balanced import DataParallelCriterion, DataParallelModel, gather
from mgpu_runtime.sharded import ReplicaGroup, Sharded
from tests.runtime.conftest_balanced import (
    Classifier,
    DataclassOutput,
    LMOutput,
    Pair,
    StructuredClassifier,
    TokenModel,
    features,
    token_ids,
    use_cpu_replicas,
)


def same(actual, expected) -> bool:
    """Equal up to the last bits that a different batch split may change in matrix products."""
    actual = torch.as_tensor(actual).detach()
    expected = torch.as_tensor(expected).detach()
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    if actual.dtype == torch.bool:
        return bool((actual == expected).all())
    return torch.allclose(actual, expected, rtol=0, atol=1e-12)


@pytest.fixture
def three_replicas(monkeypatch):
    use_cpu_replicas(monkeypatch, 3)


@pytest.fixture
def tensor_output(three_replicas):
    module = Classifier()
    x = features(7)
    return DataParallelModel(module)(x), module(x)


def test_tensor_output_passes_for_the_gathered_tensor(tensor_output):
    output, expected = tensor_output
    assert type(output) is Sharded and output._splits == (3, 3, 1)
    assert isinstance(output, torch.Tensor) and torch.is_tensor(output)
    assert same(gather(output), expected)
    assert output.shape == expected.shape and output.size() == expected.size() and output.size(1) == 4
    assert output.dim() == output.ndim == 2 and output.dtype == torch.float64 and output.device.type == "cpu"
    assert len(output) == 7
    assert same(output[2:5], expected[2:5]) and same(output[:, 1], expected[:, 1])
    assert same(output.argmax(1), expected.argmax(1))
    assert same(torch.argmax(output, 1), expected.argmax(1))
    assert same(F.softmax(output, dim=1), F.softmax(expected, dim=1))
    assert same(torch.from_numpy(output.detach().numpy()), expected)
    assert same(torch.cat([output, output]), torch.cat([expected, expected]))
    assert [same(row, reference) for row, reference in zip(output, expected)] == [True] * 7


def test_operators_see_the_gathered_tensor(tensor_output):
    output, expected = tensor_output
    weight = torch.ones(4, 2, dtype=torch.float64)
    pairs = [
        (output + 1, expected + 1),
        (1 + output, 1 + expected),
        (output * output, expected * expected),
        (2 - output, 2 - expected),
        (output / 2, expected / 2),
        (-output, -expected),
        (abs(output), abs(expected)),
        (output @ weight, expected @ weight),
        (output > 0, expected > 0),
        (output == gather(output), torch.ones_like(expected, dtype=torch.bool)),
        (output ** 2, expected**2),
    ]
    for actual, wanted in pairs:
        assert same(actual, wanted)


@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")
def test_scalar_conversions_and_formatting(tensor_output):
    output, expected = tensor_output
    total = output.sum()
    assert abs(float(output[0, 0]) - float(expected[0, 0])) <= 1e-12
    assert abs(output.max().item() - expected.max().item()) <= 1e-12
    assert f"{output[0, 0]:.3f}" == f"{expected[0, 0]:.3f}"
    assert bool(output[0, 0] > expected[0, 0] - 1e-12)
    assert int((output > 0).sum()) == int((expected > 0).sum())
    assert repr(output).startswith("tensor([[") and str(output) == repr(output)
    assert total.requires_grad


def test_tuple_outputs_unpack_and_index_lazily(three_replicas):
    module = StructuredClassifier("tuple")
    x = features(7)
    logits, hidden = DataParallelModel(module)(x)
    expected_logits, expected_hidden = module(x)
    assert type(logits) is Sharded and same(gather(logits), expected_logits)
    assert same(gather(hidden), expected_hidden)
    output = DataParallelModel(module)(x)
    assert isinstance(output, tuple) and len(output) == 2
    assert same(gather(output[-1]), expected_hidden)
    assert all(same(a, b) for a, b in zip(gather(output), (expected_logits, expected_hidden)))


@pytest.mark.parametrize("kind", ["dict", "namedtuple", "dataclass"])
def test_named_outputs(three_replicas, kind):
    module = StructuredClassifier(kind)
    x = features(7)
    output = DataParallelModel(module)(x)
    expected = module(x)
    gathered = gather(output)
    assert type(gathered) is type(expected)
    if kind == "dict":
        assert isinstance(output, dict) and set(output) == {"logits", "features"} and "logits" in output
        assert same(output["logits"].sum(0), expected["logits"].sum(0))
        assert list(output.keys()) == ["logits", "features"]
    elif kind == "namedtuple":
        assert isinstance(output, Pair) and output._fields == ("logits", "features")
        assert same(gather(output.logits), expected.logits)
    else:
        assert isinstance(output, DataclassOutput) and output.note == "unchanged"
        assert same(gather(output.features), expected.features)


def test_model_output_loss_gathers_without_the_logits(three_replicas, monkeypatch):
    gathered = []
    concatenate = ReplicaGroup.concatenate
    monkeypatch.setattr(ReplicaGroup, "concatenate", lambda self, pieces, splits: gathered.append(len(splits)) or concatenate(self, pieces, splits))
    model = DataParallelModel(TokenModel())
    ids, targets = token_ids(7), token_ids(7, seed=5)
    outputs = model(ids, labels=targets)
    assert isinstance(outputs, LMOutput) and "loss" in outputs
    assert outputs.hidden_states is None
    outputs.loss.mean().item()
    outputs.logits.argmax(-1)  # row-wise: on each replica
    assert gathered == []
    outputs.logits[0]  # a row of the first replica's piece: the logits are gathered
    assert gathered == [3]


def test_a_loss_computed_in_forward_is_a_vector_of_the_devices_losses(three_replicas):
    """As DataParallel's gather gives it: one loss per device that ran, which the script averages."""
    module = TokenModel()
    ids, targets = token_ids(7), token_ids(7, seed=5)
    loss = DataParallelModel(module)(ids, labels=targets).loss
    pieces = [module(ids[rows], labels=targets[rows]).loss for rows in (slice(0, 3), slice(3, 6), slice(6, 7))]
    assert loss.shape == (3,) and loss.dim() == 1 and len(loss) == 3
    assert same(gather(loss), torch.stack(pieces))
    assert abs(loss.mean().item() - torch.stack(pieces).mean().item()) <= 1e-12


def test_integer_scalars_are_a_vector_too(three_replicas):
    class CountPositive(nn.Module):
        def forward(self, x):
            return (x > 0).sum()

    x = features(7)
    counts = DataParallelModel(CountPositive())(x)
    assert gather(counts).tolist() == [int((x[rows] > 0).sum()) for rows in (slice(0, 3), slice(3, 6), slice(6, 7))]
    assert counts.sum().item() == int((x > 0).sum())


def test_an_output_data_parallel_cannot_gather_is_an_error_that_says_so(three_replicas):
    class Describe(nn.Module):
        def forward(self, x):
            return "described"

    with pytest.raises(TypeError, match="nn.DataParallel cannot gather"):
        DataParallelModel(Describe())(features(5))


def test_operations_that_crashed_the_old_proxy_run(tensor_output):
    """``torch.pow`` on the output, a custom autograd Function applied to it, and a tuple output handed to a
    criterion whole (PyTorch-Encoding style) are the gathered tensor's operations."""
    output, expected = tensor_output

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, value):
            ctx.save_for_backward(value)
            return value * value

        @staticmethod
        def backward(ctx, gradient):
            (value,) = ctx.saved_tensors
            return 2 * value * gradient

    assert same(torch.pow(output, 2), expected**2)
    assert same(Square.apply(output), expected**2)
    module = StructuredClassifier("tuple")
    x, y = features(7), torch.arange(7) % 4

    def encoding_style(outputs, target):
        logits, hidden = outputs
        return F.cross_entropy(logits, target) + 0.1 * hidden.pow(2).mean()

    loss = DataParallelCriterion(encoding_style)(DataParallelModel(module)(x), y)
    assert same(loss, encoding_style(module(x), y))


def test_gather_passes_plain_values_through():
    value = torch.ones(2)
    assert gather(value) is value and gather(None) is None and gather((value,))[0] is value


def test_copies_and_pickles_are_of_the_gathered_value(tensor_output):
    output, expected = tensor_output
    detached = output.detach()
    assert type(copy.copy(output)) is torch.Tensor and same(copy.copy(output), expected)
    assert same(pickle.loads(pickle.dumps(detached)), expected)
    assert type(copy.deepcopy(detached)) is torch.Tensor and same(copy.deepcopy(detached), expected)
    restored = pickle.loads(pickle.dumps(DataParallelModel(Classifier())(features(7)).detach()))
    assert type(restored) is torch.Tensor


@pytest.mark.parametrize("replicas", [None, 1, 3], ids=["no-replicas", "one-replica", "three-replicas"])
@pytest.mark.parametrize("kind", ["tensor", "tuple", "dict", "model-output"])
def test_same_output_types_for_zero_one_and_many_devices(monkeypatch, replicas, kind):
    use_cpu_replicas(monkeypatch, replicas)
    if kind == "tensor":
        module, inputs = Classifier(), (features(7),)
    elif kind == "model-output":
        module, inputs = TokenModel(), (token_ids(7), token_ids(7, seed=5))
    else:
        module, inputs = StructuredClassifier(kind), (features(7),)
    output = DataParallelModel(module)(*inputs)
    expected = module(*inputs)
    assert isinstance(output, type(expected))
    gathered = gather(output)
    assert type(gathered) is type(expected)
    if kind == "tuple":
        # A plain tuple or list is one: `type(outputs) == list` holds as with DataParallel.
        assert type(output) is tuple
    if kind == "model-output" and replicas == 3:
        assert gathered.loss.shape == (3,)  # DataParallel's vector of the devices' losses
    elif kind == "model-output":
        assert gathered.loss.shape == () and abs(gathered.loss.item() - expected.loss.item()) <= 1e-12


def test_a_list_output_is_a_list_and_its_changes_in_place_reach_the_criterion(three_replicas):
    class Listed(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Classifier()

        def forward(self, x):
            logits = self.inner(x)
            return [logits, logits[:, :1]]

    module, x, y = Listed(), features(7), torch.arange(7) % 4
    expected_logits, expected_score = module(x)
    output = DataParallelModel(module)(x)
    assert type(output) == list  # noqa: E721 - what scripts written for DataParallel check
    logits, score = output
    logits[:, 3] = -1e4
    score.squeeze_(1)
    expected_logits = expected_logits.clone()
    expected_logits[:, 3] = -1e4
    assert score.shape == (7,)
    loss = DataParallelCriterion(nn.CrossEntropyLoss())(logits, y)
    assert same(loss, F.cross_entropy(expected_logits, y))
    assert same(DataParallelCriterion(nn.MSELoss())(score, y.double()), F.mse_loss(expected_score.squeeze(1), y.double()))
