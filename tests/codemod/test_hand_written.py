"""MGP107 matches torch's data_parallel written out by hand, and nothing else (``analysis/hand_written.py``)."""

from __future__ import annotations

import textwrap

import pytest

from mgpu_migrate.engine import migrate_source
from mgpu_migrate.options import Options

HELPER = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn


    def data_parallel_workaround(model, *input):
        device_ids = list(range(torch.cuda.device_count()))
        output_device = device_ids[0]
        replicas = torch.nn.parallel.replicate(model, device_ids)
        inputs = torch.nn.parallel.scatter(input, device_ids)
        replicas = replicas[:len(inputs)]
        outputs = torch.nn.parallel.parallel_apply(replicas, inputs)
        y_hat = torch.nn.parallel.gather(outputs, output_device)
        return y_hat
    """
)


def codes(source: str, target: str = "balanced") -> set[str]:
    result = migrate_source(source, target, "utils.py")
    assert result.error is None
    return {d.code for d in result.diagnostics}


def test_the_helper_returns_the_runtime_s_data_parallel_and_a_second_run_changes_nothing():
    result = migrate_source(HELPER, "balanced", "utils.py")
    assert "def data_parallel_workaround(model, *input):\n    return mgpu_runtime.data_parallel(model, input)\n" in result.output
    assert {d.code for d in result.diagnostics} == {"MGP107"}
    assert migrate_source(result.output, "balanced", "utils.py").output == result.output


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("output_device = device_ids[0]", "output_device = device_ids[1]"),  # gathered elsewhere
        ("list(range(torch.cuda.device_count()))", "[0, 1]"),  # chosen GPUs
        ("scatter(input, device_ids)", "scatter(input, device_ids, dim=1)"),  # another dimension
        ("parallel_apply(replicas, inputs)", "parallel_apply(replicas, inputs, kwargs)"),
        ("replicate(model, device_ids)", "replicate(model.module, device_ids)"),  # not its own argument
        ("return y_hat", "return y_hat.sum()"),
        ("y_hat = torch.nn.parallel.gather", "y_hat = torch.nn.parallel.gather(outputs, 0)\n    y_hat = my_gather"),
    ],
)
def test_any_other_replication_by_hand_is_left_with_mgp281(old, new):
    source = HELPER.replace(old, new)
    assert source != HELPER
    assert "MGP107" not in codes(source)
    assert "MGP281" in codes(source)


def test_under_ddp_it_calls_the_runtime_s_data_parallel_and_under_the_torch_style_it_is_left_with_mgp281():
    result = migrate_source(HELPER, "ddp", "utils.py")
    assert "    return mgpu_runtime.data_parallel(model, input)\n" in result.output
    assert {d.code for d in result.diagnostics} == {"MGP107"}
    assert migrate_source(result.output, "ddp", "utils.py").output == result.output
    torch_style = migrate_source(HELPER, "ddp", "utils.py", Options(style="torch"))
    assert {d.code for d in torch_style.diagnostics} == {"MGP281"} and torch_style.output == HELPER


def test_a_caller_in_another_module_is_not_told_to_replace_it(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "helpers.py").write_text(HELPER)
    train = "import torch.nn as nn\nfrom helpers import data_parallel_workaround\nmodel = nn.DataParallel(net)\ny = data_parallel_workaround(other, x)\n"
    (tmp_path / "train.py").write_text(train)
    balanced = migrate_source(train, "balanced", str(tmp_path / "train.py"))
    assert "MGP281" not in {d.code for d in balanced.diagnostics}
    ddp = migrate_source(train, "ddp", str(tmp_path / "train.py"))
    assert "MGP281" not in {d.code for d in ddp.diagnostics}
    torch_style = migrate_source(train, "ddp", str(tmp_path / "train.py"), Options(style="torch"))
    assert "MGP281" in {d.code for d in torch_style.diagnostics}


def test_a_caller_of_the_helper_is_the_program_s_wrap_under_ddp(tmp_path):
    """The call of the helper (in another module) is the script's wrap: set up at its entry point, its loader
    split, its save made once; the helper's module is no program of its own (its importers are not told to set
    up)."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "helpers.py").write_text(HELPER)
    train = textwrap.dedent(
        """\
        import torch
        from torch.utils.data import DataLoader
        from helpers import data_parallel_workaround

        loader = DataLoader(data, batch_size=8, shuffle=True)
        for x, y in loader:
            if torch.cuda.device_count() > 1:
                out = data_parallel_workaround(model, x)
            else:
                out = model(x)
            loss = criterion(out, y)
            loss.backward()
        torch.save(model.state_dict(), "model.pt")
        """
    )
    (tmp_path / "train.py").write_text(train)
    (tmp_path / "other.py").write_text("import helpers\n\nif __name__ == '__main__':\n    print(helpers)\n")
    ddp = migrate_source(train, "ddp", str(tmp_path / "train.py"))
    assert {"MGP120", "MGP122", "MGP123"} <= {d.code for d in ddp.diagnostics}
    assert "mgpu_runtime.distribute_loader(DataLoader(data, batch_size=8, shuffle=True))" in ddp.output
    other = migrate_source((tmp_path / "other.py").read_text(), "ddp", str(tmp_path / "other.py"))
    assert not other.changed and not other.diagnostics


def test_a_functional_model_broadcast_by_hand_is_left_with_mgp281(tmp_path):
    """attention-transfer's ``utils.data_parallel(f, input, params, mode, device_ids)``: a functional model whose
    parameters it broadcasts itself (``Broadcast.apply``) to run ``f`` per GPU with ``parallel_apply``. Called from
    another module, it said nothing on either target; it is DataParallel by hand, left with MGP281."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "utils.py").write_text(
        textwrap.dedent(
            """\
            from functools import partial
            from torch.nn.parallel._functions import Broadcast
            from torch.nn.parallel import scatter, parallel_apply, gather


            def data_parallel(f, input, params, mode, device_ids, output_device=None):
                device_ids = list(device_ids)
                params_all = Broadcast.apply(device_ids, *params.values())
                replicas = [partial(f, params=p, mode=mode) for p in params_all]
                outputs = parallel_apply(replicas, scatter([input], device_ids))
                return gather(outputs, output_device or device_ids[0])
            """
        )
    )
    train = "import utils\nfor x, y in loader:\n    utils.data_parallel(f, x, params, True, range(2)).sum().backward()\n"
    (tmp_path / "train.py").write_text(train)
    for target in ("balanced", "ddp"):
        result = migrate_source(train, target, str(tmp_path / "train.py"))
        said = [(d.code, d.message) for d in result.diagnostics]
        assert said == [
            ("MGP281", "`data_parallel` (utils.py:6) is DataParallel written by hand: not migrated; use nn.DataParallel instead, then run the tool again")
        ], said
        assert not result.changed
