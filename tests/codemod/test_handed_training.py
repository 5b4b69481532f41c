"""A model wrapped in one module and trained by the project's code in another (``analysis/handed.py``, issue 23).

The fixture projects ``trainer_class`` and ``train_function`` hold the real projects' shapes, with their goldens
(tests/codemod/test_fixtures.py) and their runs (test_handed_training_e2e.py); these tests cover what each shape
of the training code gives: which sites there leave the file (MGP323), which data is not followed (MGP285),
where the loader is split, and the torch style.
"""

from __future__ import annotations


import pytest

from mgpu_migrate.engine import migrate_source
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS
from tests.fixture_cases import FIXTURES

TRAINER_CLASS = FIXTURES / "projects" / "trainer_class"

SCRIPT = """\
import torch.nn as nn
from torch.utils.data import DataLoader

from trainers import train_epoch

model = nn.DataParallel(net)
loader = DataLoader(train_set, batch_size=8, shuffle=True)
for epoch in range(3):
    train_epoch(loader, model, optimizer)
"""
LOOP = """\
def train_epoch(loader, model, optimizer):
    for x, y in loader:
        {step}
        loss = (model(x) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def _project(tmp_path, trainers: str, script: str = SCRIPT):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "trainers.py").write_text(trainers)
    path = tmp_path / "train.py"
    path.write_text(script)
    return migrate_source(script, "ddp", str(path))


def _codes(result) -> list[str]:
    return [diagnostic.code for diagnostic in result.diagnostics]


def test_a_loop_over_a_parameter_migrates_and_splits_the_loader_here(tmp_path):
    result = _project(tmp_path, LOOP.format(step="pass"))
    assert result.changed and "MGP122" in _codes(result) and "MGP285" not in _codes(result)
    assert "loader = mgpu_runtime.distribute_loader(DataLoader(train_set, batch_size=8, shuffle=True))" in result.output
    (split,) = [d for d in result.diagnostics if d.code == "MGP122"]
    assert split.line == 7 and "(its loop: `train_epoch`, trainers.py:2)" in split.message


@pytest.mark.parametrize(
    ("step", "named"),
    [
        ("torch.distributed.all_reduce(x)", "`torch.distributed.all_reduce(...)` is a distributed call of its own"),
        ("x = x.cuda(1)", "`x.cuda(1)` names a GPU every process would use"),
        ("y = y.to('cuda:1')", "`'cuda:1'` names a GPU every process would use"),
        ("assert isinstance(model, torch.nn.DataParallel)", "`torch.nn.DataParallel` names torch's DataParallel"),
        ("os.makedirs('runs')", "`os.makedirs` makes or deletes directories on every process"),
        ("torch.save(model.state_dict(), 'last.pt')", "`torch.save` writes files on every process"),
        ("log_step(x)", "`log_step(...)` writes files on every process"),
    ],
)
def test_a_site_of_the_training_code_that_needs_a_change_leaves_the_file_naming_it(tmp_path, step, named):
    helper = "def log_step(x):\n    with open('steps.txt', 'a') as f:\n        f.write(str(x))\n\n\n"
    result = _project(tmp_path, "import os\nimport torch\n\n\n" + helper + LOOP.format(step=step))
    assert not result.changed and _codes(result) == ["MGP323"]
    (left,) = result.diagnostics
    assert left.line == 6 and named in left.message and "(trainers.py:12)" in left.message, left.message


def test_an_error_caught_around_the_step_leaves_the_file(tmp_path):
    loop = LOOP.format(step="pass").replace("        loss.backward()", "        try:\n            loss.backward()\n        except RuntimeError:\n            continue")
    result = _project(tmp_path, loop)
    assert _codes(result) == ["MGP323"] and "each process skip it alone (trainers.py:6)" in result.diagnostics[0].message


def test_a_loader_the_script_also_evaluates_on_is_split_where_it_is_handed_over(tmp_path):
    """Its evaluation loop here keeps the loader whole; the training code gets the split one."""
    script = SCRIPT + "    for x, y in loader:\n        print(model(x).sum().item())\n"
    result = _project(tmp_path, LOOP.format(step="pass"), script)
    assert "    train_epoch(mgpu_runtime.distribute_loader(loader), model, optimizer)" in result.output
    assert "loader = DataLoader(train_set, batch_size=8, shuffle=True)" in result.output


def test_data_not_followed_to_a_loader_leaves_the_file(tmp_path):
    script = SCRIPT.replace("train_epoch(loader, model, optimizer)", "train_epoch(loaders['train'], model, optimizer)")
    result = _project(tmp_path, LOOP.format(step="pass"), script)
    assert _codes(result) == ["MGP285"]
    assert "its data, `loaders['train']` here, is not followed to a loader (train.py:9)" in result.diagnostics[0].message


def test_a_loop_that_is_not_around_the_backward_pass_leaves_the_file(tmp_path):
    trainers = "def train_epoch(batch, model, optimizer):\n    model(batch).mean().backward()\n    optimizer.step()\n"
    result = _project(tmp_path, trainers)
    assert _codes(result) == ["MGP285"] and "no `for` loop runs around its backward pass" in result.diagnostics[0].message


def test_every_wrap_the_file_keeps_is_named(tmp_path):
    script = SCRIPT.replace("model = nn.DataParallel(net)", "model = nn.DataParallel(net)\nteacher = nn.DataParallel(other)")
    result = _project(tmp_path, LOOP.format(step="x = x.cuda(1)"), script)
    assert [(d.line, d.code) for d in result.diagnostics] == [(6, "MGP323"), (7, "MGP323")]
    assert "kept as DataParallel: the model of line 10 is trained in `train_epoch`" in result.diagnostics[1].message


def test_the_torch_style_leaves_the_file():
    """Plain DDP keeps the loop's values each process's own, in a module the tool does not check."""
    path = TRAINER_CLASS / "train.py"
    result = migrate_source(path.read_text(), "ddp", str(path), TORCH_OPTIONS)
    assert not result.changed and _codes(result) == ["MGP285"] and "(--style torch)" in result.diagnostics[0].message


def test_a_method_of_a_base_class_reaches_the_subclass_methods_it_calls():
    """``BaseTrainer.train`` calls ``self._parse_data``: the pinned trainer's own, which picks `cuda:0`."""
    path = TRAINER_CLASS / "train_pinned.py"
    result = migrate_source(path.read_text(), "ddp", str(path))
    assert _codes(result) == ["MGP323"] and "(lib/trainers.py:66)" in result.diagnostics[0].message


def test_text_that_is_no_file_reads_no_training_code():
    """Text that is no file reads no project: its training code is unknown, so its loader is not split."""
    source = (TRAINER_CLASS / "train.py").read_text()
    result = migrate_source(source, "ddp", "<stdin>")
    assert "distribute_loader" not in result.output and "MGP262" in _codes(result)


def test_a_loop_one_method_call_deeper_is_named_where_it_is(tmp_path):
    """Conv-TasNet's Solver: the script calls `solver.train()`, whose `for epoch in range(...)` only counts, and
    `self._run_one_epoch()` holds the loop over the data with the backward pass. The file is left (the tool reads a
    loop's data in the methods the script calls), and the reason says where the loop is, not that there is none."""
    trainers = """\
class Solver:
    def __init__(self, data, model, optimizer):
        self.tr_loader = data["tr_loader"]
        self.model = model
        self.optimizer = optimizer

    def train(self):
        for epoch in range(3):
            self._run_one_epoch(epoch)

    def _run_one_epoch(self, epoch):
        for x, y in self.tr_loader:
            loss = (self.model(x) - y).pow(2).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
"""
    script = """\
import torch.nn as nn
from torch.utils.data import DataLoader

from trainers import Solver

model = nn.DataParallel(net)
solver = Solver({"tr_loader": DataLoader(train_set, batch_size=8)}, model, optimizer)
solver.train()
"""
    result = _project(tmp_path, trainers, script)
    (left,) = [d for d in result.diagnostics if d.code == "MGP285"]
    assert "its loop is in `_run_one_epoch`, which `train` calls" in left.message and "(trainers.py:12)" in left.message
    assert not result.changed
