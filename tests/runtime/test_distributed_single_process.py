"""The distributed runtime in a world of one, in this process: what a plain ``python train.py`` gets.

Also the pieces that need no peers: splitting a collated batch, the cross-entropy numerator/denominator,
atomic saving, and the relaunch guard. The multi-process behaviour is in test_distributed_launches.py.
"""

from __future__ import annotations

import collections
import os
import pickle
import queue
import random

import mgpu_runtime
import numpy
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mgpu_runtime.distributed import process_group
from mgpu_runtime.distributed.environment import LaunchEnvironmentError
from mgpu_runtime.distributed.slicing import batch_rows, take_rows
from mgpu_runtime.losses import bind, loss_parts
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

_LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def single_process(monkeypatch):
    """A plain process: no launcher variables, no MGPU_* settings, not in the runtime's job (one that an
    earlier test in this process joined, as ``mgpu_runtime.save`` does, is left first); left as found afterwards."""
    for name in list(os.environ):
        if name in _LAUNCH_VARIABLES or name.startswith(("SLURM_", "MGPU_")):
            monkeypatch.delenv(name)
    process_group.teardown()
    was_initialized = dist.is_initialized()
    yield
    process_group.teardown()
    assert dist.is_initialized() == was_initialized


class TestSetup:
    def test_a_world_of_one_without_network(self, single_process):
        mgpu_runtime.setup()
        mgpu_runtime.setup()
        assert (mgpu_runtime.rank(), mgpu_runtime.local_rank(), mgpu_runtime.node_rank()) == (0, 0, 0)
        assert mgpu_runtime.world_size() == 1 and mgpu_runtime.is_main_process()
        expected_device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        assert mgpu_runtime.device() == expected_device
        assert dist.is_initialized() and dist.get_world_size() == 1
        assert "MASTER_PORT" not in os.environ
        mgpu_runtime.barrier()

    def test_teardown_leaves_and_setup_joins_again(self, single_process):
        mgpu_runtime.setup()
        process_group.teardown()
        assert not dist.is_initialized()
        mgpu_runtime.setup()
        assert dist.is_initialized()

    def test_half_set_environment_stops_setup(self, single_process, monkeypatch):
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(LaunchEnvironmentError, match="WORLD_SIZE"):
            mgpu_runtime.setup()
        assert not dist.is_initialized()

    def test_mgpu_nproc_1_keeps_one_process(self, single_process, monkeypatch):
        monkeypatch.setenv("MGPU_NPROC", "1")
        mgpu_runtime.setup()
        assert mgpu_runtime.world_size() == 1

    def test_a_relaunched_process_never_relaunches_again(self, single_process, monkeypatch):
        monkeypatch.setenv("MGPU_NPROC", "2")
        monkeypatch.setenv("MGPU_RELAUNCHED", "1")
        # Were the guard broken, this process (pytest) must not be replaced by torchrun.
        monkeypatch.setattr(os, "execve", lambda *args: pytest.fail(f"relaunched: {args}"))
        with pytest.raises(LaunchEnvironmentError, match="Not relaunching again"):
            mgpu_runtime.setup()

    def test_one_process_asked_for_is_never_relaunched(self, single_process, monkeypatch, tmp_path):
        """``setup(processes=1)``: a click command that runs no model (deeplab-pytorch's ``crf``) stays one process
        with two wanted, and the runtime's helpers after it act as in one process (the end to end of it:
        test_project_shapes_e2e's ``report``)."""
        monkeypatch.setenv("MGPU_NPROC", "2")
        monkeypatch.setattr(os, "execve", lambda *args: pytest.fail(f"relaunched: {args}"))
        with pytest.raises(ValueError, match="only processes=1"):
            mgpu_runtime.setup(processes=2)
        mgpu_runtime.setup(processes=1)
        assert (mgpu_runtime.rank(), mgpu_runtime.world_size(), mgpu_runtime.is_main_process()) == (0, 1, True)
        with mgpu_runtime.main_process_only(open, tmp_path / "report.txt", "x") as report:
            report.write("written")
        assert (tmp_path / "report.txt").read_text() == "written"

    def test_coordinates_answer_without_setup_where_no_relaunch_is_wanted(self, single_process, monkeypatch):
        monkeypatch.setattr(os, "execve", lambda *args: pytest.fail(f"relaunched: {args}"))
        assert (mgpu_runtime.rank(), mgpu_runtime.world_size(), mgpu_runtime.is_main_process()) == (0, 1, True)
        assert process_group._job is None and not dist.is_initialized()
        assert mgpu_runtime.main_process_value(lambda: "read here") == "read here"
        assert process_group._job is None

    @pytest.mark.parametrize("coordinate", ["rank", "local_rank", "world_size", "node_rank", "is_main_process", "main_process_value"])
    def test_before_a_relaunch_coordinates_relaunch_first(self, single_process, monkeypatch, coordinate):
        """A plain start wanting two processes: the pre-launch process is none of the job's, so asking where it
        sits relaunches it (here the exec is stood in for) instead of answering "rank 0" for it."""
        monkeypatch.setenv("MGPU_NPROC", "2")
        monkeypatch.setattr("sys.argv", ["train.py"])
        relaunched = []

        def execve(path, command, environment):
            relaunched.append(command)
            raise SystemExit("exec")

        monkeypatch.setattr(os, "execve", execve)
        asked = getattr(mgpu_runtime, coordinate)
        with pytest.raises(SystemExit, match="exec"):
            asked(lambda: 0) if coordinate == "main_process_value" else asked()
        assert relaunched and "--nproc_per_node=2" in relaunched[0]

    def test_a_dataloader_worker_answers_without_setup(self, single_process, monkeypatch):
        monkeypatch.setenv("MGPU_NPROC", "2")
        monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
        monkeypatch.setattr(os, "execve", lambda *args: pytest.fail(f"relaunched: {args}"))
        assert mgpu_runtime.rank() == 0 and process_group._job is None


class TestWrappersInAWorldOfOne:
    def test_ddp_is_torchs_with_dataparallels_keys(self, single_process):
        bare = nn.Linear(3, 2)
        model = mgpu_runtime.DistributedDataParallel(bare, device_ids=[0, 1], output_device=0)
        assert isinstance(model, nn.parallel.DistributedDataParallel) and model.module is bare
        assert list(model.state_dict()) == list(nn.DataParallel(nn.Linear(3, 2)).state_dict())
        assert isinstance(model, mgpu_runtime.PARALLEL_WRAPPERS) and mgpu_runtime.unwrap(model) is bare

    def test_ddp_trains_as_the_bare_module(self, single_process):
        torch.manual_seed(0)
        bare, twin = nn.Linear(3, 2), nn.Linear(3, 2)
        twin.load_state_dict(bare.state_dict())
        model = mgpu_runtime.DistributedDataParallel(twin)
        x, y = torch.randn(5, 3), torch.randn(5, 2)
        nn.functional.mse_loss(bare(x), y).backward()
        nn.functional.mse_loss(model(x), y).backward()
        for expected, actual in zip(bare.parameters(), twin.parameters()):
            torch.testing.assert_close(actual.grad, expected.grad, rtol=0, atol=0)

    def test_a_frozen_module_is_held_not_refused(self, single_process):
        """A distillation teacher: torch's DDP refuses a module with nothing to train; DataParallel held it."""
        teacher = nn.Linear(3, 2).requires_grad_(False)
        model = mgpu_runtime.DistributedDataParallel(teacher, device_ids=[0])
        assert not isinstance(model, nn.parallel.DistributedDataParallel) and model.module is teacher
        assert list(model.state_dict()) == list(nn.DataParallel(nn.Linear(3, 2)).state_dict())
        assert isinstance(model, mgpu_runtime.PARALLEL_WRAPPERS) and mgpu_runtime.unwrap(model) is teacher
        x = torch.randn(4, 3)
        assert torch.equal(model(x), teacher(x))

    def test_setup_leaves_the_generators_and_the_device_count_as_they_are(self, single_process):
        """Rank 0's generators and W emulated devices are for a job of several processes; one process is the
        original's already."""
        random.seed(1)
        numpy.random.seed(2)
        torch.manual_seed(3)
        states = (random.getstate(), numpy.random.get_state()[1].copy(), torch.get_rng_state())
        devices = torch.cuda.device_count()
        mgpu_runtime.setup()
        assert random.getstate() == states[0] and (numpy.random.get_state()[1] == states[1]).all()
        assert torch.equal(torch.get_rng_state(), states[2]) and torch.cuda.device_count() == devices

    def test_loader_and_criterion_are_the_originals(self, single_process):
        loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4)
        assert mgpu_runtime.distribute_loader(loader) is loader
        loaders = {"train": loader, "val": loader}
        assert mgpu_runtime.distribute_loaders(loaders) is loaders
        with pytest.raises(TypeError, match="a dict, list or tuple of loaders, not DataLoader"):
            mgpu_runtime.distribute_loaders(loader)
        criterion = nn.CrossEntropyLoss(ignore_index=0)
        logits, target = torch.randn(6, 3, requires_grad=True), torch.tensor([0, 1, 2, 1, 0, 2])
        assert torch.equal(mgpu_runtime.DistributedCriterion(criterion)(logits, target), criterion(logits, target))

    def test_reductions_return_their_input(self, single_process):
        assert mgpu_runtime.reduce_sum(3) == 3 and mgpu_runtime.reduce_sum(2.5) == 2.5
        values = torch.tensor([1.0, 2.0])
        assert torch.equal(mgpu_runtime.reduce_sum(values), values)
        assert mgpu_runtime.reduce_mean(4.0) == 4.0 and mgpu_runtime.reduce_mean(4.0, count=3) == 4.0


class TestSaveAndLoad:
    def test_writes_atomically_and_loads_onto_the_device(self, single_process, tmp_path):
        target = tmp_path / "model.pt"
        mgpu_runtime.save({"weight": torch.ones(2)}, target)
        assert os.listdir(tmp_path) == ["model.pt"]
        loaded = mgpu_runtime.load(target)
        assert loaded["weight"].device == mgpu_runtime.device() and torch.equal(loaded["weight"].cpu(), torch.ones(2))
        assert mgpu_runtime.load(target, map_location="cpu")["weight"].device == torch.device("cpu")

    def test_a_failed_save_leaves_the_old_file_and_no_debris(self, single_process, tmp_path):
        target = tmp_path / "model.pt"
        mgpu_runtime.save({"version": 1}, target)
        with pytest.raises((AttributeError, pickle.PicklingError)):
            mgpu_runtime.save({"unpicklable": lambda: None}, str(target))
        assert os.listdir(tmp_path) == ["model.pt"]
        assert mgpu_runtime.load(target)["version"] == 1


class TestTakingRows:
    Pair = collections.namedtuple("Pair", "image label")

    def test_cuts_every_batched_tensor_and_per_row_list(self):
        batch = {
            "pair": self.Pair(torch.arange(10).view(5, 2), torch.arange(5)),
            "names": ["a", "b", "c", "d", "e"],
            "scale": torch.tensor(2.0),
            "vocabulary": torch.arange(3),
            "tag": "train",
        }
        piece = take_rows(batch, 1, 3, batch_rows(batch))
        assert piece["pair"].image.tolist() == [[2, 3], [4, 5]] and piece["pair"].label.tolist() == [1, 2]
        assert piece["names"] == ["b", "c"] and piece["tag"] == "train"
        assert piece["scale"] is batch["scale"] and piece["vocabulary"] is batch["vocabulary"]

    def test_an_empty_span_keeps_the_structure(self):
        batch = (torch.ones(1, 4), torch.zeros(1, dtype=torch.long))
        inputs, targets = take_rows(batch, 0, 0, 1)
        assert inputs.shape == (0, 4) and targets.shape == (0,)

    def test_a_batch_without_tensors_cannot_be_split(self):
        with pytest.raises(TypeError, match="without tensors"):
            batch_rows(["a", "b"])


_WEIGHT = torch.tensor([0.5, 1.0, 2.0, 3.0])
_LOGITS = torch.randn(9, 4, generator=torch.Generator().manual_seed(0)).log_softmax(1)
_PREDICTED = torch.rand(9, 3, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    ("function", "target", "options"),
    [
        (F.cross_entropy, torch.tensor([0, 1, 2, 3, -100, 1, 2, 1, 0]), {}),
        (
            F.cross_entropy,
            torch.tensor([0, 1, 2, 3, 1, 1, 2, 1, 0]),
            {"weight": _WEIGHT, "ignore_index": 1, "label_smoothing": 0.2},
        ),
        (F.nll_loss, torch.tensor([0, 1, 2, 3, -100, 1, 2, 1, 0]), {"weight": _WEIGHT}),
        (F.cross_entropy, _LOGITS.exp().flip(1), {}),
        (F.mse_loss, _PREDICTED.flip(0), {}),
        (F.binary_cross_entropy, _PREDICTED.flip(0).round(), {"reduction": "sum"}),
        (F.kl_div, _LOGITS.flip(0).exp(), {"reduction": "batchmean"}),
    ],
)
def test_a_loss_splits_into_what_it_averaged_over(function, target, options):
    """Summed over the pieces of a batch, numerator / denominator (or the numerators of a sum) is the
    unsplit loss; the middle piece of the class-index cases holds only an ignored target."""
    source = _PREDICTED if function in (F.mse_loss, F.binary_cross_entropy) else _LOGITS
    parts = [
        loss_parts(function, bind(function, (source[a:b], target[a:b]), options)) for a, b in ((0, 4), (4, 5), (5, 9))
    ]
    numerator = sum(part.numerator for part in parts)
    expected = function(source, target, **options)
    if options.get("reduction") == "sum":
        assert all(part.denominator is None for part in parts)
        torch.testing.assert_close(numerator, expected)
    else:
        torch.testing.assert_close(numerator / sum(part.denominator for part in parts), expected)


class _SyncedOverReplicaThreads(nn.Module):
    """CCNet's InPlaceABNSync's shape: the first device's replica waits on queues for the others' statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.master_queue = queue.Queue(1)
        self.worker_queues = [queue.Queue(1)]


def test_a_layer_that_meets_its_copies_in_replica_threads_is_refused_at_the_wrap():
    """Under DDP each process holds one replica: the first would wait forever for copies in other processes."""
    model = nn.Sequential(nn.Linear(3, 3), _SyncedOverReplicaThreads())
    with pytest.raises(TypeError, match=r"`1` \(.*_SyncedOverReplicaThreads\) meets its copies across nn.DataParallel's"):
        mgpu_runtime.DistributedDataParallel(model)


@pytest.mark.parametrize("make", ["Queue", "SimpleQueue", "Barrier", "Event"])
def test_so_is_one_that_meets_them_through_multiprocessing_primitives(make):
    """A multiprocessing queue or barrier made in each process links nothing across DDP's processes either."""
    import multiprocessing

    layer = nn.Linear(3, 3)
    layer.link = getattr(multiprocessing, make)(*((2,) if make == "Barrier" else ()))
    with pytest.raises(TypeError, match="meets its copies across nn.DataParallel's"):
        mgpu_runtime.DistributedDataParallel(nn.Sequential(layer))


class _OwnInit(mgpu_runtime.DistributedDataParallel):
    """A DataParallel subclass rebased by the migration (MGP106), whose __init__ takes no options."""

    def __init__(self, module, num_gpus):
        super().__init__(module)
        self.num_gpus = num_gpus


class _PassesOn(mgpu_runtime.DistributedDataParallel):
    def __init__(self, module, **kwargs):
        self.given = dict(kwargs)
        super().__init__(module, **kwargs)


def test_a_rebased_subclass_takes_the_options_its_own_init_cannot_pass_on(single_process):
    """EfficientDet's `CustomDataParallel(model, params.num_gpus, replication_callbacks=True)`: the keyword reaches the
    runtime's wrapper, past `def __init__(self, module, num_gpus)`, which would otherwise refuse it."""
    model = _OwnInit(nn.Linear(3, 2), 2, replication_callbacks=True, reduce_each_backward=True, find_unused_parameters=True)
    assert model.num_gpus == 2 and model._reduce_each_backward and model.find_unused_parameters
    assert "_wrap_options" not in model.__dict__
    plain = _OwnInit(nn.Linear(3, 2), 2)
    assert not plain._reduce_each_backward and not plain.find_unused_parameters
    with pytest.raises(TypeError, match="unexpected keyword"):
        _OwnInit(nn.Linear(3, 2), 2, bucket_cap_mb=1)  # not an option of a migration: the subclass's own error
    handed = _PassesOn(nn.Linear(3, 2), find_unused_parameters=True)  # its __init__ takes them itself
    assert handed.given == {"find_unused_parameters": True} and handed.find_unused_parameters
