"""Per-replica outputs behave like the gathered output, gather only what is used, one type for 0/1/N devices."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from mgpu_runtime.balanced import DataParallelCriterion, DataParallelModel, gather
from mgpu_runtime.balanced.outputs import ParallelOutput
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


class CalledFunctions(TorchFunctionMode):
    """Records the torch functions called inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


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
    assert type(output) is ParallelOutput
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
    assert type(logits) is ParallelOutput and same(gather(logits), expected_logits)
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


def test_model_output_loss_gathers_without_the_logits(three_replicas):
    model = DataParallelModel(TokenModel())
    ids, targets = token_ids(7), token_ids(7, seed=5)
    outputs = model(ids, labels=targets)
    assert isinstance(outputs, LMOutput) and "loss" in outputs
    assert outputs.hidden_states is None
    with CalledFunctions() as called:
        loss = outputs.loss
        loss.item()
    assert "cat" not in called.names
    with CalledFunctions() as called:
        outputs.logits.argmax(-1)
    assert "cat" in called.names


def test_scalar_losses_combine_to_a_zero_dim_weighted_mean(three_replicas):
    module = TokenModel()
    ids, targets = token_ids(7), token_ids(7, seed=5)
    loss = DataParallelModel(module)(ids, labels=targets).loss
    expected = module(ids, labels=targets).loss
    assert loss.shape == () and loss.dim() == 0
    assert abs(loss.mean().item() - expected.item()) <= 1e-12
    assert abs(loss.sum().item() - expected.item()) <= 1e-12
    with pytest.raises(TypeError):
        len(loss)


def test_integer_scalars_are_summed(three_replicas):
    class CountPositive(nn.Module):
        def forward(self, x):
            return (x > 0).sum()

    x = features(7)
    assert DataParallelModel(CountPositive())(x).item() == int((x > 0).sum())


def test_outputs_without_tensors_are_returned_as_they_are(three_replicas):
    class Describe(nn.Module):
        def forward(self, x):
            return "described"

    assert DataParallelModel(Describe())(features(5)) == "described"


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
    if kind == "tuple":
        # A plain tuple or list is one, of lazy outputs: `type(outputs) == list` holds as with DataParallel.
        assert type(output) is tuple and all(type(part) is ParallelOutput for part in output)
    else:
        assert type(output) is ParallelOutput
    assert output.__class__ is type(expected)
    gathered = gather(output)
    assert type(gathered) is type(expected)
    if kind == "model-output":
        assert gathered.loss.shape == () and abs(gathered.loss.item() - expected.loss.item()) <= 1e-12
        first_part = output[0]
        assert type(first_part) is ParallelOutput and first_part.shape == ()


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
