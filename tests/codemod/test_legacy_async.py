"""MGP136: PyTorch 0.3's ``async=`` keyword, a syntax error from Python 3.7, renamed ``non_blocking=`` in a file
that is migrated (``mgpu_migrate/old_keywords.py``); every other file with it keeps its bytes."""

from __future__ import annotations

import textwrap

import pytest

from mgpu_migrate.engine import migrate_source
from tests.cli_helpers import run_cli

SCRIPT = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn

    model = nn.DataParallel(nn.Linear(4, 2))
    criterion = nn.CrossEntropyLoss()
    for x, y in loader:
        y = y.cuda(async=True)  # keep this comment
        loss = criterion(model(x.to('cuda', async=True)), y)
        loss.backward()
    """
)


def migrated(source: str, target: str = "ddp"):
    return migrate_source(source, target, "train.py")


@pytest.mark.parametrize("target", ["ddp", "balanced"])
def test_each_keyword_of_a_migrated_file_is_renamed_where_it_stood(target):
    result = migrated(SCRIPT, target)
    assert result.error is None
    assert "y = y.cuda(non_blocking=True)  # keep this comment\n" in result.output
    assert "model(x.to('cuda', non_blocking=True))" in result.output
    assert "async" not in result.output and "asyn0" not in result.output
    renamed = sorted((d.line, d.col) for d in result.diagnostics if d.code == "MGP136")
    # The columns are the original's: where `async` stands in the file as the user has it.
    lines = SCRIPT.splitlines()
    assert renamed == [(7, lines[6].index("async") + 1), (8, lines[7].index("async") + 1)] == [(7, 16), (8, 41)]
    assert migrated(result.output, target).output == result.output  # a second run changes nothing


def test_a_file_left_as_it_is_keeps_its_bytes_and_hears_of_no_rename():
    # A wrap with dim=1 has no DDP form: the --to ddp file is left, `async` and all.
    source = SCRIPT.replace("nn.Linear(4, 2))", "nn.Linear(4, 2), dim=1)")
    result = migrated(source)
    assert result.error is None and result.output == source
    assert "MGP201" in {d.code for d in result.diagnostics}
    assert "MGP136" not in {d.code for d in result.diagnostics}


def test_a_file_whose_only_change_would_be_the_rename_is_not_touched():
    source = "# nn.DataParallel was here\nimport torch\ny = y.cuda(async=True)\n"
    result = migrated(source, "balanced")
    assert result.error is None and result.output == source and result.diagnostics == []


@pytest.mark.parametrize(
    "line",
    [
        "def f(async=True):\n    pass\n",  # a parameter: not a keyword of the four methods
        "y = send(y, async=True)\n",  # another function's keyword
        "y = y.cuda(async=True)\nx = (\n",  # another syntax error besides
        "async = True\n",
    ],
)
def test_any_other_async_stays_the_syntax_error_it_is(line):
    source = "import torch.nn as nn\nmodel = nn.DataParallel(model)\n" + line
    result = migrated(source)
    assert result.error is not None and result.error.code == "MGP002"
    assert result.output == source


def test_a_rename_silenced_by_noqa_leaves_the_file_as_it_is():
    source = SCRIPT.replace("# keep this comment", "# noqa: MGP136")
    result = migrated(source)
    assert result.output == source
    assert result.error is not None and result.error.code == "MGP002"
    assert (result.error.line, result.error.col) == (7, 16)
    assert "reserved word" in result.error.message


def test_a_project_module_with_the_old_keyword_is_read(tmp_path):
    """The project reading parses the modules a script imports as the migration would: a helper that also
    holds `async=True` is still seen to write files (MGP132 guards its call)."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "helpers.py").write_text(
        "import torch\n\n\ndef to_gpu(x):\n    return x.cuda(async=True)\n\n\n"
        "def save_checkpoint(state, path):\n    torch.save(state, path)\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\nfrom helpers import save_checkpoint\n\n"
        "model = nn.DataParallel(nn.Linear(4, 2))\nloader = DataLoader(data, batch_size=4)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x, y in loader:\n"
        "    loss = model(x).sum()\n    loss.backward()\n    optimizer.step()\n"
        "save_checkpoint(model.state_dict(), 'model.pt')\n"
    )
    done = run_cli(str(tmp_path / "train.py"), "--to", "ddp", "--diff")
    said = done.stderr.decode()
    assert done.returncode == 1, said
    assert "MGP132" in said and "helpers.py:9" in said, said


def test_the_cli_writes_the_migration_and_a_second_run_changes_nothing(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    first = run_cli(str(script), "--to", "ddp")
    assert first.returncode == 0, first.stderr.decode()
    assert "MGP136" in first.stderr.decode()
    written = script.read_text()
    compile(written, str(script), "exec")  # Python parses it now
    second = run_cli(str(script), "--to", "ddp")
    assert second.returncode == 0 and script.read_text() == written
