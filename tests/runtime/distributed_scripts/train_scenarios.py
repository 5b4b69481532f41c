"""Trains every scenario of the distributed tests in float64, as the DataParallel original or as its migration.

    python -m mgpu_runtime.emulation --devices W train_scenarios.py OUT_DIR --original
                                      the original: nn.DataParallel on W emulated devices, plain loaders
    python train_scenarios.py OUT_DIR  the migration (mgpu_runtime), however it is launched

One launch trains all scenarios, because starting processes is what costs time. Each process writes
``OUT_DIR/rank<R>.pt`` (the original: ``rank0.pt``): its coordinates, what it saw at setup, and per scenario
the final weights, the losses and other values the loop computed, the samples it counted, the loader's
length. The migrated form is what a migration is under the runtime contract: ``mgpu_runtime.setup()``
where the program starts, the training loaders through ``distribute_loader``, ``DistributedDataParallel``
in place of ``nn.DataParallel``, checkpoints through ``save``/``load``; nothing else in the loop changes.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

FEATURES, OUTPUTS, CLASSES = 4, 3, 5
IGNORED = -100
EVALUATION_ROWS = 7


@dataclass(frozen=True)
class Scenario:
    samples: int
    batch_size: int
    epochs: int = 2
    loss: str = "mse"
    """``mse``, ``mse_sum``, ``weighted_ce`` (class weights, ignore_index, label smoothing), ``in_model`` (the
    model returns its own mean loss, a vector of the devices' losses under DataParallel), ``head_outside``
    (a learnable head outside the wrap, stepped by the same optimizer), ``output_arithmetic`` (the output
    reshaped, masked, indexed across rows and read through numpy in the loop) or ``mixup`` (numpy and python
    draws mixing rows in the loop)."""
    model: str = "mlp"
    """``mlp``, or ``normalised`` (BatchNorm and dropout in forward, then an evaluation forward)."""
    seed: int | None = 1234
    """``torch.manual_seed`` at the scenario's start; None: the generators as the script's start left them
    (seeded before setup)."""
    seed_python_and_numpy: bool = True
    shuffle: bool = False
    workers: int = 0
    iterable: bool = False
    drifting_generators: bool = False
    """Ranks other than 0 draw numbers of their own each epoch: the sampler's order must stay rank 0's."""
    learning_rate: float = 0.1


SCENARIOS = {
    # First, seeding nothing: numpy's and python's draws continue from setup, the same on every rank (not the
    # original's: each process seeds them from the OS); the second's dropout draws from the devices' streams
    # as the script's seed before setup left them (the first draws nothing there).
    "mixup_unseeded": Scenario(23, 6, loss="mixup", seed=None, seed_python_and_numpy=False, shuffle=True),
    "dropout_seeded_before_setup": Scenario(30, 8, model="normalised", seed=None, shuffle=True),
    "shuffled": Scenario(40, 8, epochs=3, shuffle=True),
    "shuffled_drifting_generators": Scenario(40, 8, epochs=3, shuffle=True, drifting_generators=True),
    "even_split": Scenario(36, 12),
    "uneven_last_batch": Scenario(23, 6, shuffle=True),
    "batch_smaller_than_world": Scenario(9, 2),
    "sum_loss": Scenario(22, 5, loss="mse_sum", shuffle=True, learning_rate=0.01),
    "weighted_ce_ignore_index": Scenario(30, 7, loss="weighted_ce", shuffle=True),
    "loss_in_model": Scenario(25, 6, loss="in_model", shuffle=True),
    "iterable_dataset": Scenario(17, 5, iterable=True),
    "loader_workers": Scenario(30, 7, shuffle=True, workers=2),
    "batchnorm_dropout_evaluated": Scenario(30, 8, model="normalised", shuffle=True),
    "head_outside_the_wrap": Scenario(23, 6, loss="head_outside", shuffle=True),
    "output_arithmetic": Scenario(23, 6, loss="output_arithmetic", shuffle=True),
    "mixup": Scenario(23, 6, loss="mixup", shuffle=True),
}
UNSEEDED = {name for name, scenario in SCENARIOS.items() if not scenario.seed_python_and_numpy}
"""Scenarios whose draws depend on the process's unseeded generators: equal on every rank, not the original's."""


class Regressor(nn.Module):
    def __init__(self, outputs: int, normalised: bool = False) -> None:
        super().__init__()
        hidden: list[nn.Module] = [nn.BatchNorm1d(8), nn.Dropout(0.3)] if normalised else []
        self.net = nn.Sequential(nn.Linear(FEATURES, 8), *hidden, nn.Tanh(), nn.Linear(8, outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class LossInside(Regressor):
    """HF-style: given labels, the model returns its own mean loss."""

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(x), labels)


class Stream(IterableDataset):
    def __init__(self, *columns: torch.Tensor) -> None:
        self.columns = columns

    def __iter__(self):
        return zip(*self.columns)


class Original:
    """The DataParallel original's calls."""

    setup = staticmethod(lambda: None)
    loader = staticmethod(lambda loader: loader)
    save = staticmethod(torch.save)
    load = staticmethod(torch.load)
    rank = staticmethod(lambda: 0)

    @staticmethod
    def model(module: nn.Module) -> nn.Module:
        return nn.DataParallel(module)  # looked up at the call: the emulation's, under the emulation


def migrated_api() -> Any:
    import mgpu_runtime

    class Migrated:
        setup = staticmethod(mgpu_runtime.setup)
        model = staticmethod(mgpu_runtime.DistributedDataParallel)
        loader = staticmethod(mgpu_runtime.distribute_loader)
        save = staticmethod(mgpu_runtime.save)
        load = staticmethod(mgpu_runtime.load)
        rank = staticmethod(mgpu_runtime.rank)

    return Migrated


def data(scenario: Scenario) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(scenario.samples)
    x = torch.randn(scenario.samples, FEATURES, generator=generator)
    if scenario.loss in ("weighted_ce", "in_model"):
        y = torch.randint(CLASSES, (scenario.samples,), generator=generator)
        if scenario.loss == "weighted_ce":
            y[::4] = IGNORED
        return x, y
    return x, torch.randn(scenario.samples, OUTPUTS, generator=generator)


def criterion_for(scenario: Scenario) -> nn.Module:
    if scenario.loss == "mse_sum":
        return nn.MSELoss(reduction="sum")
    if scenario.loss == "weighted_ce":
        weight = torch.linspace(0.5, 2.0, CLASSES)
        return nn.CrossEntropyLoss(weight=weight, ignore_index=IGNORED, label_smoothing=0.1)
    return nn.MSELoss()


def step_loss(scenario: Scenario, model: nn.Module, head: nn.Module | None, inputs, targets, logged: list) -> torch.Tensor:
    """One step's loss, as the original's loop computes it; values the loop reads go to ``logged``."""
    if scenario.loss == "in_model":
        loss = model(inputs, targets)
        if torch.cuda.device_count() > 1:
            loss = loss.mean()  # DataParallel gathered one loss per device
        return loss
    if scenario.loss == "head_outside":
        return F.mse_loss(head(model(inputs)), targets)
    if scenario.loss == "output_arithmetic":
        output = model(inputs)
        flat, flat_targets = output.reshape(-1), targets.reshape(-1)
        kept = flat_targets > 0
        masked = (flat[kept] - flat_targets[kept]).pow(2).sum() / kept.sum().clamp(min=1)
        hardest = torch.argsort((output - targets).abs().sum(1).detach(), descending=True)[:3]
        logged.append(float(np.abs(output.detach().numpy()).mean()))
        return masked + F.mse_loss(output[hardest], targets[hardest]) + 0.1 * output[:, 1:].mean()
    if scenario.loss == "mixup":
        share = float(np.random.beta(0.4, 0.4))
        order = torch.randperm(len(inputs))
        if random.random() < 0.5:
            inputs = inputs.flip(1)
        logged.append(share)
        output = model(share * inputs + (1 - share) * inputs[order])
        return share * F.mse_loss(output, targets) + (1 - share) * F.mse_loss(output, targets[order])
    return criterion_for(scenario)(model(inputs), targets)


def train(scenario: Scenario, api: Any, checkpoint: pathlib.Path | None = None) -> dict[str, Any]:
    if scenario.seed is not None:
        torch.manual_seed(scenario.seed)
    if scenario.seed_python_and_numpy:
        random.seed(scenario.samples)
        np.random.seed(scenario.samples)
    x, y = data(scenario)
    dataset = Stream(x, y) if scenario.iterable else TensorDataset(x, y)
    loader = api.loader(
        DataLoader(dataset, batch_size=scenario.batch_size, shuffle=scenario.shuffle, num_workers=scenario.workers)
    )
    classifies = scenario.loss in ("weighted_ce", "in_model")
    kind = LossInside if scenario.loss == "in_model" else Regressor
    model = api.model(kind(CLASSES if classifies else OUTPUTS, normalised=scenario.model == "normalised"))
    head = nn.Linear(OUTPUTS, OUTPUTS) if scenario.loss == "head_outside" else None
    parameters = [*model.parameters(), *(head.parameters() if head is not None else ())]
    optimizer = torch.optim.SGD(parameters, lr=scenario.learning_rate, momentum=0.9)
    losses, logged, seen = [], [], 0
    for _ in range(scenario.epochs):
        if scenario.drifting_generators and api.rank() > 0:
            torch.rand(7 * api.rank())
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = step_loss(scenario, model, head, inputs, targets, logged)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            seen += len(inputs)
    result = {"losses": losses, "logged": logged, "seen": seen, "length": None if scenario.iterable else len(loader)}
    result["batch_size"] = loader.batch_size
    if scenario.model == "normalised":
        model.eval()
        with torch.no_grad():
            result["evaluation"] = model(torch.linspace(-2, 2, EVALUATION_ROWS * FEATURES).view(EVALUATION_ROWS, FEATURES)).tolist()
    result["weights"] = {name: value.detach().clone() for name, value in model.module.state_dict().items()}
    if head is not None:
        result["weights"].update({f"head.{name}": value.detach().clone() for name, value in head.state_dict().items()})
    if checkpoint is not None:
        api.save(model.state_dict(), checkpoint)
        loaded = api.load(checkpoint)
        result["checkpoint_keys"] = sorted(loaded)
        result["checkpoint_matches"] = all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    return result


def own_draws_before_setup() -> None:
    """A process of the job drawing numbers of its own before setup (rank r draws r times): after setup every
    rank's generators are rank 0's. Python's and numpy's are seeded from the OS in each process anyway."""
    launched_as = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    for _ in range(launched_as):
        torch.rand(3)
        random.random()
        np.random.random()


def run(out: pathlib.Path, api: Any) -> None:
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)  # the script's seed, before setup: every device's stream starts from it, as on GPUs
    own_draws_before_setup()
    api.setup()
    at_setup = {
        "device_count": torch.cuda.device_count(),
        "draws": [random.random(), float(np.random.random()), torch.rand(()).item()],
    }
    if api is Original:
        coordinates = {"rank": 0}
    else:
        import mgpu_runtime

        coordinates = {
            "rank": mgpu_runtime.rank(),
            "local_rank": mgpu_runtime.local_rank(),
            "world_size": mgpu_runtime.world_size(),
            "node_rank": mgpu_runtime.node_rank(),
            "is_main_process": mgpu_runtime.is_main_process(),
            "device": str(mgpu_runtime.device()),
            # The metric helpers still combine what each rank counted of its own (not the loop's global values).
            "reduced": [mgpu_runtime.reduce_sum(mgpu_runtime.rank() + 1), mgpu_runtime.reduce_mean(float(mgpu_runtime.rank()))],
        }
    out.mkdir(parents=True, exist_ok=True)
    scenarios = {
        name: train(scenario, api, checkpoint=out / "checkpoint.pt" if name == "uneven_last_batch" else None)
        for name, scenario in SCENARIOS.items()
    }
    results = {"coordinates": coordinates, "at_setup": at_setup, "scenarios": scenarios}
    torch.save(results, out / f"rank{coordinates['rank']}.pt")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--original", action="store_true")
    arguments = parser.parse_args()
    run(arguments.out, Original if arguments.original else migrated_api())
