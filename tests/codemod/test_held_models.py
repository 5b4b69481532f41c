"""A model a project class holds on ``self``, trained by subclasses in the modules importing it
(``analysis/held.py``, ``engine.held_programs``; st-gcn's ``IO`` → ``Processor`` → ``REC_Processor``).

The fixture projects ``held_model`` (migrated, run end to end in test_project_shapes_e2e.py) and
``held_model_left`` (MGP326) hold the goldens; these tests cover each way the program is left whole, every file
from its own point of view: the wrap file names the site (MGP320), the others are not changed.
"""

from __future__ import annotations

from pathlib import Path

from mgpu_migrate.engine import migrate_source
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS

BASE = """\
import torch.nn as nn


class Base:
    def __init__(self, args):
        self.model = nn.DataParallel(nn.Linear(5, 2))
"""
TRAINER = """\
import torch
from torch.utils.data import DataLoader

from processors.base import Base


class Trainer(Base):
    def start(self):
        loader = DataLoader(self.data, batch_size=8, shuffle=True)
        for x, y in loader:
            loss = (self.model(x) - y).pow(2).mean()
            loss.backward()
        torch.save(self.model.state_dict(), "model.pt")
"""
MAIN = """\
from processors.trainer import Trainer

if __name__ == "__main__":
    Trainer(None).start()
"""


def _project(tmp_path: Path, files: dict[str, str]) -> dict[str, object]:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "processors").mkdir()
    (tmp_path / "processors" / "__init__.py").write_text("")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return {name: migrate_source(text, "ddp", str(tmp_path / name)) for name, text in files.items()}


def _messages(result, code: str) -> list[str]:
    return [d.message for d in result.diagnostics if d.code == code]


def test_the_wrap_the_subclass_that_trains_and_the_script_migrate_together(tmp_path):
    results = _project(tmp_path, {"processors/base.py": BASE, "processors/trainer.py": TRAINER, "main.py": MAIN})
    assert all(result.changed for result in results.values())
    assert "mgpu_runtime.DistributedDataParallel(nn.Linear(5, 2))" in results["processors/base.py"].output
    trainer = results["processors/trainer.py"].output
    assert "mgpu_runtime.distribute_loader(DataLoader(self.data" in trainer and "mgpu_runtime.save(" in trainer
    assert "mgpu_runtime.setup()" not in trainer  # a module of classes: the script sets up
    assert "    mgpu_runtime.setup()\n    Trainer(None).start()" in results["main.py"].output


def test_a_loop_over_data_the_subclass_does_not_build_leaves_every_file(tmp_path):
    trainer = TRAINER.replace("loader = DataLoader(self.data, batch_size=8, shuffle=True)", "loader = self.loader")
    results = _project(tmp_path, {"processors/base.py": BASE, "processors/trainer.py": trainer, "main.py": MAIN})
    assert not any(result.changed for result in results.values())
    (message,) = _messages(results["processors/base.py"], "MGP320")
    assert "`Trainer` (trainer.py:7) trains it, and is left (trainer.py:10: MGP326)" in message


def test_a_subclass_that_only_evaluates_leaves_every_file(tmp_path):
    demo = "from processors.base import Base\n\n\nclass Demo(Base):\n    def start(self):\n        print(self.model(1))\n"
    files = {"processors/base.py": BASE, "processors/trainer.py": TRAINER, "processors/demo.py": demo, "main.py": MAIN}
    results = _project(tmp_path, files)
    assert not any(result.changed for result in results.values())
    (message,) = _messages(results["processors/base.py"], "MGP320")
    assert "`Demo` (demo.py:4) does not train it: every process would run it" in message


def test_a_class_in_between_migrates_with_the_holder_and_the_subclass_that_trains(tmp_path):
    """st-gcn's ``Processor(IO)``, between the holder and ``REC_Processor(Processor)``: followed, not a reason to leave."""
    middle = "from processors.base import Base\n\n\nclass Processor(Base):\n    pass\n"
    trainer = TRAINER.replace("from processors.base import Base", "from processors.middle import Processor").replace(
        "class Trainer(Base)", "class Trainer(Processor)"
    )
    files = {"processors/base.py": BASE, "processors/middle.py": middle, "processors/trainer.py": trainer, "main.py": MAIN}
    results = _project(tmp_path, files)
    assert "mgpu_runtime.DistributedDataParallel(nn.Linear(5, 2))" in results["processors/base.py"].output
    assert "mgpu_runtime.distribute_loader(DataLoader(self.data" in results["processors/trainer.py"].output
    assert "mgpu_runtime.setup()" in results["main.py"].output
    assert not results["processors/middle.py"].changed  # nothing of its own to make once
    assert not _messages(results["processors/base.py"], "MGP320")


MIDDLE_WITH_LOADERS = """\
import os

import torch
from torch.utils.data import DataLoader

from processors.base import Base


class Processor(Base):
    def load_data(self):
        self.data_loader = dict()
        self.data_loader["train"] = DataLoader(self.data, batch_size=8, shuffle=True)
        self.data_loader["test"] = DataLoader(self.data, batch_size=8)

    def start(self):
        for epoch in range(3):
            self.train()
            self.test()
            with open(os.path.join("work", "log.txt"), "a") as log:
                log.write(str(epoch))
"""
TRAINER_ON_ENTRIES = """\
from processors.middle import Processor


class Trainer(Processor):
    def train(self):
        loader = self.data_loader["train"]
        for x, y in loader:
            loss = (self.model(x) - y).pow(2).mean()
            loss.backward()

    def test(self):
        for x, y in self.data_loader["test"]:
            print(self.model(x).sum())
"""


def test_the_training_entry_of_a_dict_of_loaders_a_base_builds_is_split_where_it_is_read(tmp_path):
    files = {
        "processors/base.py": BASE,
        "processors/middle.py": MIDDLE_WITH_LOADERS,
        "processors/trainer.py": TRAINER_ON_ENTRIES,
        "main.py": MAIN,
    }
    results = _project(tmp_path, files)
    trainer = results["processors/trainer.py"]
    assert 'loader = mgpu_runtime.distribute_loader(self.data_loader["train"])' in trainer.output
    (whole,) = _messages(trainer, "MGP234")
    assert '`self.data_loader["test"]` left whole: every process evaluates all of it' in whole
    middle = results["processors/middle.py"].output  # the class in between: its log written once
    assert 'with mgpu_runtime.main_process_only(open, os.path.join("work", "log.txt"), "a") as log:' in middle


def test_an_entry_no_base_stores_is_not_split(tmp_path):
    middle = MIDDLE_WITH_LOADERS.replace("self.data_loader", "self.loaders")
    files = {"processors/base.py": BASE, "processors/middle.py": middle, "processors/trainer.py": TRAINER_ON_ENTRIES, "main.py": MAIN}
    results = _project(tmp_path, files)
    assert not any(result.changed for result in results.values())
    (message,) = _messages(results["processors/base.py"], "MGP320")
    assert "MGP326" in message


def test_a_class_named_by_its_dotted_path_is_started_by_the_script(tmp_path):
    """st-gcn's main.py: ``import_class('processor.recognition.REC_Processor')``."""
    main = (
        "import importlib\n\nif __name__ == '__main__':\n"
        "    importlib.import_module('processors.trainer').Trainer(None).start()\n"
    )
    results = _project(tmp_path, {"processors/base.py": BASE, "processors/trainer.py": TRAINER, "main.py": main})
    assert all(result.changed for result in results.values())
    assert "mgpu_runtime.setup()" in results["main.py"].output


def test_no_script_to_set_up_in_leaves_every_file(tmp_path):
    results = _project(tmp_path, {"processors/base.py": BASE, "processors/trainer.py": TRAINER})
    assert not any(result.changed for result in results.values())
    (message,) = _messages(results["processors/base.py"], "MGP320")
    assert "`Trainer` (trainer.py:7) trains it, and no script imports it: no place for the set-up" in message


def test_a_module_that_builds_the_class_itself_leaves_every_file(tmp_path):
    other = "from processors.base import Base\n\nmodel = Base(None).model\n"
    files = {"processors/base.py": BASE, "processors/trainer.py": TRAINER, "other.py": other, "main.py": MAIN}
    results = _project(tmp_path, files)
    assert not any(result.changed for result in results.values())
    (message,) = _messages(results["processors/base.py"], "MGP320")
    assert "other.py:1 uses `Base` itself" in message


def test_the_torch_style_keeps_the_wrap_file_left(tmp_path):
    _project(tmp_path, {"processors/base.py": BASE, "processors/trainer.py": TRAINER, "main.py": MAIN})
    for name in ("processors/base.py", "processors/trainer.py", "main.py"):
        text = (tmp_path / name).read_text()
        result = migrate_source(text, "ddp", str(tmp_path / name), TORCH_OPTIONS)
        assert not result.changed, name
    base = migrate_source(BASE, "ddp", str(tmp_path / "processors/base.py"), TORCH_OPTIONS)
    assert [d.code for d in base.diagnostics] == ["MGP320"]


def test_a_second_run_changes_nothing(tmp_path):
    results = _project(tmp_path, {"processors/base.py": BASE, "processors/trainer.py": TRAINER, "main.py": MAIN})
    for name, result in results.items():
        (tmp_path / name).write_text(result.output)
    for name in results:
        text = (tmp_path / name).read_text()
        assert not migrate_source(text, "ddp", str(tmp_path / name)).changed, name
