"""Gradient hooks on the loop's global values see what the hook on DataParallel's gathered tensor saw (float64).

In one process, with the balanced runtime's group (the pieces side by side on the CPU), at 2 and 3 parts with
uneven pieces and with a batch smaller than the parts (an empty piece); the same cases run over real processes
in ``test_sharded_hooks_ranks.py``. A hook is given the whole gradient and what it returns flows into the
pieces; ``retain_grad()``/``.grad`` and ``autograd.grad`` give the gradient after the hooks; a hook that cannot
be given the whole gradient is refused, naming its line (``mgpu_runtime.sharded.hooks``).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from mgpu_runtime.balanced import DataParallelModel
from mgpu_runtime.emulation.data_parallel import DataParallel as EmulatedDataParallel
from mgpu_runtime.sharded import ReplicaGroup, Sharded, materialize
from mgpu_runtime.structure import chunk_sizes
from tests.runtime import hook_cases
from tests.runtime.conftest_balanced import use_cpu_replicas
from tests.runtime.hook_cases import CASES, WHOLE_AFTER_USE, kept_values
from tests.runtime.sharded_cases import Batch, difference, global_data

TOLERANCE = 1e-9
LAYOUTS = [(7, 2), (7, 3), (5, 3), (2, 3)]
CPU = torch.device("cpu")


def _group(parts: int, active: int | None = None) -> ReplicaGroup:
    return ReplicaGroup([CPU] * parts, CPU, active)


def _sharded(tensor: torch.Tensor, parts: int, group: ReplicaGroup) -> Sharded:
    splits = chunk_sizes(len(tensor), parts)
    splits += [0] * (parts - len(splits))
    return Sharded(list(torch.split(tensor, splits))[: len(group.held)], splits, group)


def _batch(rows: int, parts: int | None, group: ReplicaGroup | None = None):
    data = global_data(rows)
    x = data["x"].clone().requires_grad_(True)
    w = data["w"].clone().requires_grad_(True)
    group = group or _group(parts or 1)

    def cut(tensor):
        return tensor if parts is None else _sharded(tensor, parts, group)

    sharded_x = cut(x)
    batch = Batch(sharded_x, w, sharded_x @ w, cut(data["y"]), cut(data["tokens"]), cut(data["mask"]), data["plain"])
    return batch, x, w


def _run(case, rows: int, parts: int | None):
    batch, x, w = _batch(rows, parts)
    loss, kept = case(batch)
    loss.backward()
    return materialize(loss).detach(), [x.grad, w.grad], kept_values(kept)


@pytest.mark.parametrize("rows,parts", LAYOUTS, ids=[f"{rows}-rows-{parts}-parts" for rows, parts in LAYOUTS])
@pytest.mark.parametrize("case", CASES, ids=[case.__name__ for case in CASES])
def test_a_hook_is_given_the_whole_gradient_and_what_it_returns_flows_on(case, rows, parts):
    expected = _run(case, rows, None)
    found = _run(case, rows, parts)
    assert difference(found[0], expected[0]) <= TOLERANCE
    for name, got, want in zip(("x", "w"), found[1], expected[1]):
        assert difference(got, want) <= TOLERANCE, f"gradient of {name} differs by {difference(got, want)}"
    assert len(found[2]) == len(expected[2])
    for index, (got, want) in enumerate(zip(found[2], expected[2])):
        assert difference(got, want) <= TOLERANCE, f"kept value {index}: {got} != {want}"


def test_a_value_not_used_yet_is_tied_and_one_used_is_hooked_piece_by_piece():
    batch, _, _ = _batch(7, 3)
    fresh = batch.out.tanh()
    fresh.register_hook(lambda grad: grad)
    used = batch.out.sigmoid()
    (used * 2).sum()
    used.register_hook(lambda grad: grad)
    printed = batch.out.exp()
    repr(printed), printed.tolist(), printed.shape  # a print, a list, its shape carry no gradient on: no use
    printed.register_hook(lambda grad: grad)
    alias = used.double()  # a conversion that changes nothing is the value itself, as in torch
    alias.register_hook(lambda grad: grad)
    assert fresh._tie is not None and used._tie is None and printed._tie is not None and alias is used
    assert all(type(value) is Sharded and value.shape == (7, 5) for value in (fresh, used, printed))


@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("use_first", [False, True], ids=["tied", "piece-by-piece"])
def test_a_hook_runs_once_per_backward(parts, use_first):
    batch, _, _ = _batch(7, parts)
    hidden = batch.out.tanh()
    before = (hidden * 2).sum() if use_first else 0
    calls = []
    hidden.register_hook(lambda grad: calls.append(tuple(grad.shape)) or grad * 2)
    loss = before + (hidden ** 2).sum()
    loss.backward(retain_graph=True)
    assert calls == [(7, 5)]
    loss.backward()
    assert calls == [(7, 5), (7, 5)]


@pytest.mark.parametrize("parts", [2, 3])
def test_a_hook_that_needs_the_other_rows_of_a_used_value_is_refused_naming_its_line(parts):
    batch, _, _ = _batch(7, parts)
    (case,) = WHOLE_AFTER_USE
    loss, _ = case(batch)
    with pytest.raises(RuntimeError, match=rf"hook registered at hook_cases.py:{_line('WHOLE AFTER USE')} needs .* was used before"):
        loss.backward()


def test_a_use_the_runtime_did_not_see_is_caught_in_the_backward():
    batch, _, _ = _batch(7, 2)
    hidden = batch.out.tanh()
    unseen = sum(piece.sum() for piece in hidden._pieces)  # the pieces used behind the rules' back
    hidden.register_hook(lambda grad: grad * 2)
    with pytest.raises(RuntimeError, match="saw only part of its value's gradient"):
        (unseen + hidden.sum()).backward()


@pytest.mark.parametrize("use_first", [False, True], ids=["tied", "piece-by-piece"])
def test_autograd_grad_gives_the_gradient_after_the_hooks(use_first):
    expected = None
    for parts in (None, 3):
        batch, _, _ = _batch(7, parts)
        hidden = batch.out.tanh()
        before = (hidden * batch.plain).sum() if use_first else 0
        hidden.register_hook(lambda grad, batch=batch: grad / hook_cases._scale(batch)[:, None])
        (gradient,) = torch.autograd.grad(before + (hidden ** 2).sum(), [hidden])
        if expected is None:
            expected = gradient
        else:
            assert type(gradient) is Sharded and difference(materialize(gradient), expected) <= TOLERANCE


@pytest.mark.parametrize("use_first", [False, True], ids=["tied", "piece-by-piece"])
def test_retain_grad_before_the_hook_keeps_the_gradient_after_it(use_first):
    expected = None
    for parts in (None, 2):
        batch, _, _ = _batch(5, parts)
        hidden = batch.out.tanh()
        hidden.retain_grad()
        before = (hidden * batch.plain).sum() if use_first else 0
        hidden.register_hook(lambda grad: grad * 3)
        (before + hidden.sum()).backward()
        gradient = materialize(hidden.grad)
        expected = gradient if expected is None else expected
        assert difference(gradient, expected) <= TOLERANCE
        hidden.grad = None
        assert hidden.grad is None


def test_a_batch_on_one_replica_is_hooked_on_its_one_piece():
    """One chunk (one row) over three replicas: only the first holds a piece, which is the whole value."""
    group = _group(3, active=1)
    expected = None
    for sharded in (False, True):
        x = global_data(1)["x"].clone().requires_grad_(True)
        value = Sharded([x], [1, 0, 0], group) if sharded else x
        norms = []
        value.register_hook(lambda grad, norms=norms: norms.append(float(grad.norm())) or grad / grad.norm())
        (value.tanh() ** 2).sum().backward()
        assert len(norms) == 1
        expected = x.grad if expected is None else expected
        assert difference(x.grad, expected) <= TOLERANCE


@pytest.mark.parametrize("use_first", [False, True], ids=["tied", "piece-by-piece"])
def test_torch_errors_are_torch_s(use_first):
    batch, _, _ = _batch(7, 3)
    with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that doesn't require gradient"):
        batch.y.register_hook(lambda grad: grad)
    hidden = batch.out.tanh()
    before = hidden.sum() if use_first else 0
    hidden.register_hook(lambda grad: grad[:, :2])
    with pytest.raises(RuntimeError, match="hook '<lambda>' has changed the size of value"):
        (before + hidden.sum()).backward()


@pytest.mark.parametrize("use_first", [False, True], ids=["tied", "piece-by-piece"])
def test_a_removed_hook_does_not_run(use_first):
    batch, x, _ = _batch(7, 3)
    hidden = batch.out.tanh()
    before = hidden.sum() if use_first else 0
    calls = []
    handle = hidden.register_hook(lambda grad: calls.append(1) or grad * 100)
    handle.remove()
    with hidden.register_hook(lambda grad: calls.append(2)):
        pass
    (before + hidden.sum()).backward()
    assert calls == []
    reference_x = global_data(7)["x"].clone().requires_grad_(True)
    reference = torch.tanh(reference_x @ global_data(7)["w"])
    ((reference.sum() if use_first else 0) + reference.sum()).backward()
    assert difference(x.grad, reference_x.grad) <= TOLERANCE


class _StateAndHead(nn.Module):
    """Returns a state that its forward also used for the head (muzero's dynamics: the next state and its reward)."""

    def __init__(self) -> None:
        super().__init__()
        self.dynamics = nn.Linear(4, 6)
        self.reward = nn.Linear(6, 1)

    def forward(self, x):
        state = torch.tanh(self.dynamics(x))
        return state, self.reward(state).squeeze(-1)


@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("use_first", [False, True], ids=["tied", "piece-by-piece"])
def test_the_gathered_output_s_hook_and_grad_see_the_loop_s_uses_not_the_forward_s(monkeypatch, replicas, use_first):
    """DataParallel's gather made a new tensor: its gradient is the loop's uses' only, not the head's inside forward."""
    use_cpu_replicas(monkeypatch, replicas)
    torch.manual_seed(0)
    original = _StateAndHead().double()
    twin = copy.deepcopy(original)
    x = torch.randn(7, 4, dtype=torch.float64)
    scale = torch.arange(1.0, 8.0, dtype=torch.float64)
    migrated = DataParallelModel(twin)  # emulates the MGPU_CPU_REPLICAS devices, for the original's DataParallel too
    results = []
    for model in (EmulatedDataParallel(original), migrated):
        seen = []
        state, reward = model(x)
        state.retain_grad()
        before = (state * 2).sum() if use_first else 0
        state.register_hook(lambda grad, seen=seen: seen.append(grad) or grad / scale[:, None])
        (before + reward.sum() + (state ** 2).sum()).backward()
        results.append((materialize(state.grad), materialize(seen[0]), [p.grad.clone() for p in model.module.parameters()]))
    (want_grad, want_seen, want_parameters), (got_grad, got_seen, got_parameters) = results
    assert difference(got_grad, want_grad) <= TOLERANCE
    assert difference(got_seen, want_seen) <= TOLERANCE
    for got, want in zip(got_parameters, want_parameters):
        assert difference(got, want) <= TOLERANCE


def _line(marker: str) -> int:
    source = Path(hook_cases.__file__).read_text().splitlines()
    return next(number for number, line in enumerate(source, 1) if marker in line)


def test_the_hook_cases_compute_on_the_batch():
    """The cases' losses need the model's output (a case that ignored it could not fail)."""
    for case in CASES:
        batch, x, w = _batch(5, None)
        loss, _ = case(batch)
        loss.backward()
        assert x.grad is not None and x.grad.abs().sum() > 0, case.__name__
        assert w.grad.abs().sum() > 0, case.__name__
