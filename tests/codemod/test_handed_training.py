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
    ],
)
def test_a_site_of_the_training_code_that_needs_a_change_leaves_the_file_naming_it(tmp_path, step, named):
    helper = "def log_step(x):\n    with open('steps.txt', 'a') as f:\n        f.write(str(x))\n\n\n"
    result = _project(tmp_path, "import os\nimport torch\n\n\n" + helper + LOOP.format(step=step))
    assert not result.changed and _codes(result) == ["MGP323"]
    (left,) = result.diagnostics
    assert left.line == 6 and named in left.message and "(trainers.py:12)" in left.message, left.message
    trainers = tmp_path / "trainers.py"
    if "DataParallel" not in step:  # a module that names DataParallel is migrated on its own (MGP126)
        assert not migrate_source(trainers.read_text(), "ddp", str(trainers)).changed  # nor is the training code


@pytest.mark.parametrize(
    ("step", "made_once", "written"),
    [
        ("os.makedirs('runs')", "MGP133", "if mgpu_runtime.is_main_process():\n        os.makedirs('runs')"),
        ("torch.save(model.state_dict(), 'last.pt')", "MGP123", "mgpu_runtime.save(model.state_dict(), 'last.pt')"),
        ("log_step(x)", "MGP134", "with mgpu_runtime.main_process_only(open, 'steps.txt', 'a') as f:"),
    ],
)
def test_a_write_of_the_training_code_is_made_once_there_and_both_migrate(tmp_path, step, made_once, written):
    """The training code's module runs on every process of the script's program: it migrates with the script
    (Program.handed), its writes made once there, whichever of the two is migrated first."""
    helper = "def log_step(x):\n    with open('steps.txt', 'a') as f:\n        f.write(str(x))\n\n\n"
    loop = LOOP.format(step="pass").replace("    for x, y in loader:", f"    {step}\n    for x, y in loader:")
    result = _project(tmp_path, "import os\nimport torch\n\n\n" + helper + loop)
    assert result.changed and "MGP323" not in _codes(result) and "MGP122" in _codes(result)
    trainers = tmp_path / "trainers.py"
    handed = migrate_source(trainers.read_text(), "ddp", str(trainers))
    assert handed.changed and made_once in _codes(handed) and written in handed.output, handed.output


def test_the_training_code_of_a_script_that_is_left_is_left_too(tmp_path):
    """A script left (its data not followed) runs as one process: its training code's module is not migrated."""
    script = SCRIPT.replace("train_epoch(loader, model, optimizer)", "train_epoch(loaders['train'], model, optimizer)")
    result = _project(tmp_path, "import torch\n\n\n" + LOOP.format(step="torch.save(x, 'x.pt')"), script)
    assert not result.changed
    trainers = tmp_path / "trainers.py"
    assert not migrate_source(trainers.read_text(), "ddp", str(trainers)).changed


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


def test_a_loop_one_method_call_deeper_is_followed(tmp_path):
    """Conv-TasNet's Solver: the script calls `solver.train()`, whose `for epoch in range(...)` only counts, and
    `self._run_one_epoch()` holds the loop over the data with the backward pass. Its data is `self.tr_loader` or
    `self.cv_loader`, by a flag, which `__init__` takes from a dict of loaders the script builds: both loaders are
    split where they are built."""
    trainers = """\
class Solver:
    def __init__(self, data, model, optimizer):
        self.tr_loader = data["tr_loader"]
        self.cv_loader = data["cv_loader"]
        self.model = model
        self.optimizer = optimizer

    def train(self):
        for epoch in range(3):
            self._run_one_epoch(epoch)
            self._run_one_epoch(epoch, cross_valid=True)

    def _run_one_epoch(self, epoch, cross_valid=False):
        data_loader = self.tr_loader if not cross_valid else self.cv_loader
        for x, y in data_loader:
            loss = (self.model(x) - y).pow(2).mean()
            if not cross_valid:
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
"""
    script = """\
import torch.nn as nn
from torch.utils.data import DataLoader

from trainers import Solver

model = nn.DataParallel(net)
tr_loader = DataLoader(train_set, batch_size=8)
cv_loader = DataLoader(valid_set, batch_size=8)
data = {"tr_loader": tr_loader, "cv_loader": cv_loader}
solver = Solver(data, model, optimizer)
solver.train()
"""
    result = _project(tmp_path, trainers, script)
    assert result.changed and "MGP285" not in _codes(result), result.diagnostics
    assert "tr_loader = mgpu_runtime.distribute_loader(DataLoader(train_set, batch_size=8))" in result.output
    assert "cv_loader = mgpu_runtime.distribute_loader(DataLoader(valid_set, batch_size=8))" in result.output
    (split, _) = [d for d in result.diagnostics if d.code == "MGP122"]
    assert "(its loop: `Solver`, trainers.py:15)" in split.message, split.message


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (("data = {", "data['tr_loader'] = other\ndata = {"), "an entry of `data` not followed here"),
        (("data_loader = self", "data_loader = None\n        data_loader = self"), "`data_loader` is no parameter"),
    ],
)
def test_data_a_deeper_loop_draws_that_is_not_followed_leaves_the_file(tmp_path, change, why):
    """A dict the script also stores into by key, or a local bound twice: not followed, left (MGP285)."""
    trainers = """\
class Solver:
    def __init__(self, data, model):
        self.tr_loader = data["tr_loader"]
        self.model = model

    def train(self):
        for epoch in range(3):
            self._run_one_epoch(epoch)

    def _run_one_epoch(self, epoch):
        data_loader = self.tr_loader
        for x in data_loader:
            self.model(x).sum().backward()
"""
    script = """\
import torch.nn as nn
from torch.utils.data import DataLoader

from trainers import Solver

model = nn.DataParallel(net)
data = {"tr_loader": DataLoader(train_set, batch_size=8)}
Solver(data, model).train()
"""
    if change[0] == "data = {":
        script = script.replace(*change)
    else:
        trainers = trainers.replace(*change)
    result = _project(tmp_path, trainers, script)
    assert not result.changed and _codes(result) == ["MGP285"] and why in result.diagnostics[0].message, result.diagnostics

PHASES_LOOP = """\
def train_model(model, dataloaders, optimizer):
    for phase in ['train', 'val']:
        for x, y in dataloaders[phase]:
            loss = (model(x) - y).pow(2).mean()
            if phase == 'train':
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
"""
PHASES_SCRIPT = """\
import torch.nn as nn

from builders import generate_data
from trainers import train_model

dataloaders, sizes = generate_data(8)
model = nn.DataParallel(net)
train_model(model, dataloaders, optimizer)
"""


@pytest.mark.parametrize(
    "built, split",
    [
        # pytorch_classifiers' generate_data: a comprehension of loaders, returned with the sizes
        ("loaders = {p: DataLoader(sets[p], batch_size=b, shuffle=True) for p in ['train', 'val']}", True),
        ("loaders = {'train': DataLoader(sets['train'], batch_size=b), 'val': DataLoader(sets['val'], batch_size=b)}", True),
        # a dict one of whose entries is no loader (an iterable of the project's): not followed
        ("loaders = {'train': DataLoader(sets['train'], batch_size=b), 'val': Batches(sets['val'])}", False),
        ("loaders = {p: Batches(sets[p]) for p in ['train', 'val']}", False),
    ],
)
def test_a_dict_of_loaders_a_builder_returns_is_split_loader_by_loader(tmp_path, built, split):
    (tmp_path / "builders.py").write_text(
        f"from torch.utils.data import DataLoader\n\n\ndef generate_data(b):\n    {built}\n    return loaders, {{'train': 1}}\n"
    )
    result = _project(tmp_path, PHASES_LOOP, PHASES_SCRIPT)
    if split:
        assert "train_model(model, mgpu_runtime.distribute_loaders(dataloaders), optimizer)" in result.output
        (message,) = [d.message for d in result.diagnostics if d.code == "MGP122"]
        assert "split loader by loader (`dataloaders` of `generate_data`, builders.py:5)" in message
    else:
        assert not result.changed and "MGP285" in _codes(result) and "distribute_loaders" not in result.output


def test_a_loop_over_the_keys_of_a_built_dict_of_loaders_is_no_loop_over_a_loader(tmp_path):
    """The dict itself is no loader: the loop over its keys is not given to distribute_loader."""
    (tmp_path / "builders.py").write_text(
        "from torch.utils.data import DataLoader\n\n\ndef generate_data(b):\n"
        "    loaders = {p: DataLoader(sets[p], batch_size=b) for p in ['train', 'val']}\n    return loaders, {}\n"
    )
    script = (
        "import torch.nn as nn\n\nfrom builders import generate_data\n\n"
        "dataloaders, sizes = generate_data(8)\nmodel = nn.DataParallel(net)\n"
        "for phase in dataloaders:\n    loss = model(phase).sum()\n    loss.backward()\n"
    )
    result = _project(tmp_path, "", script)
    assert "distribute_loader(dataloaders" not in result.output and "distribute_loaders(dataloaders" not in result.output


@pytest.mark.parametrize("handed", [True, False])
def test_a_transform_a_builder_makes_that_draws_per_sample_loads_whole_batches(tmp_path, handed):
    """pytorch_classifiers' generate_data builds torchvision's RandomResizedCrop for its datasets: the original drew
    it for each sample of the whole batch, in its one process, so every process loads whole batches; the loader
    given back alone, or in a dict handed over."""
    built = "{p: DataLoader(sets[p], batch_size=b, shuffle=True) for p in ['train', 'val']}, {}"
    (tmp_path / "builders.py").write_text(
        "from torch.utils.data import DataLoader\nfrom torchvision import datasets, transforms\n\n\n"
        "def generate_data(b):\n"
        "    crop = transforms.Compose([transforms.RandomResizedCrop(4), transforms.ToTensor()])\n"
        "    sets = {p: datasets.ImageFolder(p, crop) for p in ['train', 'val']}\n"
        f"    return {built if handed else 'DataLoader(sets[0], batch_size=b, shuffle=True)'}\n"
    )
    if handed:
        result = _project(tmp_path, PHASES_LOOP, PHASES_SCRIPT)
        assert "mgpu_runtime.distribute_loaders(dataloaders, whole_batches=True)" in result.output
    else:
        script = (
            "import torch.nn as nn\n\nfrom builders import generate_data\n\n"
            "loader = generate_data(8)\nmodel = nn.DataParallel(net)\n"
            "for x, y in loader:\n    loss = (model(x) - y).pow(2).mean()\n    loss.backward()\n"
        )
        result = _project(tmp_path, "", script)
        assert "loader = mgpu_runtime.distribute_loader(generate_data(8), whole_batches=True)" in result.output
    (message,) = [d.message for d in result.diagnostics if d.code == "MGP122"]
    assert "whole batches, builders.py:6 draws per sample" in message


SAVER = """\
import glob
import os

import torch


class Saver(object):
    def __init__(self, name):
        runs = sorted(glob.glob(os.path.join('run', name, 'experiment_*')))
        self.experiment_dir = os.path.join('run', name, 'experiment_{}'.format(len(runs)))
        os.makedirs(self.experiment_dir)

    def save_checkpoint(self, state):
        torch.save(state, os.path.join(self.experiment_dir, 'checkpoint.pth'))
"""
TRAINER = """\
import torch.nn as nn

from saver import Saver


class Trainer(object):
    def __init__(self, net, loader):
        self.saver = Saver('deeplab')
        self.model = nn.DataParallel(net)
        self.loader = loader

    def training(self):
        for x, y in self.loader:
            loss = (self.model(x) - y).pow(2).mean()
            loss.backward()
        self.saver.save_checkpoint({'log': self.saver.experiment_dir})
"""


@pytest.mark.parametrize("reached_elsewhere", [False, True])
def test_a_project_object_whose_writing_methods_go_to_the_main_process_is_built_there_and_copied(tmp_path, reached_elsewhere):
    """deeplab's Saver: its constructor makes the run's next directory, its save_checkpoint writes, called here only
    as a statement of its own (on the main process then): built on the main process and copied. Where another module
    imports the class that holds it (and may call `trainer.saver.save_checkpoint(...)` on every process), said."""
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "saver.py").write_text(SAVER)
    if reached_elsewhere:
        (tmp_path / "main.py").write_text("from trainer import Trainer\n\nTrainer(net, loader).training()\n")
    path = tmp_path / "trainer.py"
    path.write_text(TRAINER)
    result = migrate_source(TRAINER, "ddp", str(path))
    (made,) = [d for d in result.diagnostics if d.line == 8]
    if reached_elsewhere:
        assert made.code == "MGP322" and "its method `save_checkpoint` writes too" in made.message
    else:
        assert made.code == "MGP132" and "copied to every process" in made.message
        assert "self.saver = mgpu_runtime.main_process_value(Saver, 'deeplab')" in result.output
