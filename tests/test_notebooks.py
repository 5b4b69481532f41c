"""Jupyter notebooks: code cells migrated as one program, everything else kept, positions as cell:line:col."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import jsonschema
import pytest

from tests.cli_helpers import run_cli
from tests.fixture_cases import ROOT

SETUP_CELL = ["%matplotlib inline\n", "import torch\n", "import torch.nn as nn\n", "!echo installing"]
TRAIN_CELL = [
    "torch.manual_seed(0)\n",
    "model = nn.Linear(4, 2)\n",
    "model = nn.DataParallel(model)\n",
    "criterion = nn.MSELoss()\n",
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
    "for step in range(3):\n",
    "    x, y = torch.randn(6, 4), torch.randn(6, 2)\n",
    "    loss = criterion(model(x), y)\n",
    "    optimizer.zero_grad()\n",
    "    loss.backward()\n",
    "    optimizer.step()\n",
    "%time model(torch.ones(1, 4))\n",
    "print('weights', model.module.weight.sum().item())",
]
BASH_CELL = ["%%bash\n", "echo nn.DataParallel stays as it is\n"]


def notebook() -> dict:
    return {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# Training with `nn.DataParallel` (é)\n"]},
            {
                "cell_type": "code",
                "execution_count": 1,
                "metadata": {"tags": ["setup"]},
                "outputs": [{"name": "stdout", "output_type": "stream", "text": ["installing\n"]}],
                "source": SETUP_CELL,
            },
            {"cell_type": "code", "execution_count": 2, "metadata": {}, "outputs": [], "source": BASH_CELL},
            {"cell_type": "code", "execution_count": 3, "metadata": {"collapsed": False}, "outputs": [], "source": TRAIN_CELL},
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def write_notebook(path, content: dict) -> None:
    # As Jupyter writes it: one space of indent, non-ASCII kept, a final newline.
    path.write_text(json.dumps(content, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def test_round_trip_keeps_all_but_the_code_and_is_idempotent(tmp_path):
    path = tmp_path / "train.ipynb"
    write_notebook(path, notebook())
    result = run_cli(".", "--to", "balanced", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    after = json.loads(path.read_text(encoding="utf-8"))
    before = notebook()
    # Only the code cells' sources changed; the cell magic's cell, outputs, metadata and layout are kept.
    for old, new in zip(before["cells"], after["cells"]):
        assert {k: v for k, v in old.items() if k != "source"} == {k: v for k, v in new.items() if k != "source"}
    assert after["metadata"] == before["metadata"] and after["cells"][0] == before["cells"][0]
    assert after["cells"][2] == before["cells"][2]
    setup, train = after["cells"][1]["source"], after["cells"][3]["source"]
    # The kernel installs the runtime it now imports, above the import, once.
    assert setup == ["%pip install mgpu-runtime\n", "import mgpu_runtime\n", *SETUP_CELL]
    assert "model = mgpu_runtime.DataParallelModel(model)\n" in train
    assert "%time model(torch.ones(1, 4))\n" in train and train[-1] == TRAIN_CELL[-1]
    text = path.read_text(encoding="utf-8")
    assert text.startswith('{\n "cells": [\n') and "(é)" in text and text.endswith("}\n")
    # Diagnostics name the cell and the line within it, in the notebook as written.
    (line,) = [line for line in result.stderr.decode().splitlines() if "MGP101" in line]
    assert line.startswith("train.ipynb:cell 4:3:9: MGP101 ")
    assert train[2].startswith("model = mgpu_runtime.DataParallelModel")
    # A second run changes nothing.
    again = run_cli("train.ipynb", "--to", "balanced", "--check", cwd=tmp_path)
    assert again.returncode == 0 and path.read_text(encoding="utf-8") == text


def test_untouched_notebooks_are_byte_identical_and_bad_ones_fail(tmp_path):
    plain = copy.deepcopy(notebook())
    plain["cells"][3]["source"] = ["print('no wrapper here')"]
    write_notebook(tmp_path / "plain.ipynb", plain)
    before = (tmp_path / "plain.ipynb").read_bytes()
    (tmp_path / "broken.ipynb").write_text('{"cells": [ "DataParallel"')
    result = run_cli(".", "--to", "ddp", cwd=tmp_path)
    assert result.returncode == 2
    assert (tmp_path / "plain.ipynb").read_bytes() == before
    assert b"broken.ipynb:1:1: MGP001 cannot read: not a Jupyter notebook" in result.stderr
    assert (tmp_path / "broken.ipynb").read_text() == '{"cells": [ "DataParallel"'


def _with_train_source(source) -> dict:
    content = copy.deepcopy(notebook())
    content["cells"][3]["source"] = source
    return content


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (json.dumps(_with_train_source(5)), "the source of cell 4 is neither a string nor a list of strings"),
        (json.dumps(_with_train_source([*TRAIN_CELL, 3])), "the source of cell 4 is neither a string nor a list"),
        (json.dumps(_with_train_source({"text": TRAIN_CELL})), "the source of cell 4 is neither a string nor a list"),
        ('{"cells": [], "nested": ' + "[" * 100_000 + "]" * 100_000 + ', "x": "DataParallel"}', "JSON nested too deeply"),
        (json.dumps({**notebook(), "cells": [*notebook()["cells"], "DataParallel"]}), "cell 5 is no object"),
    ],
    ids=["number", "list-with-a-number", "object", "deep", "cell-not-an-object"],
)
def test_a_malformed_notebook_fails_alone_with_one_line_and_the_run_goes_on(tmp_path, text, reason):
    """Each used to stop the whole run with a traceback (AttributeError, TypeError, RecursionError), exit 1."""
    (tmp_path / "bad.ipynb").write_text(text)
    write_notebook(tmp_path / "good.ipynb", notebook())
    result = run_cli("bad.ipynb", "good.ipynb", "--to", "ddp", cwd=tmp_path)
    assert result.returncode == 2 and b"Traceback" not in result.stderr
    assert f"bad.ipynb:1:1: MGP001 cannot read: not a Jupyter notebook ({reason}".encode() in result.stderr
    assert b"1 file migrated to ddp, 0 unchanged, 1 failed" in result.stderr
    assert (tmp_path / "bad.ipynb").read_text() == text


def test_notebook_diff_applies_and_json_names_the_cell(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    write_notebook(tmp_path / "train.ipynb", notebook())
    diff = run_cli("train.ipynb", "--to", "balanced", "--diff", cwd=tmp_path)
    assert diff.returncode == 1
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=diff.stdout, check=True)
    assert "DataParallelModel" in (tmp_path / "train.ipynb").read_text()
    write_notebook(tmp_path / "train.ipynb", notebook())
    report = json.loads(run_cli("train.ipynb", "--to", "balanced", "--check", "--show-rewrites", "--output-format", "json", cwd=tmp_path).stdout)
    schema = json.loads((ROOT / "mgpu_migrate" / "schemas" / "report-v1.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(report)
    (entry,) = [d for d in report["diagnostics"] if d["code"] == "MGP101"]
    assert (entry["path"], entry["cell"], entry["line"], entry["column"]) == ("train.ipynb", 4, 3, 9)


def _kernel_code(path) -> str:
    """The code cells, in order, as a kernel would run them (magics aside), in float64."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    lines = [
        line
        for cell in cells
        if cell["cell_type"] == "code" and not cell["source"][0].startswith("%%")
        for line in "".join(cell["source"]).splitlines(keepends=True)
        if not line.lstrip().startswith(("%", "!"))
    ]
    return "import torch\ntorch.set_default_dtype(torch.float64)\n" + "".join(lines)


@pytest.mark.slow
def test_migrated_notebook_trains_as_the_original_under_dataparallel_on_as_many_devices(tmp_path):
    """The reference is the original's cells under the emulated DataParallel on 2 and 3 devices; the migration
    runs on as many CPU replicas (which a kernel gets from MGPU_CPU_REPLICAS), both in float64."""
    original = tmp_path / "original.ipynb"
    write_notebook(original, notebook())
    write_notebook(tmp_path / "train.ipynb", notebook())
    assert run_cli("train.ipynb", "--to", "balanced", cwd=tmp_path).returncode == 0
    (tmp_path / "original_kernel.py").write_text(_kernel_code(original))
    (tmp_path / "migrated_kernel.py").write_text(_kernel_code(tmp_path / "train.ipynb"))

    runs = [("original_kernel.py", devices, None) for devices in (2, 3)]
    runs += [("migrated_kernel.py", None, replicas) for replicas in (2, 3)]
    ran = subprocess.run([sys.executable, "-c", _KERNELS_IN_TURN, json.dumps(runs)], capture_output=True, text=True, check=False,
                         timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    on_two, on_three, migrated_on_two, migrated_on_three = map(float, ran.stdout.split())
    assert [migrated_on_two, migrated_on_three] == [pytest.approx(on_two, abs=1e-9), pytest.approx(on_three, abs=1e-9)]


# Runs each (kernel code's file, emulated devices, MGPU_CPU_REPLICAS) of the JSON list in argv[1] in turn in one
# interpreter (torch imported once), each as a new kernel would run it (runner.run: fresh globals), and prints
# the last word each printed. The runtime reads MGPU_CPU_REPLICAS at import and for each wrapper: asked again.
_KERNELS_IN_TURN = """
import contextlib, io, json, os, sys
from mgpu_runtime.balanced import devices
from mgpu_runtime.emulation import runner

for code, emulated, replicas in json.loads(sys.argv[1]):
    os.environ.pop("MGPU_CPU_REPLICAS", None)
    if replicas:
        os.environ["MGPU_CPU_REPLICAS"] = str(replicas)
    devices.emulate_cpu_replicas()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        runner.run(code, devices=emulated, float64=True)
    print(printed.getvalue().split()[-1])
"""


def test_the_install_line_comes_once_and_not_over_the_notebooks_own(tmp_path):
    own = copy.deepcopy(notebook())
    own["cells"][1]["source"] = ["!pip install -q mgpu-runtime torch\n", *SETUP_CELL]
    write_notebook(tmp_path / "own.ipynb", own)
    write_notebook(tmp_path / "train.ipynb", notebook())
    assert run_cli(".", "--to", "ddp", cwd=tmp_path).returncode == 0
    sources = {name: ["".join(cell["source"]) for cell in json.loads((tmp_path / name).read_text(encoding="utf-8"))["cells"]]
               for name in ("own.ipynb", "train.ipynb")}
    assert sum(text.count("pip install") for text in sources["own.ipynb"]) == 1
    first_code = sources["train.ipynb"][1]
    assert first_code.startswith("%pip install mgpu-runtime\nimport mgpu_runtime\n")
    # Migrating again adds nothing.
    assert run_cli("train.ipynb", "--to", "ddp", cwd=tmp_path).returncode == 0
    again = ["".join(cell["source"]) for cell in json.loads((tmp_path / "train.ipynb").read_text(encoding="utf-8"))["cells"]]
    assert sum(text.count("%pip install mgpu-runtime") for text in again) == 1
