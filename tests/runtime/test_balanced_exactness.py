"""The balanced pair computes exactly the loss and gradients of the original under DataParallel (float64, <= 1e-6),
on 2 and 3 CPU replicas."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mgpu_runtime.balanced import DataParallelCriterion, DataParallelModel, data_parallel, gather
from mgpu_runtime.balanced.devices import cpu_replica_count as model_devices
from mgpu_runtime.emulation import data_parallel as emulation
from mgpu_runtime.emulation.data_parallel import DataParallel as EmulatedDataParallel
from mgpu_runtime.sharded import materialize
from tests.runtime.conftest_balanced import (
    CLASSES,
    VOCABULARY,
    Classifier,
    StructuredClassifier,
    TokenModel,
    assert_matches_data_parallel,
    features,
    labels,
    logits_of,
    max_abs_diff,
    patch_replication_callback,
    seeded,
    token_ids,
    use_cpu_replicas,
)

# 6 splits evenly over 2 and 3; 7 does not; 1 and 2 are smaller than 3 replicas.
BATCHES = [6, 7, 1, 2]


@pytest.fixture(params=[2, 3], ids=["2-replicas", "3-replicas"], autouse=True)
def replicas(request, monkeypatch) -> int:
    use_cpu_replicas(monkeypatch, request.param)
    return request.param


def class_weights() -> torch.Tensor:
    return torch.tensor([0.5, 2.0, 1.0, 3.0], dtype=torch.float64)


CRITERIA = {
    "cross-entropy": lambda: nn.CrossEntropyLoss(),
    "cross-entropy-weights": lambda: nn.CrossEntropyLoss(weight=class_weights()),
    "cross-entropy-smoothing-weights-ignore": lambda: nn.CrossEntropyLoss(
        weight=class_weights(), ignore_index=2, label_smoothing=0.1
    ),
    "cross-entropy-sum": lambda: nn.CrossEntropyLoss(reduction="sum"),
    "mse-as-plain-function": lambda: lambda output, target: F.mse_loss(output, F.one_hot(target, CLASSES).double()),
    "mse-sum": lambda: nn.MSELoss(reduction="sum"),
}


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name", CRITERIA)
def test_loss_and_gradients_match_unsplit(name, batch):
    make_criterion = CRITERIA[name]
    x, y = features(batch), labels(batch)
    if name == "mse-sum":
        y = torch.randn(batch, CLASSES, dtype=torch.float64)
    assert_matches_data_parallel(
        Classifier,
        lambda model: DataParallelCriterion(make_criterion())(model(x), y),
        lambda module: make_criterion()(module(x), y),
    )


def test_nll_loss_takes_the_exact_rule():
    x, y = features(7), labels(7)
    criterion = nn.NLLLoss(weight=class_weights(), ignore_index=0)
    assert_matches_data_parallel(
        Classifier,
        lambda model: DataParallelCriterion(criterion)(torch.log_softmax(model(x), 1), y),
        lambda module: criterion(torch.log_softmax(module(x), 1), y),
    )


def test_a_piece_with_only_ignored_targets_adds_nothing_and_no_nan(replicas):
    batch = 7
    x = features(batch)
    y = labels(batch)
    y[-3:] = -100  # the last piece holds only ignored targets: sizes 4, 3 on 2 replicas and 3, 2, 2 on 3
    criterion = nn.CrossEntropyLoss(weight=class_weights())
    model = DataParallelModel(Classifier())
    loss = DataParallelCriterion(criterion)(model(x), y)
    assert torch.isfinite(loss)
    assert_matches_data_parallel(
        Classifier,
        lambda model: DataParallelCriterion(criterion)(model(x), y),
        lambda module: criterion(module(x), y),
    )


def test_uneven_split_is_weighted_by_piece_size_not_averaged(replicas):
    # The defect of PyTorch-Encoding's DataParallelCriterion: per-device means averaged with equal weight.
    x, y = features(5), labels(5)
    module = Classifier()
    splits = zip(torch.chunk(x, replicas), torch.chunk(y, replicas))
    pieces = [F.cross_entropy(module(xs), ys) for xs, ys in splits]
    equal_weight_mean = torch.stack(pieces).mean()
    exact = F.cross_entropy(module(x), y)
    balanced = DataParallelCriterion(nn.CrossEntropyLoss())(DataParallelModel(module)(x), y)
    assert max_abs_diff(equal_weight_mean, exact) > 1e-3
    assert max_abs_diff(balanced, exact) <= 1e-12


def test_plain_tensors_get_the_plain_criterion():
    logits, y = Classifier()(features(7)), labels(7)
    criterion = nn.CrossEntropyLoss(weight=class_weights())
    assert torch.equal(DataParallelCriterion(criterion)(logits, y), criterion(logits, y))


def test_reduction_none_concatenates_in_batch_order():
    x, y = features(7), labels(7)
    module = Classifier()
    balanced = DataParallelCriterion(nn.CrossEntropyLoss(reduction="none"))(DataParallelModel(module)(x), y)
    assert max_abs_diff(balanced, F.cross_entropy(module(x), y, reduction="none")) <= 1e-12


@pytest.mark.parametrize(
    "make_criterion, target",
    [
        (lambda: nn.CrossEntropyLoss(weight=class_weights()), lambda scores: torch.softmax(scores, 1)),
        (lambda: nn.BCEWithLogitsLoss(pos_weight=torch.full((CLASSES,), 2.0, dtype=torch.float64)), torch.sigmoid),
        (lambda: nn.SmoothL1Loss(), lambda scores: scores),
        (lambda: nn.KLDivLoss(reduction="batchmean"), lambda scores: torch.softmax(scores, 1)),
    ],
    ids=["soft-target-cross-entropy", "bce-pos-weight", "smooth-l1", "kl-batchmean"],
)
def test_per_sample_mean_losses_are_weighted_by_piece_size(make_criterion, target):
    x = features(7)
    y = target(torch.randn(7, CLASSES, dtype=torch.float64, generator=seeded(3)))
    assert_matches_data_parallel(
        Classifier,
        lambda model: DataParallelCriterion(make_criterion())(model(x), y),
        lambda module: make_criterion()(module(x), y),
    )


@pytest.mark.parametrize("kind", ["tuple", "list", "dict", "namedtuple"])
@pytest.mark.parametrize("batch", [7, 2])
def test_structured_outputs(kind, batch):
    x, y = features(batch), labels(batch)
    criterion = nn.CrossEntropyLoss(weight=class_weights())

    def parallel(model):
        output = model(x)
        # Code that did more with the output than the loss keeps working: the features gather on use.
        return DataParallelCriterion(criterion)(logits_of(output, kind), y) + _features_of(output, kind).pow(2).mean()

    def bare(module):
        output = module(x)
        return criterion(logits_of(output, kind), y) + _features_of(output, kind).pow(2).mean()

    assert_matches_data_parallel(lambda: StructuredClassifier(kind), parallel, bare)


def test_a_plain_dataclass_output_is_gathered_as_the_one_device_run_returned_it():
    """DataParallel cannot gather a plain dataclass (it iterates it): the original only ever ran on one device,
    and the migration gives that run's values."""
    x, y = features(7), labels(7)
    bare = StructuredClassifier("dataclass")
    model = DataParallelModel(StructuredClassifier("dataclass"))  # emulates the replicas' devices
    with pytest.raises(TypeError, match="not iterable"):
        EmulatedDataParallel(StructuredClassifier("dataclass"))(x)
    output, expected = model(x), bare(x)
    assert output.note == "unchanged"
    assert max_abs_diff(gather(output.logits), expected.logits) <= 1e-12
    F.cross_entropy(output.logits, y).backward()
    F.cross_entropy(expected.logits, y).backward()
    for parameter, reference in zip(model.module.parameters(), bare.parameters()):
        assert max_abs_diff(parameter.grad, reference.grad) <= 1e-12


def _features_of(output, kind):
    return output[1] if kind in ("tuple", "list") else output["features"] if kind == "dict" else output.features


def test_criterion_over_the_whole_tuple_output():
    # A loss function that takes the model's whole output (main and auxiliary heads), as segmentation code does.
    x, y = features(7), labels(7)

    def loss_with_auxiliary(output, target):
        logits, hidden = output
        return F.cross_entropy(logits, target) + 0.1 * hidden.pow(2).mean()

    assert_matches_data_parallel(
        lambda: StructuredClassifier("tuple"),
        lambda model: DataParallelCriterion(loss_with_auxiliary)(model(x), y),
        lambda module: loss_with_auxiliary(module(x), y),
    )


@pytest.mark.parametrize("batch", [6, 7, 1])
def test_loss_computed_inside_forward_through_loss_attribute(batch):
    """DataParallel gathers each device's loss into a vector, which the script averages (``n_gpu > 1``)."""
    ids, targets = token_ids(batch), token_ids(batch, seed=5)
    assert_matches_data_parallel(
        TokenModel,
        lambda model: model(ids, labels=targets).loss.mean(),
        lambda module: module(ids, labels=targets).loss.mean(),
    )


def test_a_vector_of_forward_losses_refuses_a_plain_backward_as_torch_does():
    ids, targets = token_ids(7), token_ids(7, seed=5)
    migrated = DataParallelModel(TokenModel())  # emulates the replicas' devices, for the original's too
    for model in (migrated, EmulatedDataParallel(TokenModel())):
        loss = model(ids, labels=targets).loss
        assert loss.shape == (model_devices(),)
        with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
            loss.backward()


@pytest.mark.parametrize("batch", [6, 7, 1])
def test_loss_computed_inside_forward_with_the_n_gpu_mean_pattern(batch):
    ids, targets = token_ids(batch), token_ids(batch, seed=5)

    def original_script(model):
        outputs = model(ids, labels=targets)
        loss = outputs[0]
        loss = loss.mean()  # the script's `if n_gpu > 1: loss = loss.mean()`
        return loss

    assert_matches_data_parallel(TokenModel, original_script, original_script)


def test_flattened_token_logits_split_targets_by_output_rows():
    # The model returns one row per token, so pieces have 3x the input rows; padding is ignored.
    ids, targets = token_ids(7), token_ids(7, seed=5)
    targets[-1] = -100
    targets[0, :2] = -100
    assert_matches_data_parallel(
        lambda: TokenModel(flatten=True),
        lambda model: DataParallelCriterion(nn.CrossEntropyLoss())(model(ids), targets.reshape(-1)),
        lambda module: F.cross_entropy(module(ids), targets.reshape(-1)),
    )


def test_split_along_dim_one():
    # Sequence-first data: (tokens, batch, features), split over the batch dimension.
    x = torch.randn(3, 7, 5, dtype=torch.float64)
    target = torch.randn(3, 7, CLASSES, dtype=torch.float64)
    bare = Classifier()
    model = DataParallelModel(Classifier(), dim=1)
    loss = DataParallelCriterion(nn.MSELoss())(model(x), target)
    expected = F.mse_loss(bare(x), target)
    assert max_abs_diff(loss, expected) <= 1e-12


def test_keyword_inputs_are_scattered_and_plain_values_shared():
    class Scaled(Classifier):
        def forward(self, x, *, scale, offset):
            return super().forward(x) * scale + offset

    x, y = features(7), labels(7)
    scale = torch.linspace(0.5, 2.0, 7, dtype=torch.float64)[:, None]
    assert_matches_data_parallel(
        Scaled,
        lambda model: DataParallelCriterion(nn.CrossEntropyLoss())(model(x, scale=scale, offset=0.25), y),
        lambda module: F.cross_entropy(module(x, scale=scale, offset=0.25), y),
    )


def test_targets_that_cannot_be_split_fall_back_to_the_gathered_output():
    x = features(6)
    global_target = torch.randn(CLASSES, dtype=torch.float64)  # no batch dimension to split: broadcast

    def loss(output, target):
        return (output - target).pow(2).mean()

    assert_matches_data_parallel(
        Classifier,
        lambda model: DataParallelCriterion(loss)(model(x), global_target),
        lambda module: loss(module(x), global_target),
    )


def test_functional_data_parallel_matches_module_form():
    x, y = features(7), labels(7)
    assert_matches_data_parallel(
        Classifier,
        lambda model: DataParallelCriterion(nn.CrossEntropyLoss())(data_parallel(model.module, x), y),
        lambda module: F.cross_entropy(module(x), y),
    )


def test_gather_is_differentiable_and_exact():
    x = features(7)
    assert_matches_data_parallel(
        Classifier,
        lambda model: gather(model(x)).pow(2).mean(),
        lambda module: module(x).pow(2).mean(),
    )


def test_token_logits_vocabulary_size_is_kept():
    model = DataParallelModel(TokenModel())
    assert model(token_ids(5)).logits.shape == (5, 3, VOCABULARY)


class _Counting(nn.Module):
    """Keeps values on ``self`` in forward (an auxiliary loss, a step counter), and has a replication callback."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.aux, self.steps, self.copies = 0.0, 0, []

    def forward(self, x):
        self.aux, self.steps = float(x.sum()), self.steps + 1
        return self.linear(x)

    def __data_parallel_replicate__(self, ctx, copy_id):
        self.copies.append(copy_id)


@pytest.mark.parametrize("patched", [False, True], ids=["plain", "patch_replication_callback"])
def test_replicas_are_copies_and_callbacks_run_only_where_the_wrap_was_patched(replicas, patched):
    """As torch's replicate: attributes a forward sets on its module are lost with the replica (replica 0 too),
    and ``__data_parallel_replicate__`` is called only by a wrapper whose replicate a package patched."""
    seen = {}
    # The balanced wrap first: it installs the emulated devices of its CPU replicas, which the original's uses.
    for name, wrap in (("balanced", DataParallelModel), ("original", EmulatedDataParallel)):
        torch.manual_seed(0)
        module = _Counting().double()
        wrapper = wrap(module)
        if patched:
            patch_replication_callback(wrapper)
        wrapper(features(7)[:, :4]).sum().backward()
        seen[name] = (module.aux, module.steps, module.copies)
    # The copies share the original's list (a replica is a shallow copy): it holds each copy told.
    assert seen["balanced"] == seen["original"] == (0.0, 0, list(range(replicas)) if patched else [])


class _EncoderDecoder(nn.Module):
    """ERFNet's shape: ``forward(x, only_encode=True)`` skips the decoder (its first training phase)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(FEATURES_OF_SKIPPING, CLASSES).double()
        self.decoder = nn.Linear(CLASSES, CLASSES).double()

    def forward(self, x: torch.Tensor, only_encode: bool = False) -> torch.Tensor:
        out = self.encoder(x)
        return out if only_encode else self.decoder(out)


FEATURES_OF_SKIPPING = 5


# (A batch of fewer rows than devices fails under nn.DataParallel itself when a keyword is given: every device
# gets the keyword, not every device a row.)
@pytest.mark.parametrize("batch", [7, 8])
def test_parameters_a_forward_skips_get_the_zero_gradients_data_parallel_gave(batch, replicas):
    # nn.DataParallel broadcasts the parameters in one autograd Function: once a backward pass reaches it, every
    # parameter gets a gradient, zeros for the skipped decoder, which weight decay and momentum then move.
    x = torch.randn(batch, FEATURES_OF_SKIPPING, dtype=torch.float64, generator=seeded(3))
    y = labels(batch)
    original = _EncoderDecoder()
    twin = copy.deepcopy(original)
    emulation.install(replicas)
    try:
        F.cross_entropy(EmulatedDataParallel(original)(x, only_encode=True), y).backward()
    finally:
        emulation.uninstall()
    DataParallelCriterion(nn.CrossEntropyLoss())(DataParallelModel(twin)(x, only_encode=True), y).backward()
    assert original.decoder.weight.grad is not None and not original.decoder.weight.grad.any()
    for (name, parameter), reference in zip(twin.named_parameters(), original.parameters()):
        assert parameter.grad is not None, name
        assert max_abs_diff(parameter.grad, reference.grad) <= 1e-12, name


def test_a_pass_that_reaches_no_replica_gives_no_gradient():
    # autograd.grad with respect to the input alone (a gradient penalty) never reaches the broadcast: nothing is
    # written to .grad, as under nn.DataParallel.
    x = torch.randn(7, FEATURES_OF_SKIPPING, dtype=torch.float64, generator=seeded(4), requires_grad=True)
    twin = _EncoderDecoder()
    output = DataParallelModel(twin)(x, only_encode=True)
    (gradient,) = torch.autograd.grad(materialize(output).sum(), x)
    assert gradient.shape == x.shape
    assert all(parameter.grad is None for parameter in twin.parameters())
