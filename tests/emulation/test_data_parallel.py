"""The emulated nn.DataParallel against torch's own facts: chunks, replicas, BatchNorm, dropout, gather.

Where torch's own code runs on the CPU (scatter and gather of anything but tensors), the emulation is
compared with it directly; where it needs GPUs, with what torch's code does (the module doc of
``mgpu_runtime.emulation.data_parallel``), computed here by hand in float64.
"""

import copy
import importlib
import threading
import warnings
from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torch.nn.parallel import scatter_gather as torch_scatter_gather

from mgpu_runtime import replica_links
from mgpu_runtime.emulation import data_parallel, devices
from mgpu_runtime.emulation.data_parallel import DataParallel

TorchDataParallel = nn.DataParallel
torch_gather, torch_scatter_kwargs = torch_scatter_gather.gather, torch_scatter_gather.scatter_kwargs
F64 = torch.float64


class Recorder(nn.Module):
    """Records, for each call, the rows it got, the device it ran on and whether it was the module itself."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.arange(1.0, 4.0, dtype=F64))
        self.calls: list[tuple[int, int, bool]] = []
        self.__dict__["original"] = self  # not a submodule: a plain reference, which replicas share

    def forward(self, x):
        self.original.calls.append((x.shape[0], devices.current_device(), self is self.original))
        return (x * self.weight).sum()


@pytest.mark.parametrize(
    ("count", "rows", "expected"),
    [
        (3, 5, [(2, 0, False), (2, 1, False), (1, 2, False)]),
        (3, 4, [(2, 0, False), (2, 1, False)]),  # 4 rows in chunks of 2: two devices run
        (2, 3, [(2, 0, False), (1, 1, False)]),
        (3, 1, [(1, 0, False)]),  # one chunk on several devices: still a replica, and gathered
        (1, 5, [(5, 0, True)]),  # one device: the module itself runs
    ],
)
def test_rows_are_cut_as_torch_chunk_cuts_them(emulate, count, rows, expected):
    emulate(count)
    module = Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the scalar gather's warning has its own test
        output = DataParallel(module)(torch.ones(rows, 3, dtype=F64))
    assert module.calls == expected
    assert output.shape == (() if count == 1 else (len(expected),))


def test_scatter_and_its_kwargs_padding_are_torchs(emulate):
    emulate(3)
    for inputs, kwargs in [(("a", None), {"flag": True}), ((), {"k": [1, 2]}), ((1.5,), None), ((), None)]:
        assert data_parallel.scatter_kwargs(inputs, kwargs, [0, 1, 2]) == torch_scatter_kwargs(inputs, kwargs, [0, 1, 2])
    x = torch.arange(8.0, dtype=F64).reshape(4, 2)
    Pair = namedtuple("Pair", "left right")
    scattered, padded = data_parallel.scatter_kwargs((Pair(x, x[:, 0]), [x]), {"mask": x > 3, "flag": True}, [0, 1, 2])
    assert len(scattered) == 2 and all(type(piece[0]) is Pair and type(piece[1]) is list for piece in scattered)
    assert [piece[0].left.tolist() for piece in scattered] == [x[:2].tolist(), x[2:].tolist()]
    assert [set(kwargs) for kwargs in padded] == [{"mask", "flag"}] * 2
    assert scattered[0][0].left.data_ptr() == x.data_ptr() and scattered[1][0].left.data_ptr() != x[2:].data_ptr()


def test_a_keyword_that_is_not_a_tensor_reaches_a_device_that_got_no_rows(emulate):
    """4 rows on 3 devices with flag=True: torch pads the inputs to the kwargs' 3 entries, so replica 2 runs
    with no positional input at all."""
    emulate(3)

    class Flagged(nn.Module):
        def forward(self, x, flag):
            return x

    with pytest.raises(TypeError, match=r"Caught TypeError in replica 2 on device 2\.(.|\n)*missing 1 required positional argument: 'x'"):
        DataParallel(Flagged())(torch.ones(4, 2, dtype=F64), flag=True)


def test_batchnorm_keeps_the_running_statistics_of_chunk_0_alone(emulate):
    emulate(3)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).double()
    alone = copy.deepcopy(model)
    x = torch.randn(8, 4, dtype=F64)  # chunks of 3, 3, 2
    DataParallel(model)(x).sum().backward()
    alone(x[:3])
    assert model[1].num_batches_tracked.item() == 1
    assert torch.allclose(model[1].running_mean, alone[1].running_mean, rtol=0, atol=1e-15)
    assert torch.allclose(model[1].running_var, alone[1].running_var, rtol=0, atol=1e-15)


def test_dropout_masks_are_each_devices_draws_and_the_loop_stream_is_untouched(emulate):
    emulate(3)
    torch.manual_seed(21)
    cpu_stream = torch.get_rng_state()
    model = DataParallel(nn.Dropout(0.5))
    masks = [model(torch.ones(5, 6, dtype=F64)) != 0 for _ in range(2)]  # chunks of 2, 2, 1 rows
    assert torch.equal(torch.get_rng_state(), cpu_stream)
    for device, rows in enumerate((slice(0, 2), slice(2, 4), slice(4, 5))):
        stream = torch.Generator().manual_seed(21)  # the device's, seeded by torch.manual_seed
        for mask in masks:
            expected = torch.bernoulli(torch.full((mask[rows].shape), 0.5, dtype=F64), generator=stream) != 0
            assert torch.equal(mask[rows], expected)


def test_a_loss_computed_in_forward_comes_back_as_a_vector_of_the_devices_losses(emulate):
    emulate(3)
    torch.manual_seed(2)
    net = nn.Linear(4, 1).double()

    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x, y):
            return ((self.net(x).squeeze(1) - y) ** 2).mean()

    x, y = torch.randn(8, 4, dtype=F64), torch.randn(8, dtype=F64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = DataParallel(WithLoss())(x, y)
    assert losses.shape == (3,)
    assert [str(w.message) for w in caught] == [
        "Was asked to gather along dimension 0, but all input tensors were scalars; will instead unsqueeze and return a vector."
    ]
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        losses.backward()
    losses.mean().backward()
    expected = [torch.autograd.grad(WithLoss()(x[rows], y[rows]), net.weight)[0] for rows in (slice(0, 3), slice(3, 6), slice(6, 8))]
    assert torch.allclose(net.weight.grad, sum(expected) / 3, rtol=0, atol=1e-14)


def test_gradients_of_the_replicas_sum_into_the_module(emulate):
    emulate(3)
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    plain = copy.deepcopy(model)
    x = torch.randn(7, 5, dtype=F64)
    DataParallel(model)(x).pow(2).sum().backward()
    plain(x).pow(2).sum().backward()
    for mine, reference in zip(model.parameters(), plain.parameters()):
        assert torch.allclose(mine.grad, reference.grad, rtol=0, atol=1e-13)


def test_frozen_parameters_stay_frozen_in_the_replicas(emulate):
    emulate(2)
    model = nn.Linear(3, 3).double()
    model.bias.requires_grad_(False)
    seen = []
    model.register_forward_hook(lambda module, args, out: seen.append(module.bias.requires_grad))
    DataParallel(model)(torch.ones(4, 3, dtype=F64)).sum().backward()
    assert seen == [False, False] and model.bias.grad is None and model.weight.grad is not None


def test_dict_and_namedtuple_outputs_are_gathered_by_key_and_field(emulate):
    emulate(2)
    Out = namedtuple("Out", "logits extra")

    class Structured(nn.Module):
        def forward(self, x):
            return {"out": Out(x * 2, None), "rows": x[:, 0]}

    x = torch.arange(6.0, dtype=F64).reshape(3, 2)
    result = DataParallel(Structured())(x)
    assert set(result) == {"out", "rows"} and type(result["out"]) is Out and result["out"].extra is None
    assert torch.equal(result["out"].logits, x * 2) and torch.equal(result["rows"], x[:, 0])


@dataclass
class Plain:
    value: torch.Tensor


@pytest.mark.parametrize("outputs", [[0.5, 0.25], [Plain(torch.ones(1)), Plain(torch.ones(1))], [{"a": None}, {"a": None, "b": None}], [(None,), (None, None)]])
def test_what_gather_cannot_gather_fails_as_torchs_gather_fails(emulate, outputs):
    emulate(2)
    with pytest.raises(Exception) as torchs:
        torch_gather(outputs, 0)
    with pytest.raises(Exception) as ours:
        data_parallel.gather(outputs, 0)
    assert (type(ours.value), str(ours.value)) == (type(torchs.value), str(torchs.value))


def test_a_float_returned_by_forward_fails_in_the_gather(emulate):
    emulate(2)

    class Number(nn.Module):
        def forward(self, x):
            return float(x.sum())

    with pytest.raises(TypeError, match="'float' object is not iterable"):
        DataParallel(Number())(torch.ones(4, 2, dtype=F64))


def test_tensors_of_other_shapes_fail_with_torchs_gather_messages(emulate):
    emulate(2)
    with pytest.raises(RuntimeError, match=r"Input tensor at index 1 has invalid shape \[2, 3\], but expected \[2, 4\]"):
        data_parallel.gather([torch.ones(2, 4), torch.ones(2, 3)], 0)
    with pytest.raises(RuntimeError, match="tensor at index 1has 1 dimensions, \\(expected 2\\)"):
        data_parallel.gather([torch.ones(2, 4), torch.ones(2)], 0)


def test_a_replica_failure_is_raised_as_torch_raises_it(emulate):
    emulate(3)

    class FailsOnDevice1(nn.Module):
        def forward(self, x):
            if devices.current_device() == 1:
                raise ValueError("bad rows")
            return x

    with pytest.raises(ValueError, match=r"^Caught ValueError in replica 1 on device 1\.\nOriginal Traceback"):
        DataParallel(FailsOnDevice1())(torch.ones(6, 2, dtype=F64))


def test_attributes_are_torchs_and_device_ids_take_torchs_forms(emulate):
    emulate(3)
    model = DataParallel(nn.Linear(2, 2), device_ids=[torch.device("cuda", 2), "cuda:0"], output_device="cuda:0")
    assert isinstance(model, TorchDataParallel) and model.device_ids == [2, 0] and model.output_device == 0 and model.dim == 0
    assert list(model.state_dict()) == ["module.weight", "module.bias"]
    with pytest.raises(AssertionError, match="Invalid device id"):
        DataParallel(nn.Linear(2, 2), device_ids=[0, 3])


def test_without_devices_the_module_runs_as_it_is(emulate):
    emulate(0)
    module = Recorder()
    model = DataParallel(module)
    model(torch.ones(4, 3, dtype=F64))
    assert model.device_ids == [] and not hasattr(model, "dim") and module.calls == [(4, 0, True)]
    with pytest.raises(RuntimeError, match="device type could not be determined"):
        data_parallel.data_parallel(module, torch.ones(4, 3, dtype=F64))


def test_install_puts_the_emulation_in_torchs_place_and_uninstall_gives_it_back(emulate):
    emulate(2)
    home = importlib.import_module("torch.nn.parallel.data_parallel")  # the attribute of that name is the function

    assert torch.nn.DataParallel is torch.nn.parallel.DataParallel is home.DataParallel is DataParallel
    assert torch.nn.parallel.data_parallel is home.data_parallel is data_parallel.data_parallel
    x = torch.arange(10.0, dtype=F64).reshape(5, 2)
    linear = nn.Linear(2, 3).double()
    assert torch.allclose(torch.nn.parallel.data_parallel(linear, x), DataParallel(linear)(x), rtol=0, atol=1e-15)
    data_parallel.uninstall()
    assert torch.nn.DataParallel is TorchDataParallel and torch_scatter_gather.gather is torch_gather


def test_replicas_that_wait_for_each_other_run_together_and_may_not_draw(emulate):
    """A synchronized BatchNorm's replicas meet at a barrier (as the sync_batchnorm packages' layers do once
    their callback ran): one after another they would wait forever."""
    emulate(2)

    class MeetingLayer(nn.Module):
        def __init__(self, draws: bool):
            super().__init__()
            self.draws = draws

        def __data_parallel_replicate__(self, ctx, copy_id):
            pass

        def forward(self, x):
            self.barrier.wait()
            return torch.rand_like(x) if self.draws else x * 2

    for draws in (False, True):
        layer = MeetingLayer(draws)
        layer.barrier = threading.Barrier(2, timeout=30)
        if draws:
            with pytest.raises(RuntimeError, match="drew random numbers"):
                DataParallel(layer)(torch.ones(4, 2, dtype=F64))
        else:
            assert torch.equal(DataParallel(layer)(torch.ones(4, 2, dtype=F64)), torch.full((4, 2), 2.0, dtype=F64))


def test_a_projects_synchronized_batchnorm_sums_and_broadcasts_over_the_emulated_devices(emulate):
    """vacancy's Synchronized-BatchNorm (pytorch-deeplab-xception, first-order-model): the master replica sums every
    replica's statistics with ``_functions.ReduceAddCoalesced`` and hands the result back with ``Broadcast``, which
    torch runs on GPUs only. On the emulated devices they run on the CPU (the master replica raised, and the others
    waited for it forever): a layer centring its input on the whole batch's mean this way gives the values and the
    gradients of the plain computation."""
    emulate(3)
    from torch.nn.parallel._functions import Broadcast, ReduceAddCoalesced  # as a project imports them, once installed

    class CentredOnTheBatch(nn.Module):
        def __init__(self, replicas: int):
            super().__init__()
            self.__dict__["shared"] = {"lock": threading.Lock(), "barrier": threading.Barrier(replicas, timeout=30)}

        def __data_parallel_replicate__(self, ctx, copy_id):
            pass

        def forward(self, x):
            shared = self.shared
            with shared["lock"]:
                arrival = len(shared.setdefault("sums", []))
                shared["sums"].append((x.sum(0), x.new_tensor(float(x.shape[0]))))
            shared["barrier"].wait()
            if arrival == 0:
                flat = [tensor for pair in shared["sums"] for tensor in pair]
                total, rows = ReduceAddCoalesced.apply(0, 2, *flat)
                shared["copies"] = Broadcast.apply(list(range(len(shared["sums"]))), total / rows)
            shared["barrier"].wait()
            return x - shared["copies"][arrival]

    x = torch.randn(7, 3, dtype=F64, requires_grad=True)
    weights = torch.randn(7, 3, dtype=F64)
    out = DataParallel(CentredOnTheBatch(3))(x)
    (out * weights).sum().backward()
    expected_x = x.detach().clone().requires_grad_(True)
    expected = expected_x - expected_x.mean(0)
    (expected * weights).sum().backward()
    assert torch.allclose(out, expected, atol=1e-12, rtol=0)
    assert torch.allclose(x.grad, expected_x.grad, atol=1e-12, rtol=0)
    data_parallel.uninstall()
    assert torch.nn.parallel._functions.Broadcast is not Broadcast  # torch's own, given back


def test_a_replica_that_fails_while_the_others_wait_for_it_stops_the_run(emulate, monkeypatch):
    """A synchronized layer whose master replica raises leaves the others waiting for it forever (under torch too):
    the emulated reference raises the failure after a grace period, rather than hanging verify until its timeout."""
    monkeypatch.setattr(replica_links, "WAITING_AFTER_A_FAILURE_S", 0.5)
    emulate(2)
    answered = threading.Event()

    class MasterFails(nn.Module):
        def __data_parallel_replicate__(self, ctx, copy_id):
            pass

        def forward(self, x):
            if x.shape[0] == 2:  # the first chunk of 3 rows over 2 devices: 2 + 1
                raise ValueError("the master's reduction failed")
            answered.wait()  # never set: the slave waits for the master's answer
            return x

    with pytest.raises(ValueError, match=r"(?s)the master's reduction failed.*still wait for it"):
        DataParallel(MasterFails())(torch.ones(3, 2, dtype=F64))
