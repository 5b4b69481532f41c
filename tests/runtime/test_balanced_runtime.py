"""Devices, replication, replicas as emulated devices, errors of the balanced runtime, and a short training run."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

from mgpu_runtime import replica_links
from mgpu_runtime.balanced import DataParallelCriterion, DataParallelModel, gather
from mgpu_runtime.balanced.devices import resolve_devices
from mgpu_runtime.emulation.data_parallel import DataParallel as EmulatedDataParallel
from mgpu_runtime.sharded import materialize
from tests.runtime.conftest_balanced import (
    CLASSES,
    Classifier,
    features,
    labels,
    max_abs_diff,
    patch_replication_callback,
    use_cpu_replicas,
)


@pytest.fixture
def three_replicas(monkeypatch):
    use_cpu_replicas(monkeypatch, 3)


class Recorder(Classifier):
    """Notes, per call, the thread, the input rows, grad mode and the autocast dtype seen inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict] = []
        self.lock = threading.Lock()

    def forward(self, x):
        output = super().forward(x)
        with self.lock:
            self.calls.append(
                {
                    "thread": threading.current_thread().name,
                    "device": torch.cuda.current_device(),
                    "rows": len(x),
                    "grad": torch.is_grad_enabled(),
                    "dtype": output.dtype,
                }
            )
        return output


# --- devices -------------------------------------------------------------------------------------------


def test_replica_count_is_read_when_the_model_is_built(monkeypatch):
    use_cpu_replicas(monkeypatch, None)
    assert DataParallelModel(Classifier()).device_ids == []
    use_cpu_replicas(monkeypatch, 3)
    assert DataParallelModel(Classifier()).device_ids == [0, 1, 2]


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_invalid_replica_count_is_a_clear_error(monkeypatch, value):
    use_cpu_replicas(monkeypatch, None)
    monkeypatch.setenv("MGPU_CPU_REPLICAS", value)
    with pytest.raises(ValueError, match="MGPU_CPU_REPLICAS must be a positive integer"):
        DataParallelModel(Classifier())


def test_device_ids_select_cpu_replicas(three_replicas):
    model = DataParallelModel(Recorder(), device_ids=[0, 1])
    model(features(7))
    assert sorted(call["rows"] for call in model.module.calls) == [3, 4]
    with pytest.raises(ValueError, match="device id 3 is out of range"):
        DataParallelModel(Classifier(), device_ids=[0, 3])


def test_gpu_count_driven_empty_device_ids_get_every_cpu_replica(three_replicas):
    # `range(torch.cuda.device_count())` is empty without a GPU; on the machine the replicas stand in for,
    # it names every device.
    model = DataParallelModel(Recorder(), device_ids=range(torch.cuda.device_count()))
    model(features(7))
    assert sorted(call["rows"] for call in model.module.calls) == [1, 3, 3]


def test_device_ids_are_ignored_without_gpu_or_replicas(monkeypatch):
    # As nn.DataParallel does on a CPU-only machine: the module simply runs.
    use_cpu_replicas(monkeypatch, None)
    model = DataParallelModel(Classifier(), device_ids=[0, 1, 7])
    assert model.device_ids == [] and model(features(3)).shape == (3, 4)


@pytest.fixture
def two_gpus(monkeypatch):
    """Device resolution as on a machine with two GPUs (no tensor ever goes to them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_cuda_device_resolution(two_gpus):
    devices = resolve_devices()
    assert devices.replicas == (torch.device("cuda", 0), torch.device("cuda", 1))
    assert devices.output == torch.device("cuda", 0)
    assert devices.label(1) == "replica 1 on cuda:1"
    repeated = resolve_devices([0, 0], output_device=-1)
    assert repeated.replicas == (torch.device("cuda", 0),) * 2 and repeated.output == torch.device("cpu")
    assert resolve_devices(["cuda:1", torch.device("cuda", 0)], output_device=1).output == torch.device("cuda", 1)


@pytest.mark.parametrize(
    "device_ids, message",
    [
        ([0, 2], "device id 2 is out of range: this machine has 2 CUDA device"),
        ([-1], "device id -1 is out of range"),
        (["cpu"], "device_ids must name CUDA devices"),
        ([torch.device("cpu")], "device_ids must name CUDA devices"),
        ([], "device_ids is empty"),
    ],
)
def test_invalid_cuda_device_ids_are_clear_errors(two_gpus, device_ids, message):
    with pytest.raises(ValueError, match=message):
        resolve_devices(device_ids)


def test_cpu_replicas_are_ignored_when_cuda_is_present(two_gpus, monkeypatch):
    use_cpu_replicas(monkeypatch, 3)
    assert len(resolve_devices().replicas) == 2


# --- splitting and threads -----------------------------------------------------------------------------


# Cut as torch.chunk (DataParallel's scatter) cuts: 4 rows over 3 replicas is 2 and 2, never a 1-row piece
# DataParallel did not have (BatchNorm refuses one row in training).
@pytest.mark.parametrize("rows, pieces", [(7, [3, 3, 1]), (6, [2, 2, 2]), (4, [2, 2]), (2, [1, 1]), (1, [1])])
def test_each_cpu_replica_runs_on_its_piece_as_its_emulated_device(three_replicas, rows, pieces):
    """CPU replicas run one after the other in the caller's thread, each as its emulated device (drawing from
    its stream); a batch smaller than 3 runs no empty replica."""
    model = DataParallelModel(Recorder())
    model(features(rows))
    calls = model.module.calls
    assert [call["rows"] for call in calls] == pieces
    assert [call["device"] for call in calls] == list(range(len(pieces)))
    assert {call["thread"] for call in calls} == {threading.current_thread().name}


def test_grad_mode_and_autocast_reach_the_workers(three_replicas):
    model = DataParallelModel(Recorder().float())  # CPU autocast only lowers float32
    with torch.no_grad():
        output = model(features(6).float())
    assert not output.requires_grad
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = model(features(6).float())
    assert output.dtype == torch.bfloat16
    grad_flags = [call["grad"] for call in model.module.calls]
    dtypes = [call["dtype"] for call in model.module.calls]
    assert grad_flags == [False] * 3 + [True] * 3
    assert dtypes[3:] == [torch.bfloat16] * 3
    with torch.inference_mode():
        assert model(features(6).float()).is_inference()


class FailsOnNegativeFirstFeature(Classifier):
    def forward(self, x):
        if (x[:, 0] < 0).all():
            raise ValueError("negative batch")
        return super().forward(x)


def test_worker_errors_are_raised_as_dataparallel_raised_them(three_replicas):
    """Its type, torch's "Caught <type> in replica <r> on device <r>." and the original traceback in the message:
    what a loop that catches it and prints it printed under DataParallel."""
    x = features(6).abs()
    x[4:, 0] = -1.0  # only the third piece fails
    with pytest.raises(ValueError, match=r"^Caught ValueError in replica 2 on device 2\.\nOriginal Traceback") as caught:
        DataParallelModel(FailsOnNegativeFirstFeature())(x)
    assert 'raise ValueError("negative batch")' in str(caught.value)
    assert str(caught.value).endswith("ValueError: negative batch\n")


def test_the_first_failing_replicas_error_is_raised(three_replicas):
    x = -features(6).abs()
    with pytest.raises(ValueError, match=r"^Caught ValueError in replica 0 on device 0\."):
        DataParallelModel(FailsOnNegativeFirstFeature())(x)


def test_errors_whose_type_needs_more_than_a_message_become_runtime_errors(three_replicas):
    class NeedsTwoArguments(Exception):
        def __init__(self, code, detail):
            super().__init__(f"{code}: {detail}")

    class Fails(Classifier):
        def forward(self, x):
            raise NeedsTwoArguments(7, "broken")

    with pytest.raises(RuntimeError, match=r"^Caught NeedsTwoArguments in replica 0 on device 0\.(.|\n)*7: broken"):
        DataParallelModel(Fails())(features(6))


def test_a_criterion_sees_the_global_batch(three_replicas):
    """The criterion runs once, on the outputs as the loop holds them (pieces of 2, 2 and 1): every length and
    shape it reads is the whole batch's, as under DataParallel's gather."""
    seen = []

    def picky(output, target):
        seen.append((len(target), tuple(output.shape)))
        return output.sum() / len(target)

    model = DataParallelModel(Classifier())
    loss = DataParallelCriterion(picky)(model(features(5)), labels(5))
    assert seen == [(5, (5, CLASSES))]
    assert max_abs_diff(loss, Classifier()(features(5)).sum() / 5) <= 1e-12


# --- replicas ------------------------------------------------------------------------------------------


def test_wrapper_keeps_the_data_parallel_surface(three_replicas):
    module = Classifier()
    model = DataParallelModel(module)
    assert isinstance(model, nn.DataParallel) and model.module is module
    assert list(model.state_dict()) == [f"module.{key}" for key in module.state_dict()]
    assert [p is q for p, q in zip(model.parameters(), module.parameters())] == [True] * 4


def test_batch_norm_keeps_the_first_replicas_statistics_like_data_parallel(three_replicas):
    norm = nn.BatchNorm1d(5).double()
    reference = copy.deepcopy(norm)
    x = features(8)
    DataParallelModel(norm)(x)
    reference(x[:3])  # replica 0's piece
    assert max_abs_diff(norm.running_mean, reference.running_mean) <= 1e-12
    assert norm.num_batches_tracked.item() == 1


def test_a_batch_norm_model_trains_on_a_last_batch_of_4_over_3_replicas_as_data_parallel_split_it(three_replicas):
    """torch.chunk's 2 and 2, not 2, 1 and 1 (BatchNorm refuses one row): each piece normalised on its own."""
    norm = nn.BatchNorm1d(5).double()
    x = features(4)
    output = DataParallelModel(norm)(x)
    expected = torch.cat([nn.functional.batch_norm(piece, None, None, training=True) for piece in x.chunk(3)])
    assert max_abs_diff(output, expected) <= 1e-12


def test_tied_weights_get_the_unsplit_gradient(three_replicas):
    class Tied(nn.Module):
        """Input embedding and output head share one weight, as in language models."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embedding = nn.Embedding(11, 4).double()
            self.head = nn.Linear(4, 11, bias=False).double()
            self.head.weight = self.embedding.weight

        def forward(self, ids):
            return self.head(torch.tanh(self.embedding(ids)))

    bare = Tied()
    twin = copy.deepcopy(bare)
    ids = torch.randint(0, 11, (7, 3), generator=torch.Generator().manual_seed(0))
    bare(ids).pow(2).mean().backward()
    DataParallelModel(twin)(ids).pow(2).mean().backward()
    assert twin.head.weight is twin.embedding.weight
    assert max_abs_diff(twin.embedding.weight.grad, bare.embedding.weight.grad) <= 1e-12


# --- training ------------------------------------------------------------------------------------------


def test_training_on_three_replicas_ends_with_the_bare_models_weights(three_replicas):
    bare = Classifier()
    twin = copy.deepcopy(bare)
    model = DataParallelModel(twin)
    criterion = DataParallelCriterion(nn.CrossEntropyLoss(ignore_index=3))
    bare_optimizer = torch.optim.SGD(bare.parameters(), lr=0.5, momentum=0.9)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    for step, rows in enumerate([8, 7, 5, 2, 7, 8]):
        x, y = features(rows, seed=step), labels(rows, seed=100 + step)
        bare_optimizer.zero_grad()
        nn.functional.cross_entropy(bare(x), y, ignore_index=3).backward()
        bare_optimizer.step()
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
    for name, parameter in twin.named_parameters():
        assert max_abs_diff(parameter, dict(bare.named_parameters())[name]) <= 1e-6, name
    assert max_abs_diff(twin.head.weight, Classifier().head.weight) > 1e-2  # it did train


class _WaitsForTheOtherReplicas(nn.Module):
    """A synchronized BatchNorm's shape: told its copy by ``__data_parallel_replicate__``, each replica's forward
    meets the others' at a barrier (vacancy's sync_batchnorm exchanges statistics there)."""

    def __data_parallel_replicate__(self, ctx, copy_id):
        self._context = ctx
        ctx.copies = getattr(ctx, "copies", 0) + 1

    def forward(self, x):
        context = getattr(self, "_context", None)
        if context is not None:
            if not hasattr(context, "barrier"):
                context.barrier = threading.Barrier(context.copies, timeout=10)
            context.barrier.wait()
        return x * 2


def test_replicas_that_wait_for_each_other_run_at_once(monkeypatch):
    use_cpu_replicas(monkeypatch, 2)
    module = nn.Sequential(nn.Linear(4, 4), _WaitsForTheOtherReplicas())
    x = torch.randn(6, 4)
    expected = module(x)
    wrapped = DataParallelModel(module)
    patch_replication_callback(wrapped)  # the package's patch: each replica's layer meets the others'
    assert torch.allclose(gather(wrapped(x)), expected)


class _MeetsAtABarrier(nn.Module):
    """CCNet's InPlaceABNSync's shape: queues or a barrier made in ``__init__``, met by every replica's forward
    in DataParallel's threads (no ``__data_parallel_replicate__``)."""

    def __init__(self, replicas: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(replicas, timeout=10)

    def forward(self, x):
        self.barrier.wait()
        return x * 2


def test_replicas_that_meet_through_queues_they_hold_run_at_once_as_in_data_parallel(monkeypatch):
    use_cpu_replicas(monkeypatch, 2)
    module = nn.Sequential(nn.Linear(4, 4), _MeetsAtABarrier(2))
    x = torch.randn(6, 4)
    balanced = gather(DataParallelModel(module)(x))  # one replica after the other would wait at the barrier
    original = EmulatedDataParallel(module)(x)
    assert torch.equal(balanced, original)


class _FirstReplicaFails(nn.Module):
    """A synchronized layer whose first replica (the master of vacancy's BatchNorm) raises, while the second waits
    for its answer, which never comes (under torch's DataParallel, the job hung there)."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = threading.Event()  # never set; held, so the replicas run at once

    def forward(self, x):
        if x.shape[0] == 2:  # the first piece of 3 rows over 2 replicas: 2 + 1
            raise ValueError("the master's reduction failed")
        self.answered.wait()
        return x


def test_a_replica_that_fails_while_the_others_wait_for_it_stops_the_run(monkeypatch):
    monkeypatch.setattr(replica_links, "WAITING_AFTER_A_FAILURE_S", 0.5)
    use_cpu_replicas(monkeypatch, 2)
    with pytest.raises(ValueError, match=r"(?s)^Caught ValueError in replica 0 on device 0\..*the master's reduction failed.*\[1\] still wait"):
        DataParallelModel(_FirstReplicaFails())(torch.ones(3, 2))


class _FindsItsDevice(nn.Module):
    """A forward that finds its device from its parameters (fatchord/WaveRNN's models, written for torch 1.0)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 4)
        self.rnn = nn.GRU(4, 5, batch_first=True)

    def forward(self, x):
        device = next(self.parameters()).device
        hidden = torch.zeros(1, x.size(0), 5, dtype=x.dtype, device=device)
        return self.rnn(self.embed(x), hidden)[0]


def test_a_replica_on_another_device_lists_its_parameters_there():
    # torch's replicas list no parameters since torch 1.5: such a forward stops with StopIteration under
    # nn.DataParallel on several GPUs. The meta device stands in for a second GPU here.
    from mgpu_runtime.balanced.replicate import replicate

    module = _FindsItsDevice().double()
    home, other = replicate(module, [torch.device("cpu"), torch.device("meta")])
    # On the home device: views of the module's parameters (torch's broadcast aliases them there), ...
    assert all(a._base is b for a, b in zip(home.parameters(), module.parameters(), strict=True))
    with torch.no_grad():  # ... and, with no gradient recorded, the first replica holds them themselves
        first, second = replicate(module, [torch.device("cpu"), torch.device("cpu")])
    assert all(a is b for a, b in zip(first.parameters(), module.parameters(), strict=True))
    assert all(a._base is b for a, b in zip(second.parameters(), module.parameters(), strict=True))
    copies = list(other.parameters())
    assert len(copies) == len(list(module.parameters()))
    assert {copy.device.type for copy in copies} == {"meta"}
    assert all(weight.device.type == "meta" for weight in other.rnn._flat_weights)
    output = other(torch.randn(2, 6, 3, dtype=torch.float64, device="meta"))
    assert output.device.type == "meta" and output.shape == (2, 6, 5)


def test_a_forward_that_finds_its_device_trains_on_three_replicas_as_data_parallel(three_replicas):
    torch.manual_seed(0)
    module = _FindsItsDevice().double()
    reference = copy.deepcopy(module)
    x = torch.randn(7, 6, 3, dtype=torch.float64)
    DataParallelModel(module)(x).pow(2).sum().backward()
    reference(x).pow(2).sum().backward()
    for ours, theirs in zip(module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=0, atol=1e-12)


class _RebindsInForward(nn.Module):
    """A power-iteration vector kept as a parameter and rebound in ``forward`` (SAGAN's SpectralNorm, reduced)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.u = nn.Parameter(torch.randn(3), requires_grad=False)

    def forward(self, x):
        weight = self.linear.weight
        self.u.data = nn.functional.normalize(weight.detach().mv(weight.detach().t().mv(self.u)), dim=0)
        return self.linear(x) / self.u.dot(weight.mv(weight.t().mv(self.u))).sqrt()


@pytest.mark.parametrize("recording", [True, False])
def test_a_parameter_rebound_in_forward_is_kept_only_where_data_parallel_kept_it(three_replicas, recording):
    """In a training forward DataParallel's replicas hold aliases, and a rebinding of ``.data`` is lost with them;
    under no_grad the first replica holds the module's own parameter, and its rebinding stays."""
    torch.manual_seed(0)
    module = _RebindsInForward().double()
    reference = copy.deepcopy(module)
    start = module.u.detach().clone()
    x = torch.randn(7, 4, dtype=torch.float64)
    with torch.set_grad_enabled(recording):
        ours = gather(DataParallelModel(module)(x))
        theirs = EmulatedDataParallel(reference, device_ids=[0, 1, 2])(x)
    assert max_abs_diff(ours, theirs) <= 1e-12
    assert max_abs_diff(module.u, reference.u) <= 1e-12
    assert torch.equal(module.u, start) == recording  # the test really takes the path it names
    if recording:
        ours.sum().backward()
        theirs.sum().backward()
        assert max_abs_diff(module.linear.weight.grad, reference.linear.weight.grad) <= 1e-12


class _OwnScatter(DataParallelModel):
    """A subclass that cuts the batch itself: two rows for each of the first two devices, the rest dropped."""

    def scatter(self, inputs, kwargs, device_ids):
        self.given = list(device_ids)
        return [(inputs[0][2 * part : 2 * part + 2],) for part in range(2)], [kwargs, kwargs]


class _OwnGather(DataParallelModel):
    """A subclass whose gather gives the loop the list of the replicas' outputs."""

    def gather(self, outputs, output_device):
        self.output_to = output_device
        return list(outputs)


def test_a_subclass_scatter_cuts_the_batch_and_its_gather_gives_the_forward_value(three_replicas):
    """Rebased DataParallel subclasses (MGP106): their own scatter is called with the wrapper's device ids and each of
    its parts runs on its replica (here 2 of 3, 4 of 7 rows), their own gather with the output device."""
    cut = _OwnScatter(Recorder())
    output = cut(features(7))
    assert cut.given == [0, 1, 2]
    assert [(call["rows"], call["device"]) for call in cut.module.calls] == [(2, 0), (2, 1)]
    assert output.shape == (4, CLASSES)
    torch.testing.assert_close(materialize(output), cut.module(features(7)[:4]).detach(), rtol=0, atol=1e-12)
    listed = _OwnGather(Recorder())
    outputs = listed(features(7))
    assert type(outputs) is list and [len(output) for output in outputs] == [3, 3, 1]
    assert listed.output_to == listed.output_device


def test_a_subclass_scatter_of_more_parts_than_devices_is_an_error(three_replicas):
    class TooMany(DataParallelModel):
        def scatter(self, inputs, kwargs, device_ids):
            return [(inputs[0][:1],)] * 4, [kwargs] * 4

    with pytest.raises(RuntimeError, match="gave 4 parts of inputs and 4 of keyword arguments for 3 devices"):
        TooMany(Classifier())(features(7))
