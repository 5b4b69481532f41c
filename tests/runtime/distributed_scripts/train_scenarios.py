"""Trains every scenario of the distributed tests, as the DataParallel original or as its migration.

    python train_scenarios.py OUT_DIR             the migrated script (mgpu_runtime), however it is launched
    python train_scenarios.py OUT_DIR --original  the original: nn.DataParallel, plain loaders and criteria

One launch trains all scenarios, because starting processes is what costs time. Each process writes
``OUT_DIR/rank<R>.pt``: its coordinates and, per scenario, the final weights, the losses it logged, and
the samples seen (summed over processes). The migrated form is what the codemod emits: the model wrapped
in ``mgpu_runtime.DistributedDataParallel``, criteria in ``DistributedCriterion``, training loaders in
``distribute_loader``, counts through ``reduce_sum``/``reduce_mean``, checkpoints through ``save``/``load``.
"""

from __future__ import annotations

import argparse
import pathlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

FEATURES, OUTPUTS, CLASSES = 4, 3, 5
IGNORED = -100


@dataclass(frozen=True)
class Scenario:
    samples: int
    batch_size: int
    epochs: int = 2
    loss: str = "mse"
    """``mse``, ``mse_sum``, ``weighted_ce`` (class weights, ignore_index, label smoothing) or ``in_model``."""
    shuffle: bool = False
    workers: int = 0
    iterable: bool = False
    drifting_generators: bool = False
    """Ranks other than 0 draw extra random numbers each epoch, as dropout on smaller slices would."""
    learning_rate: float = 0.1


SCENARIOS = {
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
}


class Regressor(nn.Module):
    def __init__(self, outputs: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, outputs))

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
    """The DataParallel original's calls (on a machine without GPUs DataParallel runs the module as is)."""

    model = staticmethod(nn.DataParallel)
    criterion = staticmethod(lambda criterion: criterion)
    loader = staticmethod(lambda loader: loader)
    reduce_sum = staticmethod(lambda value: value)
    reduce_mean = staticmethod(lambda value, count=None: value)
    save = staticmethod(torch.save)
    load = staticmethod(torch.load)
    rank = staticmethod(lambda: 0)


def migrated_api() -> Any:
    import mgpu_runtime

    class Migrated:
        model = staticmethod(mgpu_runtime.DistributedDataParallel)
        criterion = staticmethod(mgpu_runtime.DistributedCriterion)
        loader = staticmethod(mgpu_runtime.distribute_loader)
        reduce_sum = staticmethod(mgpu_runtime.reduce_sum)
        reduce_mean = staticmethod(mgpu_runtime.reduce_mean)
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


def train(scenario: Scenario, api: Any, checkpoint: pathlib.Path | None = None) -> dict[str, Any]:
    torch.manual_seed(1234)
    x, y = data(scenario)
    dataset = Stream(x, y) if scenario.iterable else TensorDataset(x, y)
    loader = api.loader(
        DataLoader(dataset, batch_size=scenario.batch_size, shuffle=scenario.shuffle, num_workers=scenario.workers)
    )
    classifies = scenario.loss in ("weighted_ce", "in_model")
    bare = (LossInside if scenario.loss == "in_model" else Regressor)(CLASSES if classifies else OUTPUTS)
    model = api.model(bare)
    criterion = api.criterion(criterion_for(scenario))
    optimizer = torch.optim.SGD(model.parameters(), lr=scenario.learning_rate, momentum=0.9)
    losses, seen = [], 0
    for _ in range(scenario.epochs):
        if scenario.drifting_generators and api.rank() > 0:
            torch.rand(7 * api.rank())
        for inputs, targets in loader:
            optimizer.zero_grad()
            if scenario.loss == "in_model":
                loss = model(inputs, targets)
                logged = api.reduce_mean(loss.detach(), count=len(targets))
            else:
                loss = logged = criterion(model(inputs), targets)
            loss.backward()
            optimizer.step()
            losses.append(logged.item())
            seen += len(inputs)
    result = {
        "weights": {name: value.detach().clone() for name, value in model.module.state_dict().items()},
        "losses": losses,
        "seen": api.reduce_sum(seen),
        "length": None if scenario.iterable else len(loader),
        "batch_size": loader.batch_size,
    }
    if checkpoint is not None:
        api.save(model.state_dict(), checkpoint)
        loaded = api.load(checkpoint)
        result["checkpoint_keys"] = sorted(loaded)
        result["checkpoint_matches"] = all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    return result


def unwrapped_model_refusal(api: Any) -> str | None:
    """What stepping an optimizer over a model nobody wrapped says: the safety net's message, or None."""
    x, y = data(SCENARIOS["even_split"])
    model = Regressor(OUTPUTS)
    criterion = api.criterion(nn.MSELoss())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, targets = next(iter(api.loader(DataLoader(TensorDataset(x, y), batch_size=12))))
    criterion(model(inputs), targets).backward()
    try:
        optimizer.step()
    except RuntimeError as error:
        return str(error)
    return None


def run(out: pathlib.Path, api: Any, coordinates: dict[str, Any]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    results = {
        "coordinates": coordinates,
        "scenarios": {
            name: train(scenario, api, checkpoint=out / "checkpoint.pt" if name == "uneven_last_batch" else None)
            for name, scenario in SCENARIOS.items()
        },
        "unwrapped_model_refusal": unwrapped_model_refusal(api),
    }
    torch.save(results, out / f"rank{coordinates['rank']}.pt")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--original", action="store_true")
    arguments = parser.parse_args()
    if arguments.original:
        run(arguments.out, Original, {"rank": 0, "world_size": 1})
    else:
        import mgpu_runtime

        mgpu_runtime.setup()
        coordinates = {
            "rank": mgpu_runtime.rank(),
            "local_rank": mgpu_runtime.local_rank(),
            "world_size": mgpu_runtime.world_size(),
            "node_rank": mgpu_runtime.node_rank(),
            "is_main_process": mgpu_runtime.is_main_process(),
            "device": str(mgpu_runtime.device()),
        }
        run(arguments.out, migrated_api(), coordinates)
