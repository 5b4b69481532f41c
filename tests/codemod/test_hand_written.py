"""MGP107 matches torch's data_parallel written out by hand, and nothing else (``analysis/hand_written.py``)."""

from __future__ import annotations

import textwrap

import pytest

from mgpu_migrate.engine import migrate_source

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


def test_under_ddp_it_is_left_with_mgp281():
    assert codes(HELPER, "ddp") == {"MGP281"}


def test_a_caller_in_another_module_is_not_told_to_replace_it(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "helpers.py").write_text(HELPER)
    train = "import torch.nn as nn\nfrom helpers import data_parallel_workaround\nmodel = nn.DataParallel(net)\ny = data_parallel_workaround(other, x)\n"
    (tmp_path / "train.py").write_text(train)
    balanced = migrate_source(train, "balanced", str(tmp_path / "train.py"))
    assert "MGP281" not in {d.code for d in balanced.diagnostics}
    ddp = migrate_source(train, "ddp", str(tmp_path / "train.py"))
    assert "MGP281" in {d.code for d in ddp.diagnostics}
