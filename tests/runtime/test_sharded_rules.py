"""Loop code on ``Sharded`` values computes what it computes on the global tensors: values and gradients, float64.

In one process, with the balanced runtime's group (the pieces side by side on the CPU), at 2 and 3 parts with
uneven pieces and with a batch smaller than the parts (an empty piece). The same cases run over real
processes (gloo, torchrun) at the end (``distributed_scripts/sharded_cases_job.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mgpu_runtime.sharded import ReplicaGroup, Sharded
from mgpu_runtime.structure import chunk_sizes
from tests.runtime.sharded_cases import CASES, Batch, difference, global_data, job_results

TOLERANCE = 1e-9
LAYOUTS = [(7, 2), (7, 3), (5, 3), (2, 3)]


def _sharded(tensor: torch.Tensor, parts: int, group: ReplicaGroup) -> Sharded:
    splits = chunk_sizes(len(tensor), parts)
    splits += [0] * (parts - len(splits))
    return Sharded(list(torch.split(tensor, splits)), splits, group)


def _run(case, rows: int, parts: int | None):
    data = global_data(rows)
    x = data["x"].clone().requires_grad_(True)
    w = data["w"].clone().requires_grad_(True)
    group = ReplicaGroup([torch.device("cpu")] * (parts or 1), torch.device("cpu"))

    def cut(tensor):
        return tensor if parts is None else _sharded(tensor, parts, group)

    sharded_x = cut(x)
    batch = Batch(
        x=sharded_x,
        w=w,
        out=sharded_x @ w,
        y=cut(data["y"]),
        tokens=cut(data["tokens"]),
        mask=cut(data["mask"]),
        plain=data["plain"],
    )
    value = case(batch)
    gradients = None
    if isinstance(value, torch.Tensor) and value.requires_grad:
        value.backward()
        gradients = (x.grad, w.grad)
    if type(value) is Sharded:
        from mgpu_runtime.sharded import materialize

        value = materialize(value)
    return torch.as_tensor(value).detach(), gradients


@pytest.mark.parametrize("rows,parts", LAYOUTS, ids=[f"{rows}-rows-{parts}-parts" for rows, parts in LAYOUTS])
@pytest.mark.parametrize("case", CASES, ids=[case.__name__ for case in CASES])
def test_a_case_on_pieces_computes_the_global_value_and_gradients(case, rows, parts):
    expected, expected_gradients = _run(case, rows, None)
    value, gradients = _run(case, rows, parts)
    assert difference(value, expected) <= TOLERANCE, f"value {value} != {expected}"
    if expected_gradients is not None:
        assert gradients is not None
        for name, got, want in zip(("x", "w"), gradients, expected_gradients):
            assert difference(got, want) <= TOLERANCE, f"gradient of {name} differs by {difference(got, want)}"


def test_a_piece_rule_stays_in_pieces():
    """The element-wise and row-wise steps of a token loss never materialise the batch: the result of each is
    still held in pieces, and only the reductions combine."""
    group = ReplicaGroup([torch.device("cpu")] * 2, torch.device("cpu"))
    data = global_data(7)
    out = _sharded(data["x"] @ data["w"], 2, group)
    tokens = _sharded(data["tokens"], 2, group)
    steps = [out.log_softmax(1), out.view(-1), tokens.ne(0), out[:, 1:], out[tokens[:, 0] > 1], out.argmax(1) == 3]
    assert all(type(step) is Sharded for step in steps)
    assert [tuple(step.shape) for step in steps[:4]] == [(7, 5), (35,), (7, 4), (7, 4)]


def test_the_global_metadata_needs_no_gather():
    group = ReplicaGroup([torch.device("cpu")] * 3, torch.device("cpu"))
    value = _sharded(torch.arange(10.0).view(5, 2), 3, group)
    assert (value.shape, value.size(0), value.size(), len(value), value.numel(), value.dim()) == (
        torch.Size((5, 2)), 5, torch.Size((5, 2)), 5, 10, 2,
    )
    assert value._splits == (2, 2, 1)
    assert isinstance(value, torch.Tensor) and value.is_floating_point() and not value.requires_grad


JOB = Path(__file__).parent / "distributed_scripts" / "sharded_cases_job.py"


@pytest.mark.slow
@pytest.mark.parametrize("processes", [2, 3])
def test_every_case_over_processes_computes_the_global_value_and_gradients(tmp_path, processes):
    """The cases over real processes (torchrun, gloo), each rank holding its rows: 7, 5 and 2 rows, float64."""
    results = job_results(JOB, processes, tmp_path)
    assert set(results) == {f"{case.__name__}/{rows}" for case in CASES for rows in (7, 5, 2)}
    assert {name: worst for name, worst in results.items() if not worst <= 1e-9} == {}
