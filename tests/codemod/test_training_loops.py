"""Which loops train (analysis/loaders.py) and what MGP122 does with their loaders under --to ddp.

A backward pass in a helper of this file makes the loop around the helper's call a training loop; a loop
that only counts is never a data loop; a helper that trains only when a parameter says so trains for the
calls whose literal says so, and data reaching it through a call the tool cannot read is left whole.
"""

import textwrap

import libcst as cst
import pytest

from mgpu_migrate.analysis import FileAnalysis
from mgpu_migrate.engine import migrate_source
from mgpu_migrate.options import DEFAULT_OPTIONS, Options
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS


def analyse(source: str) -> FileAnalysis:
    source = textwrap.dedent(source)
    return FileAnalysis("example.py", source, cst.parse_module(source))


def roles(source: str) -> dict[str, set[str]]:
    """For each ``DataLoader(dataset, ...)``, by its dataset's name: how the loops it reaches use it."""
    analysis = analyse(source)
    found: dict[str, set[str]] = {}
    for trace in analysis.loaders.traces:
        if trace.origin is None:
            continue
        role = "unsure" if trace.unsure is not None else "train" if trace.training else "eval"
        found.setdefault(analysis.module.code_for_node(trace.origin.args[0].value), set()).add(role)
    return found


def diagnostics(source: str, options: Options = DEFAULT_OPTIONS) -> list[tuple[int, str]]:
    result = migrate_source(textwrap.dedent(source), "ddp", "example.py", options)
    assert result.error is None
    return sorted((d.line, d.code) for d in result.diagnostics)


HEADER = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader
model = nn.DataParallel(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""


class TestHelperSteps:
    def test_loop_around_a_helper_that_steps_several_times_is_the_training_loop(self):
        source = HEADER + textwrap.dedent(
            """
            def step(x):
                for _ in range(3):
                    model(x).mean().backward()
                    opt.step()
            loader = DataLoader(train_set, batch_size=4, shuffle=True)
            for (x,) in loader:
                step(x)
            """
        )
        assert roles(source) == {"train_set": {"train"}}
        analysis = analyse(source)
        assert [analysis.module.code_for_node(loop.iter) for loop in analysis.loaders.training_loops] == ["loader"]
        codes = [code for _, code in diagnostics(source)]
        assert "MGP122" in codes and "MGP234" not in codes and "MGP235" not in codes

    def test_backward_two_helpers_deep(self):
        source = HEADER + textwrap.dedent(
            """
            def backward(loss):
                loss.backward()
            def step(x):
                backward(model(x).mean())
                opt.step()
            for (x,) in DataLoader(train_set, batch_size=4):
                step(x)
            """
        )
        assert roles(source) == {"train_set": {"train"}}

    @pytest.mark.parametrize(
        "loss, code",
        [("model(x).mean()", "MGP162"), ("model(x).sum()", "MGP236"), ("(model(x) - 1).pow(2).sum() / 2", "MGP236")],
    )
    def test_a_loss_handed_to_a_helper_is_checked_for_a_sum_under_style_torch(self, loss, code):
        """DDP's gradient average cannot weight a sum: --style torch leaves that loop's data whole (MGP236); the
        default style splits it whatever the loss, its runtime's loss being the global batch's."""
        source = HEADER + textwrap.dedent(
            f"""
            def apply(loss):
                opt.zero_grad()
                loss.backward()
                opt.step()
            loader = DataLoader(train_set, batch_size=4)
            for (x,) in loader:
                apply({loss})
            """
        )
        codes = {code for _, code in diagnostics(source, TORCH_OPTIONS)}
        assert code in codes
        assert codes.isdisjoint({"MGP162", "MGP236"} - {code})
        assert "MGP122" in {code for _, code in diagnostics(source)}

    def test_a_loss_summed_inside_the_helper_under_style_torch(self):
        source = HEADER + textwrap.dedent(
            """
            def step(x):
                loss = model(x).sum()
                loss.backward()
            loader = DataLoader(train_set, batch_size=4)
            for (x,) in loader:
                step(x)
            """
        )
        codes = {code for _, code in diagnostics(source, TORCH_OPTIONS)}
        assert "MGP236" in codes and "MGP162" not in codes


class TestCountingLoops:
    @pytest.mark.parametrize(
        "iterable", ["range(epochs)", "enumerate(range(1, epochs))", "reversed(range(epochs))", "trange(epochs)"]
    )
    def test_counting_loop_is_not_a_data_loop(self, iterable):
        analysis = analyse(f"from tqdm import trange\nfor epoch in {iterable}:\n    pass\n")
        assert analysis.loaders.counts(analysis.tree.nodes(cst.For)[0])

    @pytest.mark.parametrize("iterable", ["loader", "enumerate(loader)", "range_loader", "zip(range(3), loader)"])
    def test_data_loop_does_not_count(self, iterable):
        analysis = analyse(f"for step in {iterable}:\n    pass\n")
        assert not analysis.loaders.counts(analysis.tree.nodes(cst.For)[0])

    def test_epoch_loop_around_a_helper_call_gets_no_mgp235(self):
        # The evaluation comprehension calls the training helper with train=False: it does not train, so the
        # epoch loop around it is no training loop of unfollowed data.
        source = HEADER + textwrap.dedent(
            """
            def run_batch(x, train=True):
                loss = model(x).mean()
                if train:
                    loss.backward()
                return loss.item()
            if __name__ == "__main__":
                train_loader = DataLoader(train_set, batch_size=4, shuffle=True)
                val_loader = DataLoader(val_set, batch_size=4)
                for epoch in range(2):
                    for (x,) in train_loader:
                        run_batch(x, train=True)
                    print([run_batch(x, train=False) for (x,) in val_loader])
            """
        )
        assert roles(source) == {"train_set": {"train"}, "val_set": {"eval"}}
        codes = [code for _, code in diagnostics(source)]
        assert "MGP235" not in codes and codes.count("MGP122") == 1 and "MGP234" in codes

    def test_critic_steps_inside_a_loader_loop(self):
        source = HEADER + textwrap.dedent(
            """
            for real, _ in DataLoader(faces, batch_size=64, shuffle=True):
                for i in range(5):
                    model(real).mean().backward()
                model(real).mean().backward()
            """
        )
        assert roles(source) == {"faces": {"train"}}
        assert "MGP235" not in {code for _, code in diagnostics(source)}

    def test_counting_loop_drawing_batches_with_next_is_reported(self):
        source = HEADER + textwrap.dedent(
            """
            def pretrain(batches, steps):
                stream = iter(batches)
                for step in range(steps):
                    x = next(stream)
                    model(x).mean().backward()
            """
        )
        assert "MGP235" in {code for _, code in diagnostics(source)}


RUN_EPOCH = HEADER + """
def run_epoch(loader, {params}):
    for (x,) in loader:
        loss = model(x).mean()
        {guard}
            loss.backward()
            opt.step()
"""


class TestSharedTrainEvalLoops:
    @pytest.mark.parametrize(
        "params, guard, train_call, eval_call",
        [
            ("train", "if train:", "True", "False"),
            ("train: bool", "if train is True:", "train=True", "train=False"),
            ("evaluate", "if not evaluate:", "False", "evaluate=True"),
            ("mode", "if mode == 'train':", "'train'", "mode='val'"),
            ("mode", "if mode != 'eval':", "'train'", "'eval'"),
            ("evaluate", "if evaluate:\n            pass\n        else:", "False", "True"),
            ("train=True", "if train:", "", "train=False"),
        ],
    )
    def test_each_call_settles_which_loader_trains(self, params, guard, train_call, eval_call):
        source = RUN_EPOCH.format(params=params, guard=guard) + textwrap.dedent(
            f"""
            train_loader = DataLoader(train_set, batch_size=4, shuffle=True)
            val_loader = DataLoader(val_set, batch_size=4, shuffle=True)
            for epoch in range(3):
                run_epoch(train_loader{", " if train_call else ""}{train_call})
                run_epoch(val_loader, {eval_call})
            """
        )
        assert roles(source) == {"train_set": {"train"}, "val_set": {"eval"}}
        result = migrate_source(textwrap.dedent(source), "ddp", "example.py")
        assert "mgpu_runtime.distribute_loader(DataLoader(train_set" in result.output
        assert "val_loader = DataLoader(val_set" in result.output
        assert "MGP234" in {d.code for d in result.diagnostics}

    def test_a_call_the_tool_cannot_read_leaves_its_data_whole(self):
        source = RUN_EPOCH.format(params="train", guard="if train:") + textwrap.dedent(
            """
            def main(flag):
                train_loader = DataLoader(train_set, batch_size=4, shuffle=True)
                other_loader = DataLoader(other_set, batch_size=4, shuffle=True)
                run_epoch(train_loader, True)
                run_epoch(other_loader, flag)
            """
        )
        assert roles(source) == {"train_set": {"train"}, "other_set": {"unsure"}}
        result = migrate_source(textwrap.dedent(source), "ddp", "example.py")
        assert "mgpu_runtime.distribute_loader(DataLoader(train_set" in result.output
        assert "other_loader = DataLoader(other_set" in result.output
        unsure = [d for d in result.diagnostics if d.code == "MGP235"]
        assert len(unsure) == 1 and "`train` holds (line 11)" in unsure[0].message
        assert "the data from line 17:" in unsure[0].message
        assert "MGP234" not in {d.code for d in result.diagnostics}

    def test_a_shared_loop_fed_through_one_step_distributes_nothing_it_cannot_settle(self):
        # Both loaders reach the loop through the same variable: no call settles the test for either.
        source = RUN_EPOCH.format(params="train", guard="if train:") + textwrap.dedent(
            """
            def main(train_set, val_set, schedule):
                for train in schedule:
                    loader = DataLoader(train_set, shuffle=True)
                    if not train:
                        loader = DataLoader(val_set)
                    run_epoch(loader, train)
            """
        )
        assert roles(source) == {"train_set": {"unsure"}, "val_set": {"unsure"}}
        result = migrate_source(textwrap.dedent(source), "ddp", "example.py")
        assert "distribute_loader" not in result.output

    def test_a_test_of_something_else_does_not_make_the_loop_shared(self):
        source = HEADER + textwrap.dedent(
            """
            def train(loader, scaler=None):
                for (x,) in loader:
                    loss = model(x).mean()
                    if scaler is not None:
                        scaler.scale(loss).backward()
                    else:
                        loss.backward()
                    if torch.isfinite(loss):
                        opt.step()
            train(DataLoader(train_set, batch_size=4), make_scaler())
            """
        )
        assert roles(source) == {"train_set": {"train"}}

    def test_data_not_passed_as_a_parameter_trains_when_every_call_says_so(self):
        source = HEADER + textwrap.dedent(
            """
            class Trainer:
                def __init__(self, data):
                    self.loader = DataLoader(data, batch_size=4, shuffle=True)
                def epoch(self, train):
                    for (x,) in self.loader:
                        if train:
                            model(x).mean().backward()
                def fit(self):
                    for _ in range(3):
                        self.epoch(True)
                        self.epoch(train=True)
            """
        )
        assert roles(source) == {"data": {"train"}}


def _doubling_helpers(depth: int) -> str:
    """Helpers that each call the one below twice: 2**depth ways from the loader to the loop."""
    lines = ["import torch.nn as nn", "from torch.utils.data import DataLoader", ""]
    lines += ["def f0(loader, model):", "    for x in loader:", "        model(x).mean().backward()", ""]
    for level in range(1, depth + 1):
        lines += [f"def f{level}(loader, model):", f"    f{level - 1}(loader, model)", f"    f{level - 1}(loader, model)", ""]
    lines += ["model = nn.DataParallel(net)", f"f{depth}(DataLoader(data, batch_size=4), model)", ""]
    return "\n".join(lines)


def test_few_ways_in_are_followed_to_the_loader():
    found = diagnostics(_doubling_helpers(5))  # 32 ways: within the budget
    assert any(code == "MGP122" for _, code in found)
    assert all(code != "MGP235" for _, code in found)


def test_exponentially_many_ways_in_leave_the_data_whole():
    """2**13 ways from the loader to the loop are not enumerated (that took minutes): past a budget the data
    counts as not followed (MGP235, at the loop), and the file migrates with it whole on every process (the wrapped
    model runs each process's chunk of each batch); under --style torch, where every process would train on whole
    batches, the file is left as it is."""
    found = diagnostics(_doubling_helpers(13))
    assert (5, "MGP235") in found and any(code == "MGP101" for _, code in found)
    assert all(code not in ("MGP122", "MGP289") for _, code in found)
    torch_style = diagnostics(_doubling_helpers(13), TORCH_OPTIONS)
    assert torch_style and all(code not in ("MGP101", "MGP122") for _, code in torch_style)
