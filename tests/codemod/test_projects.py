"""Project reading: what a file imports from the project's own modules, as a user's runs see it.

The golden outputs of ``fixtures/projects/`` are checked with every other fixture (tests/codemod/test_fixtures.py);
these tests cover how a project is found and read: a pre-commit run that passes only the changed files, text
that is no file, modules that cannot be parsed, and that each module is read once per run.
"""

from __future__ import annotations

import os
import shutil

import pytest

from mgpu_migrate.analysis import project
from mgpu_migrate.diagnostics import error_summary
from mgpu_migrate.engine import migrate_source
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS
from tests.cli_helpers import run_cli
from tests.fixture_cases import FIXTURES

REID = FIXTURES / "projects" / "reid"
TRAINER_CLASS = FIXTURES / "projects" / "trainer_class"


def codes(result) -> list[str]:
    return [diagnostic.code for diagnostic in result.diagnostics]


def test_only_the_changed_file_is_passed(tmp_path):
    """pre-commit passes the changed files only: the trainer in lib/ is still read (never rewritten), so the script
    whose loader reaches the trainer's loop is migrated, and the one whose trainer picks its loader from a dict is
    left, naming the trainer's line."""
    copy = tmp_path / "trainer_class"
    shutil.copytree(TRAINER_CLASS, copy, ignore=shutil.ignore_patterns("*.ddp.*", "*.balanced.*"))
    before = {name: (copy / name).read_bytes() for name in ("train_loaders.py", "lib/trainers.py")}
    done = run_cli("train.py", "train_loaders.py", "--to", "ddp", cwd=copy)
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    assert "MGP122" in stderr and "(its loop: `Trainer`, lib/trainers.py:22)" in stderr
    assert (copy / "train.py").read_text() == (TRAINER_CLASS / "train.ddp.py").read_text()
    assert "train_loaders.py:11:13: MGP285" in stderr and "(lib/trainers.py:78)" in stderr
    assert {name: (copy / name).read_bytes() for name in before} == before


def test_text_that_is_no_file_reads_no_project():
    source = (REID / "detect.py").read_text()
    result = migrate_source(source, "ddp", "<stdin>")
    assert "MGP280" not in codes(result)
    assert project.project_of("<stdin>") is None


def test_a_module_that_does_not_parse_is_unknown(tmp_path):
    """A Python 2 module in the project (as in several real ones) tells nothing; the file is still migrated."""
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "legacy.py").write_text("print 'python 2'\nclass Wrapper(object): pass\n")
    script = tmp_path / "train.py"
    script.write_text("import torch.nn as nn\nfrom legacy import Wrapper\n\nmodel = Wrapper(nn.DataParallel(net))\nmodel(x).sum().backward()\n")
    result = migrate_source(script.read_text(), "ddp", str(script))
    assert result.error is None and "MGP101" in codes(result)


def test_each_module_is_read_once(tmp_path):
    copy = tmp_path / "reid"
    shutil.copytree(REID, copy)
    project._parsed.cache_clear()
    for name in ("train.py", "detect.py", "tacotron.py", "train.py"):
        path = copy / name
        migrate_source(path.read_text(), "ddp", str(path))
    read = project._parsed.cache_info()
    # lib/__init__.py, lib/parallel.py and lib/trainers.py: each parsed once, however many files ask; and
    # lib/parallel.py once more as lib/convert.py's `.parallel`, read when detect.py asks whether the module of
    # its DataParallel subclass rebases it (MGP106), which asks whether convert.py, a caller, migrates.
    assert read.misses == 4 and read.hits > 0


def test_the_root_is_the_nearest_marker(tmp_path):
    (tmp_path / ".git").mkdir()
    inner = tmp_path / "src" / "pkg"
    inner.mkdir(parents=True)
    assert project.find_root(str(inner)) == str(tmp_path)
    (tmp_path / "src" / "pyproject.toml").write_text("")
    project._find_root.cache_clear()
    assert project.find_root(str(inner)) == str(tmp_path / "src")


def test_an_internal_error_is_one_line():
    """MGP003 names the exception's first line, never LibCST's node dump."""
    error = ValueError("SimpleStatementLine(\n    body=[\n        Expr(\n" + "x\n" * 200 + ") is not in list")
    text = error_summary(error)
    assert "\n" not in text and len(text) <= 120 and text.startswith("ValueError: SimpleStatementLine(")


def test_a_pair_that_gathers_is_not_encodings(tmp_path):
    """Only a pair whose model leaves the outputs on their devices is taken for PyTorch-Encoding's."""
    (tmp_path / "setup.py").write_text("")
    source = (REID.parent / "segmentation" / "utils" / "encoding.py").read_text()
    (tmp_path / "mine.py").write_text(source.replace("return outputs", "return super().gather(outputs, output_device)"))
    script = tmp_path / "train.py"
    script.write_text("from mine import DataParallelModel, DataParallelCriterion\n\nmodel = DataParallelModel(net)\n")
    assert project.encoding_pair_modules(str(script), {"DataParallelModel": {"mine.DataParallelModel"}}) == frozenset()
    (tmp_path / "mine.py").write_text(source)
    project._project.cache_clear()  # a new run
    assert project.encoding_pair_modules(str(script), {"DataParallelModel": {"mine.DataParallelModel"}}) == {"mine"}


def test_the_ohem_loss_left_by_mgp287_would_change_under_ddp():
    """Why MGP287 leaves the file under --style torch: each of 2 or 3 processes keeping its own hardest pixels, averaged, is not the
    loss of the batch (float64, the fixture project's own loss class)."""
    import importlib.util

    torch = __import__("pytest").importorskip("torch")
    spec = importlib.util.spec_from_file_location("ohem", REID.parent / "segmentation" / "utils" / "loss.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    criterion = module.OhemCrossEntropy(keep=50)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 5, 4, 4, dtype=torch.float64, generator=generator)
    labels = torch.randint(0, 5, (7, 4, 4), generator=generator)
    whole = criterion(logits, labels)
    for processes in (2, 3):
        shares = [criterion(x, y) for x, y in zip(logits.tensor_split(processes), labels.tensor_split(processes))]
        assert abs(float(sum(shares) / processes - whole)) > 1e-3


AUDIO = REID.parent / "audio_mixup"


def test_a_directory_the_script_puts_on_sys_path_is_read(tmp_path):
    """audioset_tagging_cnn's `sys.path.insert(1, os.path.join(sys.path[0], '../utils'))`, then `from utilities import
    Mixup`: the import resolves there (and only with that line)."""
    assert project.project_of(str(AUDIO / "pytorch" / "main.py")).find("utilities.Mixup").where == "../utils/utilities.py:6"
    copy = tmp_path / "audio_mixup"
    shutil.copytree(AUDIO, copy)
    script = copy / "pytorch" / "main.py"
    script.write_text(script.read_text().replace('sys.path.insert(1, os.path.join(sys.path[0], "../utils"))\n', ""))
    assert project.project_of(str(script)).find("utilities.Mixup") is None


def test_the_mixup_lambdas_left_by_mgp310_would_change_under_ddp():
    """Why MGP310 leaves the file under --style torch: processes drawing their own rows' coefficients from generators seeded alike get
    the first rows' coefficients, not the batch's (the fixture project's own Mixup, 2 and 3 processes)."""
    import importlib.util

    import numpy as np

    spec = importlib.util.spec_from_file_location("utilities", AUDIO / "utils" / "utilities.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    whole = module.Mixup(mixup_alpha=1.0).get_lambda(batch_size=12)
    for processes in (2, 3):
        shares = [module.Mixup(mixup_alpha=1.0).get_lambda(len(rows)) for rows in np.array_split(np.arange(12), processes)]
        assert np.abs(np.concatenate(shares) - whole).max() > 1e-3


def test_the_particles_left_by_mgp311_would_change_under_ddp():
    """Why MGP311 leaves the file under --style torch: a process's rows of the original's draw for 2 copies of the
    batch are rows `i` and `B + i` of it; the process itself draws a prefix of 2 * its rows (generators seeded
    alike), so no process gets the original's numbers."""
    torch = __import__("pytest").importorskip("torch")
    batch, copies = 6, 2
    torch.manual_seed(0)
    whole = torch.randn(copies * batch, 3, dtype=torch.float64).view(copies, batch, 3)
    for processes in (2, 3):
        for span in torch.arange(batch).tensor_split(processes):
            torch.manual_seed(0)
            drawn = torch.randn(copies * len(span), 3, dtype=torch.float64).view(copies, len(span), 3)
            assert (drawn - whole[:, span]).abs().max() > 1e-3


def test_a_builder_names_the_module_that_imports_it():
    """Importers are never among a module's imports: a bounded byte search of the project finds them, also when
    only the builder is passed (a pre-commit run over the changed file)."""
    builder = FIXTURES / "projects" / "builders" / "models" / "loading.py"
    result = migrate_source(builder.read_text(), "ddp", str(builder))
    assert codes(result) == ["MGP320"] and "../train.py:6, which trains" in result.diagnostics[0].message
    assert result.output == builder.read_text()
    found = project.importers(str(builder), "load_model")
    assert [(importer.line, importer.trains) for importer in found] == [(6, True)]


def test_a_write_through_the_projects_own_helper_is_found(tmp_path):
    """SCAN's `hungarian_evaluate` writes its confusion matrix through `confusion_matrix`, which calls `plt.savefig`:
    the call of `hungarian_evaluate` writes files, as one of a helper that makes a directory does."""
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "utils.py").write_text(
        "import matplotlib.pyplot as plt\n\n\ndef confusion_matrix(p, out):\n    plt.savefig(out)\n\n\n"
        "def hungarian_evaluate(p, out=None):\n    acc = 1\n    if out:\n        confusion_matrix(p, out)\n    return acc\n\n\n"
        "def summary(p):\n    return hungarian_evaluate(p)\n"
    )
    found = project.project_of(str(tmp_path / "setup.py"))
    assert found.writes(found.find("utils.hungarian_evaluate")) == project.Write(11, "confusion_matrix(...)")
    assert found.writes(found.find("utils.summary")) == project.Write(16, "hungarian_evaluate(...)")
    assert found.writes(found.find("utils.confusion_matrix")) == project.Write(5, "matplotlib.pyplot.savefig")


def test_an_importer_with_its_own_distributed_path_is_named_to_launch(tmp_path):
    """DialoGPT's shape: `load_model()` returns the wrap to LSP_train.py, which trains and has a distributed path of
    its own (`--local_rank`, `init_process_group`): the advice is to launch that path, not to migrate it."""
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "train_utils.py").write_text(
        "import torch\n\n\ndef load_model(model, n_gpu):\n    if n_gpu > 1:\n        model = torch.nn.DataParallel(model)\n"
        "    return model\n"
    )
    script = "import torch\nfrom train_utils import load_model\n\nif local_rank != -1:\n    # torch.distributed.init_process_group()\n"
    (tmp_path / "train.py").write_text(script + "    torch.distributed.init_process_group(backend='nccl')\nload_model(m, 2)(x).sum().backward()\n")
    builder = tmp_path / "train_utils.py"
    result = migrate_source(builder.read_text(), "ddp", str(builder))
    (left,) = result.diagnostics
    assert left.code == "MGP320" and not result.changed
    assert "`load_model` hands the model to train.py:2, which has its own distributed path (init_process_group, line 6)" in left.message
    (tmp_path / "train.py").write_text(script + "    pass\nload_model(m, 2)(x).sum().backward()\n")
    project._tree.cache_clear()
    assert "(train.py:2, which trains): migrate there" in migrate_source(builder.read_text(), "ddp", str(builder)).diagnostics[0].message


def test_the_importer_search_skips_other_projects_beside_a_folder_of_scripts(tmp_path):
    """A folder of scripts with no project marker is searched from its parent, which may hold whole
    repositories (a home directory): a folder with a marker of its own is another project, never read."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "loading.py").write_text("def load_model():\n    return model\n")
    (scripts / "train.py").write_text("from loading import load_model\nload_model().backward()\n")
    other = tmp_path / "other_repo"
    (other / "pkg").mkdir(parents=True)
    (other / "pyproject.toml").write_text("")
    (other / "pkg" / "uses.py").write_text("from loading import load_model\n")
    found = project.importers(str(scripts / "loading.py"), "load_model")
    assert [os.path.basename(importer.path) for importer in found] == ["train.py"]
    searched = {top: files for top, files, _ in project.trees_searched()}
    assert searched[str(tmp_path)] == 2


def test_a_folder_of_scripts_beside_this_one_imports_its_own_module_of_that_name(tmp_path):
    """A folder of scripts with no project marker, searched from its parent (/tmp, a home directory): another
    folder there whose script writes `from trainer import Trainer` imports its own trainer.py, not this one's.
    Self-Attention-GAN, fetched into /tmp, was told that a test's train.py in another folder of /tmp started it."""
    for name in ("sagan", "elsewhere"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "trainer.py").write_text("class Trainer:\n    pass\n")
    (tmp_path / "elsewhere" / "train.py").write_text("from trainer import Trainer\nTrainer().run()\n")
    (tmp_path / "run_sagan.py").write_text("from sagan.trainer import Trainer\n")
    (tmp_path / "sagan" / "main.py").write_text("from trainer import Trainer\n")
    found = project.importers(str(tmp_path / "sagan" / "trainer.py"), "Trainer")
    assert sorted(os.path.relpath(importer.path, tmp_path) for importer in found) == ["run_sagan.py", os.path.join("sagan", "main.py")]


def test_the_files_own_functions_are_read_from_the_text_being_migrated(tmp_path):
    """stdin (`--stdin-filename`) or a notebook's cells are not what the disk holds at that path: the draws of the
    file's own functions come from the text migrated, here with an empty file on disk under its name."""
    source = (FIXTURES / "shapes" / "sliced_score_in_file.py").read_text()
    path = tmp_path / "sliced_score_in_file.py"
    path.write_text("")
    assert "MGP311" in codes(migrate_source(source, "ddp", str(path), TORCH_OPTIONS))


def test_a_builder_with_no_project_root_is_left(tmp_path):
    """Issue 23, item 10: the same builders that their checkout leaves (MGP320, importers found) are left when
    passed alone from a scratch folder with no project marker above it (MGP321), rather than migrated as wraps
    whose trainer nothing shows."""
    builders = FIXTURES / "projects" / "builders" / "models"
    scratch = tmp_path / "scratch"  # the importer search reads the folder above it: only this one
    scratch.mkdir()
    assert project.find_root(str(scratch)) is None
    for name, line in (("loading.py", 12), ("wrapper.py", 14)):
        in_checkout = migrate_source((builders / name).read_text(), "ddp", str(builders / name))
        assert codes(in_checkout) == ["MGP320"]
        shutil.copy(builders / name, scratch / name)
        alone = migrate_source((builders / name).read_text(), "ddp", str(scratch / name))
        assert codes(alone) == ["MGP321"] and alone.diagnostics[0].line == line, (name, alone.diagnostics)
        assert alone.output == (builders / name).read_text()
    done = run_cli("loading.py", "--to", "ddp", "--check", cwd=scratch)
    assert done.returncode == 0 and b"loading.py:12:17: MGP321" in done.stderr, done.stderr


def test_an_evaluation_in_a_project_with_no_root_marker_is_still_read(tmp_path):
    """A checkout without pyproject.toml, setup.py, setup.cfg or .git (a downloaded archive of a research
    project, Unsupervised-Classification's moco.py) still has its imported modules read: a model that only goes
    to the project's evaluation helper is left (MGP286), not migrated with a note to distribute a training
    loader (the lone-file rule, MGP321, is for wraps handed to importers)."""
    copy = tmp_path / "reid"
    shutil.copytree(REID, copy, ignore=shutil.ignore_patterns("*.ddp.*", "*.balanced.*", "pyproject.toml"))
    assert project.find_root(str(copy)) is None
    result = migrate_source((copy / "evaluate.py").read_text(), "ddp", str(copy / "evaluate.py"))
    assert codes(result) == ["MGP286"] and result.output == (copy / "evaluate.py").read_text(), result.diagnostics


def test_a_guarded_import_is_read_as_the_first_one_a_current_python_runs():
    """CCNet's libs/bn.py imports Queue in a `try` (Python 3's name, then Python 2's): the first one binds it."""
    module = project.text_module(
        "bn.py",
        "try:\n    from queue import Queue\nexcept ImportError:\n    from Queue import Queue\n"
        "if TYPE_CHECKING:\n    import threading as th\nelse:\n    th = None\n"
        "import multiprocessing as th\nNorm = partial(SyncNorm, momentum=0.1)\n",
    )
    assert module.imports["Queue"] == "queue.Queue"
    assert module.imports["th"] == "multiprocessing"  # a plain import after the guarded one is what stays bound
    assert [type(value).__name__ for value in module.assigned["Norm"]] == ["Call"]


def test_the_layers_a_model_builds_are_followed_through_the_project(tmp_path):
    """MGP371 reads the model's construction through the project's builder, classes and aliases (CCNet's
    Res_Deeplab -> ResNet -> BatchNorm2d = partial(InPlaceABNSync) -> libs/bn.py), and no further than they go."""
    import ast

    root = FIXTURES / "projects" / "sync_layers"
    script = root / "train.py"
    found = project.project_of(str(script))
    module = project.text_module(str(script), script.read_text())
    link = project.replica_link(module, ast.parse("Res_Deeplab(num_classes=19)", mode="eval").body, found, str(root))
    assert (link.layer.name, link.primitive, link.layer.where.rpartition(":")[0], link.line) == (
        "InPlaceABNSync", "queue.Queue", "libs/bn.py", 31
    )
    plain = project.text_module(str(root / "train_plain.py"), (root / "train_plain.py").read_text())
    expression = ast.parse("Plain_Deeplab(num_classes=19)", mode="eval").body
    assert project.replica_link(plain, expression, found, str(root)) is None
    assert project.replica_link(module, ast.parse("Res_Deeplab()", mode="eval").body, None, str(root)) is None  # no project


def test_a_dataset_class_that_downloads_by_default_is_built_on_the_main_process_first(tmp_path):
    """open-reid's datasets: ``__init__(self, root, split_id=0, download=True)``, built directly or through
    ``datasets.create``, which indexes a module-level dict of them; given ``download=False`` (by keyword or at its
    place) a build downloads nothing. A class whose ``__init__`` writes its files itself is MGP137's alone."""
    (tmp_path / "setup.py").write_text("")
    package = tmp_path / "reid" / "datasets"
    package.mkdir(parents=True)
    (tmp_path / "reid" / "__init__.py").write_text("")
    (package / "market.py").write_text(
        "import os\n\n\nclass Market:\n    def __init__(self, root, split_id=0, download=True):\n"
        "        if download:\n            self.download()\n\n    def download(self):\n        os.makedirs(self.root)\n"
    )
    (package / "written.py").write_text(
        "import json\n\n\nclass Written:\n    def __init__(self, root, download=True):\n"
        "        with open(root + '/meta.json', 'w') as meta:\n            json.dump({}, meta)\n"
    )
    (package / "__init__.py").write_text(
        "from .market import Market\n\n__factory = {'market': Market}\n\n\n"
        "def create(name, root, *args, **kwargs):\n    return __factory[name](root, *args, **kwargs)\n"
    )
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.nn as nn\nfrom reid import datasets\nfrom reid.datasets.market import Market\n"
        "from reid.datasets.written import Written\n\nmodel = nn.DataParallel(model)\n"
        "a = datasets.create('market', 'data', split_id=1)\nb = Market('data', 1)\nc = Market('data', 0, False)\n"
        "d = datasets.create('market', 'data', download=False)\ne = Written('data')\n"
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    assert result.output.splitlines()[-5:] == [
        "a = mgpu_runtime.main_process_first(datasets.create, 'market', 'data', split_id=1)",
        "b = mgpu_runtime.main_process_first(Market, 'data', 1)",
        "c = Market('data', 0, False)",
        "d = datasets.create('market', 'data', download=False)",
        "e = mgpu_runtime.main_process_first(Written, 'data')",
    ]
    said = {d.line: d.message for d in result.diagnostics if d.code == "MGP137"}
    # `__factory[name](...)` quoted after the line would take the message past one short line (160 characters)
    assert said[7].startswith("`datasets.create(...)` downloads (reid/datasets/__init__.py:7): built on the main process first")
    assert said[8].startswith("`Market(...)` downloads (reid/datasets/market.py:5 `download=True`)")
    assert sorted(said) == [7, 8, 11] and not {"MGP132", "MGP135", "MGP322"} & set(codes(result))


def test_a_project_writer_set_as_a_stream_is_set_on_the_main_process_only(tmp_path):
    """open-reid's ``sys.stdout = Logger(path)`` (the file opened with "w"): set on the main process only, whose
    stdout alone the runtime keeps; on a line with other code, or under --style torch, it is left (MGP322)."""
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "logs.py").write_text(
        "import sys\n\n\nclass Logger:\n    def __init__(self, path):\n        self.console = sys.stdout\n"
        "        self.file = open(path, 'w')\n\n    def write(self, text):\n        self.console.write(text)\n"
        "        self.file.write(text)\n"
    )
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\nimport sys as system\nimport torch.nn as nn\nfrom logs import Logger\n\n"
        "model = nn.DataParallel(model)\nif evaluate: sys.stdout = Logger('eval.txt')\nsystem.stderr = Logger('err.txt')\n"
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    assert result.output.splitlines()[-3:] == [
        "if evaluate: sys.stdout = Logger('eval.txt')",
        "if mgpu_runtime.is_main_process():",
        "    system.stderr = Logger('err.txt')",
    ]
    said = {d.line: (d.code, d.message.rpartition("`): ")[2]) for d in result.diagnostics if d.code in ("MGP132", "MGP322")}
    assert said == {
        7: ("MGP322", "not moved, as `sys.stdout` is not set on a line of its own"),
        8: ("MGP132", "`system.stderr` set on the main process only"),
    }
    torch_style = migrate_source(script.read_text(), "ddp", str(script), TORCH_OPTIONS)
    assert "Logger('err.txt')\n" in torch_style.output and codes(torch_style).count("MGP322") == 2


def test_a_project_evaluation_runs_once_and_a_builder_that_returns_its_wrap_is_no_evaluation(tmp_path):
    """MOT's shape: ``test.test`` wraps a model of its own and evaluates it; called by the migrated loop with its
    result unread, it runs on the main process and the others wait for it (MGP132). A project function that
    returns the model it wraps is a builder, not an evaluation: nothing is said of it."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "helpers.py").write_text(
        "import torch\n\n\n"
        "def test(weights):\n"
        "    model = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n"
        "    model.load_state_dict(torch.load(weights))\n"
        "    return model(torch.zeros(1, 2)).sum().item()\n\n\n"
        "def build():\n"
        "    net = torch.nn.Linear(2, 2)\n"
        "    net = torch.nn.DataParallel(net)\n"
        "    return net\n"
    )
    train = tmp_path / "train.py"
    train.write_text(
        "import torch\nimport helpers\nfrom torch.utils.data import DataLoader\n\n"
        "teacher = helpers.build()\n"
        "teacher.eval()\n"
        "model = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in DataLoader(torch.randn(8, 2), batch_size=4):\n"
        "    loss = model(x).pow(2).mean()\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    torch.save(model.state_dict(), 'latest.pt')\n"
        "    score = helpers.test('latest.pt')\n"
    )
    result = migrate_source(train.read_text(), "ddp", str(train))
    said = [(d.code, d.message) for d in result.diagnostics if d.code in ("MGP132", "MGP322")]
    assert len(said) == 1 and said[0][0] == "MGP132" and said[0][1].startswith("`helpers.test(...)` evaluates"), said
    assert "    if mgpu_runtime.is_main_process():\n        score = helpers.test('latest.pt')\n    mgpu_runtime.wait_for_main_process()\n" in result.output


def test_an_entry_script_without_a_wrap_that_hands_a_writing_helper_a_value_is_migrated(tmp_path):
    """first-order-model's ``run.py`` shape: the entry script wraps nothing itself, starts the training of
    ``train.py`` and, in another mode, calls a project function that makes directories, given a value of its own.
    Asking whether that value holds the model's outputs read a flow index the file never built: an internal
    error (MGP003) left the whole entry script unchanged."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n\n\n"
        "def train(model, dataset):\n"
        "    model = torch.nn.DataParallel(model)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x in DataLoader(dataset, batch_size=4):\n"
        "        optimizer.zero_grad()\n"
        "        model(x).pow(2).mean().backward()\n"
        "        optimizer.step()\n"
    )
    (tmp_path / "report.py").write_text(
        "import os\n\n\n"
        "def report(model, log_dir):\n"
        "    os.makedirs(os.path.join(log_dir, 'report'))\n"
    )
    run = tmp_path / "run.py"
    run.write_text(
        "import sys\nimport torch\nfrom train import train\nfrom report import report\n\n"
        "if __name__ == '__main__':\n"
        "    model = torch.nn.Linear(2, 2)\n"
        "    if sys.argv[1] == 'train':\n"
        "        train(model, torch.randn(8, 2))\n"
        "    else:\n"
        "        report(model, sys.argv[2])\n"
    )
    result = migrate_source(run.read_text(), "ddp", str(run))
    assert result.error is None, result.error
    assert "MGP120" in codes(result) and "MGP132" in codes(result), codes(result)
    assert "        if mgpu_runtime.is_main_process():\n            report(model, sys.argv[2])\n" in result.output


def test_a_project_logger_entered_by_a_with_statement_is_built_on_the_main_process_only(tmp_path):
    """first-order-model's ``with Logger(log_dir=...) as logger:``: the logger makes its directory and opens its log
    when built, and the loop only calls its methods: built on the main process only, a stand-in elsewhere, entered
    and left by every process (MGP135), where it was left with MGP322 ("not assigned to a name")."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "logger.py").write_text(
        "import os\n\n\n"
        "class Logger:\n"
        "    def __init__(self, log_dir):\n"
        "        os.makedirs(log_dir)\n"
        "        self.file = open(os.path.join(log_dir, 'log.txt'), 'a')\n\n"
        "    def __enter__(self):\n"
        "        return self\n\n"
        "    def __exit__(self, *exception):\n"
        "        self.file.close()\n\n"
        "    def log_iter(self, losses):\n"
        "        print(losses, file=self.file)\n"
    )
    train = tmp_path / "train.py"
    train.write_text(
        "import torch\nfrom torch.utils.data import DataLoader\nfrom logger import Logger\n\n\n"
        "def train(model, dataset, log_dir):\n"
        "    model = torch.nn.DataParallel(model)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    with Logger(log_dir) as logger:\n"
        "        for x in DataLoader(dataset, batch_size=4):\n"
        "            loss = model(x).pow(2).mean()\n"
        "            optimizer.zero_grad()\n"
        "            loss.backward()\n"
        "            optimizer.step()\n"
        "            logger.log_iter(losses=loss.item())\n\n\n"
        "if __name__ == '__main__':\n"
        "    train(torch.nn.Linear(2, 2), torch.randn(8, 2), 'log')\n"
    )
    result = migrate_source(train.read_text(), "ddp", str(train))
    assert result.error is None and "MGP322" not in codes(result), result.diagnostics
    assert "    with mgpu_runtime.main_process_only(Logger, log_dir) as logger:\n" in result.output
    assert "MGP135" in codes(result), codes(result)


OWN_PATH_HELPER = FIXTURES / "projects" / "own_path_helper"


def test_a_builders_module_stays_without_a_word_whichever_file_is_rewritten_first(tmp_path):
    """own_path_helper rewritten in place, the script first or the builder's module first, then again: the script
    launches its own path (MGP139), model_utils.py (its DataParallel fallback) stays as it is with no MGP320,
    and the second run changes and says nothing."""
    for order in (("train.py", "model_utils.py"), ("model_utils.py", "train.py")):
        copy = tmp_path / order[0].replace(".py", "")
        shutil.copytree(OWN_PATH_HELPER, copy, ignore=shutil.ignore_patterns("*.ddp.*", "*.balanced.*"))
        for name in order:
            result = migrate_source((copy / name).read_text(), "ddp", str(copy / name))
            assert "MGP320" not in codes(result) and result.error is None
            (copy / name).write_text(result.output)
        assert (copy / "train.py").read_text() == (OWN_PATH_HELPER / "train.ddp.py").read_text()
        assert (copy / "model_utils.py").read_text() == (OWN_PATH_HELPER / "model_utils.py").read_text()
        for name in order:
            again = migrate_source((copy / name).read_text(), "ddp", str(copy / name))
            assert not again.changed and codes(again) == []


def test_a_builders_module_is_left_with_the_script_that_cannot_launch(tmp_path):
    """When the script's own path cannot be launched (a print before its config file is read), both are left:
    the script with MGP231 naming the print, the builder's module with MGP320 naming the script."""
    copy = tmp_path / "own_path_helper"
    shutil.copytree(OWN_PATH_HELPER, copy, ignore=shutil.ignore_patterns("*.ddp.*", "*.balanced.*"))
    script = copy / "train.py"
    script.write_text(script.read_text().replace("if args.config is not None:\n", "print(args)\nif args.config is not None:\n"))
    for name in ("model_utils.py", "train.py"):
        result = migrate_source((copy / name).read_text(), "ddp", str(copy / name))
        assert not result.changed or name == "train.py"
        said = {d.code: d.message for d in result.diagnostics}
        if name == "model_utils.py":
            assert set(said) == {"MGP320"} and "own distributed path" in said["MGP320"]
        else:
            assert "MGP139" not in said and "`print` (line 35) runs before the config file" in said["MGP231"]


CHOSEN_FALLBACK = FIXTURES / "projects" / "chosen_fallback"


def test_a_fallback_held_by_a_trainer_class_is_named_and_not_launched(tmp_path):
    """A trainer class of another module whose __init__ wraps the model in DataParallel (seq2seq's shape, built by
    name or through getattr(trainers, args.trainer)) is the script's fallback: --local_rank defaults to LOCAL_RANK
    (MGP131) and the own path is left with its torchrun command (MGP231), never launched from a plain start
    (MGP139): on GPUs the trainer chooses, or, on every visible GPU, from a class whose module is not left as the
    launching script's fallback."""
    copy = tmp_path / "chosen_fallback"
    shutil.copytree(CHOSEN_FALLBACK, copy, ignore=shutil.ignore_patterns("*.ddp.*", "*.balanced.*"))
    main = copy / "main.py"
    said = {d.code: d.message for d in migrate_source(main.read_text(), "ddp", str(main)).diagnostics}
    assert set(said) == {"MGP131", "MGP231"}
    assert "its fallback's GPUs are chosen (`device_ids`, trainers.py:47)" in said["MGP231"]
    assert "`torchrun --nproc_per_node=N main.py --batch-size B/N`" in said["MGP231"]
    trainers = copy / "trainers.py"
    trainers.write_text(trainers.read_text().replace("self.model_with_loss, device_ids,", "self.model_with_loss,"))
    # ClippedTrainer inherits Trainer's __init__, and the wrap in it.
    for built in ("getattr(trainers, args.trainer)", "trainers.Trainer", "trainers.ClippedTrainer"):
        main.write_text((CHOSEN_FALLBACK / "main.py").read_text().replace("getattr(trainers, args.trainer)(", built + "("))
        said = {d.code: d.message for d in migrate_source(main.read_text(), "ddp", str(main)).diagnostics}
        assert set(said) == {"MGP131", "MGP231"}, (built, said)
        assert "its fallback is held by the class `Trainer` (trainers.py:47)" in said["MGP231"]


def test_a_helper_left_on_every_process_is_said_with_every_write(tmp_path):
    """self-critical's ``eval_split``: an evaluation helper whose result the loop reads (MGP322, not moved) also
    makes its directory, saves its predictions and calls a helper that writes a json it reads back. The diagnostic
    names each write by its line, not only the first (the directory), so the person moving it knows them all."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "evaluation.py").write_text(
        "import json\nimport os\n\nimport torch\n\n\n"
        "def score(predictions):\n"
        "    json.dump(predictions, open('eval/cache.json', 'w'))\n"
        "    return len(json.load(open('eval/cache.json')))\n\n\n"
        "def evaluate(model, data):\n"
        "    predictions = model(data).argmax(1).tolist()\n"
        "    if not os.path.isdir('eval'):\n"
        "        os.mkdir('eval')\n"
        "    torch.save(predictions, 'eval/predictions.pth')\n"
        "    return score(predictions)\n"
    )
    train = tmp_path / "train.py"
    train.write_text(
        "import torch\nimport evaluation\nfrom torch.utils.data import DataLoader\n\n"
        "model = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in DataLoader(torch.randn(8, 2), batch_size=4):\n"
        "    loss = model(x).pow(2).mean()\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    scored = evaluation.evaluate(model, x)\n"
        "    if scored > 2:\n"
        "        break\n"
    )
    result = migrate_source(train.read_text(), "ddp", str(train))
    said = [(d.line, d.message) for d in result.diagnostics if d.code == "MGP322"]
    assert said == [
        (12, "`evaluation.evaluate(...)` writes at evaluation.py:15 `os.mkdir`, 16 `torch.save`, 17 `score(...)`: not moved, as what it returns is used")
    ], said


def test_a_helper_that_returns_a_name_read_from_the_clock_gives_the_main_processs(tmp_path):
    """SfmLearner's ``save_path_formatter``: a project helper returns a path with the clock's reading in it; called
    where the program sets up, its result is the main process's on every process (MGP138). A helper that only
    names a file it opens by the clock and returns something else (pytorch-semseg's ``get_logger``) is left."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "utils.py").write_text(
        "import datetime\nimport logging\nimport os\n\n\n"
        "def save_path(base):\n"
        "    stamp = datetime.datetime.now().strftime('%m-%d-%H:%M')\n"
        "    return os.path.join(base, stamp)\n\n\n"
        "def get_logger(logdir):\n"
        "    logger = logging.getLogger('p')\n"
        "    ts = str(datetime.datetime.now()).split('.')[0]\n"
        "    logger.addHandler(logging.FileHandler(os.path.join(logdir, ts + '.log')))\n"
        "    return logger\n"
    )
    train = tmp_path / "train.py"
    train.write_text(
        "import torch\nimport utils\nfrom torch.utils.data import DataLoader\n\n\n"
        "def main():\n"
        "    run = utils.save_path('checkpoints')\n"
        "    logger = utils.get_logger(run)\n"
        "    model = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x in DataLoader(torch.randn(8, 2), batch_size=4):\n"
        "        loss = model(x).pow(2).mean()\n"
        "        optimizer.zero_grad()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        logger.info(loss.item())\n\n\n"
        "if __name__ == '__main__':\n"
        "    main()\n"
    )
    result = migrate_source(train.read_text(), "ddp", str(train))
    said = [(d.line, d.message) for d in result.diagnostics if d.code == "MGP138"]
    assert said == [(7, "`utils.save_path(...)` names something from the clock (utils.py:7): the main process's result on every process (mgpu_runtime.main_process_value)")], said
    assert "    run = mgpu_runtime.main_process_value(utils.save_path, 'checkpoints')\n    logger = utils.get_logger(run)\n" in result.output


def test_a_run_context_that_only_makes_directories_is_built_once_and_copied_and_others_are_said(tmp_path):
    """mean-teacher's ``main(RunContext(__file__, 0))``: a class whose construction only makes directories and keeps
    plain values is built on the main process, every process given its copy. One that holds something open (a
    lock), whose other method writes, or that derives from another class is left (MGP322), each saying why; so is
    the copy under --style torch. ``class RunContext(object):``, Python 2's spelling, derives from none."""
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "runs.py").write_text(
        "import os\nimport threading\nimport time\n\n\n"
        "class RunContext(object):\n    def __init__(self, name, index):\n        stamp = str(time.strftime('%H%M%S'))\n"
        "        self.result_dir = '{}/{}/{}'.format('results', name, stamp)\n"
        "        if not os.path.exists('results'):\n            print('first run')\n"
        "        os.makedirs(self.result_dir)\n\n\n"
        "class Locked:\n    def __init__(self, path):\n        self.lock = threading.RLock()\n        os.makedirs(path)\n\n\n"
        "class Noted:\n    def __init__(self, path):\n        os.makedirs(path)\n        self.path = path\n\n"
        "    def note(self, text):\n        with open(self.path + '/notes.txt', 'a') as f:\n            f.write(text)\n\n\n"
        "class Derived(RunContext):\n    pass\n"
    )
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.nn as nn\nfrom runs import Derived, Locked, Noted, RunContext\n\n\n"
        "def main(context, locked, noted, derived):\n    print(context.result_dir, locked.lock, noted.path, derived.result_dir)\n\n\n"
        "model = nn.DataParallel(model)\n"
        "main(RunContext('train', 0), Locked('locked'), Noted('noted'), Derived('derived', 1))\n"
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    assert result.output.splitlines()[-1] == (
        "main(mgpu_runtime.main_process_value(RunContext, 'train', 0), Locked('locked'), Noted('noted'), Derived('derived', 1))"
    )
    said = sorted((d.col, d.code, d.message.partition("): ")[2]) for d in result.diagnostics if d.code in ("MGP132", "MGP322"))
    assert said == [
        (6, "MGP132", "built on the main process, copied to every process (mgpu_runtime.main_process_value)"),
        (30, "MGP322", "not moved, as it is not assigned to a name, and its construction does more than make directories and keep values (runs.py:17)"),
        (48, "MGP322", "not moved, as it is not assigned to a name, and its method `note` writes too (runs.py:27)"),
        (64, "MGP322", "not moved, as it is not assigned to a name, and `Derived` derives from another class"),
    ], said
    torch_style = migrate_source(script.read_text(), "ddp", str(script), TORCH_OPTIONS)
    assert "main(RunContext('train', 0)" in torch_style.output and codes(torch_style).count("MGP322") == 4


def test_an_object_a_project_method_makes_is_built_on_the_main_process_when_only_its_methods_are_called(tmp_path):
    """mean-teacher's ``training_log = context.create_train_log("training")``, a ``TrainLog`` whose ``record``
    writes: behind a stand-in when the script only calls its methods for their effect (also in a function it is
    handed to); read otherwise, it is left (MGP322). The context's class is read where ``main(context)`` is called."""
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "runs.py").write_text(
        "class TrainLog:\n    def __init__(self, directory, name):\n        self.path = directory + '/' + name\n\n"
        "    def record(self, step, values):\n        with open(self.path, 'a') as f:\n            f.write(str((step, values)))\n\n\n"
        "class RunContext:\n    def __init__(self, directory):\n        self.directory = directory\n\n"
        "    def create_train_log(self, name):\n        return TrainLog(self.directory, name)\n"
    )
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.nn as nn\nfrom runs import RunContext\n\n\n"
        "def main(context):\n    training_log = context.create_train_log('training')\n"
        "    validation_log = context.create_train_log('validation')\n    record(training_log, 0)\n"
        "    print(validation_log.path)\n\n\n"
        "def record(log, step):\n    log.record(step, {'loss': 1.0})\n\n\n"
        "model = nn.DataParallel(model)\nmain(RunContext('results'))\n"
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    assert "    training_log = mgpu_runtime.main_process_only(context.create_train_log, 'training')\n" in result.output
    assert "    validation_log = context.create_train_log('validation')\n" in result.output
    said = {d.line: (d.code, d.message) for d in result.diagnostics if d.code in ("MGP135", "MGP322")}
    made = "`context.create_train_log(...)` makes a `TrainLog` that writes (runs.py:6): "
    assert said == {
        6: ("MGP135", made + "made on the main process only (mgpu_runtime.main_process_only)"),
        7: ("MGP322", made + "not moved, as `validation_log.path` is read at line 9"),
    }, said
    # Called with objects of two classes, the parameter's class is not known: nothing is said.
    script.write_text(script.read_text() + "main(object())\n")
    assert "MGP135" not in codes(migrate_source(script.read_text(), "ddp", str(script)))


def test_a_wrapper_check_in_a_module_only_own_paths_import_keeps_its_meaning(tmp_path):
    """SimCLR's model.py: ``save_model`` checks ``isinstance(model, DataParallel)`` and is imported only by main.py,
    which sets up distributed training of its own (left with MGP231). Rewritten, the check would take main.py's own
    DDP for a wrapper and save its weights without their ``module.`` prefix: it stays. Imported also by a script
    that migrates, it is rewritten."""
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "model.py").write_text(
        "import torch\n\n\ndef save_model(model, out):\n    if isinstance(model, torch.nn.DataParallel):\n"
        "        torch.save(model.module.state_dict(), out)\n    else:\n        torch.save(model.state_dict(), out)\n"
    )
    (tmp_path / "main.py").write_text(
        "import torch\nimport torch.distributed as dist\nfrom model import save_model\n\n"
        "if args.nodes > 1:\n    dist.init_process_group('nccl')\n    model = torch.nn.parallel.DistributedDataParallel(model)\n"
        "else:\n    model = torch.nn.DataParallel(model)\nsave_model(model, 'model.pt')\n"
    )
    shutil.copytree(tmp_path, tmp_path / "with_other")  # importers are read once per run and tree: another tree
    (tmp_path / "with_other" / "other.py").write_text(
        "import torch\nfrom model import save_model\n\nmodel = torch.nn.DataParallel(model)\nsave_model(model, 'm.pt')\n"
    )
    model = tmp_path / "model.py"
    result = migrate_source(model.read_text(), "ddp", str(model))
    assert not result.changed and not result.diagnostics
    model = tmp_path / "with_other" / "model.py"
    result = migrate_source(model.read_text(), "ddp", str(model))
    assert "isinstance(model, mgpu_runtime.PARALLEL_WRAPPERS)" in result.output and codes(result) == ["MGP126"]


_SPAWNED = (
    "import torch\nimport torch.distributed as dist\nimport torch.multiprocessing as mp\nfrom torch.nn.parallel import DataParallel\n\n\n"
    "def main(gpu, args):\n    if args.nodes > 1:\n        dist.init_process_group('nccl', rank=gpu, world_size=args.world_size)\n"
    "    model = build()\n    if args.dataparallel:\n        model = DataParallel(model)\n\n\n"
    "if __name__ == '__main__':\n    args = parse()\n{before}    if args.nodes > 1:\n        mp.spawn(main, args=(args,), nprocs=args.gpus, join=True)\n"
    "    else:\n        main(0, args)\n"
)


def test_an_own_path_the_file_spawns_itself_stays_beside_its_migrated_fallback(tmp_path):
    """SimCLR's main.py: ``init_process_group`` in ``main(gpu, args)``, which ``mp.spawn`` starts when ``args.nodes >
    1``, else ``main(0, args)`` with its DataParallel fallback. No launcher command runs that path and the fallback's
    processes never take it: the fallback migrates, set up in the ``else``, and the runtime stands aside before the
    spawn (``leave_to_own_path``); under ``--style torch``, which has no such runtime, and where the main block
    prints before that ``if`` (a set-up in its ``else`` relaunches after the print), MGP231 names where the file
    starts its own path, when, and why it stays left."""
    script = tmp_path / "main.py"
    script.write_text(_SPAWNED.format(before=""))
    result = migrate_source(script.read_text(), "ddp", str(script))
    assert result.changed and "MGP231" not in codes(result)
    assert "        mgpu_runtime.leave_to_own_path()\n        mp.spawn(main" in result.output
    assert "    else:\n        mgpu_runtime.setup()\n        main(0, args)\n" in result.output
    assert "    if args.nodes > 1:\n        dist.init_process_group('nccl'" in result.output  # the own path as it was
    torch_style = migrate_source(script.read_text(), "ddp", str(script), TORCH_OPTIONS)
    said = [(d.code, d.message) for d in torch_style.diagnostics]
    assert not torch_style.changed and said == [
        ("MGP231", "own distributed path (line 9), DataParallel fallback left: the file starts it (line 18) when `args.nodes > 1`")
    ], said
    script.write_text(_SPAWNED.format(before="    print(args)\n"))
    result = migrate_source(script.read_text(), "ddp", str(script))
    said = [(d.code, d.message) for d in result.diagnostics]
    assert not result.changed and said == [
        (
            "MGP231",
            "own distributed path (line 9), DataParallel fallback left: the file starts it (line 19) when `args.nodes > 1`, "
            "and line 17 prints before it",
        )
    ], said


def test_a_builder_whose_every_write_is_a_cache_it_reads_runs_on_the_main_process_first(tmp_path):
    """faster-rcnn's ``combined_roidb``: its helper pickles what it computes to a file it looks for first, and its
    result is used, so it runs on every process, the main process first (MGP132, ``main_process_first``): the
    others read the cache. A write the function does not look for first (a log), a cache read under another
    name, or a directory made beside it keeps MGP322."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    cached = (
        "    if os.path.exists(cache_file):\n        with open(cache_file, 'rb') as f:\n            return pickle.load(f)\n"
        "    sizes = list(range(count))\n    with open(cache_file, 'wb') as f:\n        pickle.dump(sizes, f)\n    return sizes\n"
    )
    (tmp_path / "roidb.py").write_text(
        "import os\nimport pickle\n\n\ndef prepare(count, cache_file):\n" + cached + "\n\n"
        "def combined(count, cache_file):\n    return prepare(count, cache_file)\n\n\n"
        "def logged(count, cache_file):\n    sizes = prepare(count, cache_file)\n    open('log.txt', 'a').write('built')\n    return sizes\n\n\n"
        "def other_name(count, cache_file, path):\n    if os.path.exists(cache_file):\n        return 1\n"
        "    with open(path, 'wb') as f:\n        pickle.dump(count, f)\n    return 2\n\n\n"
        "def with_directory(count, cache_file):\n    os.mkdir('cache')\n    return prepare(count, cache_file)\n"
    )
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.nn as nn\nfrom roidb import combined, logged, other_name, with_directory\n\n"
        "if __name__ == '__main__':\n    model = nn.DataParallel(model)\n"
        "    a = combined(3, 'a.pkl')\n    b = logged(3, 'b.pkl')\n    c = other_name(3, 'c.pkl', 'd.pkl')\n"
        "    d = with_directory(3, 'e.pkl')\n    model(a, b, c, d).backward()\n"
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    assert "    a = mgpu_runtime.main_process_first(combined, 3, 'a.pkl')\n" in result.output
    said = {d.line: d.code for d in result.diagnostics if d.code in ("MGP132", "MGP322")}
    assert said == {6: "MGP132", 7: "MGP322", 8: "MGP322", 9: "MGP322"}, result.diagnostics
    again = migrate_source(result.output, "ddp", str(script))
    assert again.output == result.output


_FEATURES = (
    "import scipy.io\nimport torch\n\n\ndef features(path, net, data):\n    with torch.no_grad():\n"
    "        scipy.io.savemat(path, {'f': net(data).numpy()})\n\n\n"
    "def keep(path, net):\n    torch.save(net.state_dict(), path)\n\n\n"
    "def tuned(path, net, data):\n    net(data).sum().backward()\n    scipy.io.savemat(path, {})\n\n\n"
    "def switched(path, net, data):\n    net.train()\n    scipy.io.savemat(path, {'f': net(data).numpy()})\n"
)
_SWITCHED = "    for x in loader:\n        net(x).sum().backward()\n"


@pytest.mark.parametrize(
    "before, call, said",
    [
        # in train mode (as it left the loop): DataParallel's forward split the batch norm's rows: said
        ("", "features('f.mat', net, test)", ("MGP322", "not moved, as it runs the wrapped model (evaluation.py:7)")),
        # Face_Pytorch: `net.eval()` first, so the forward is the plain module's row by row
        ("    net.eval()\n", "features('f.mat', net, test)", ("MGP132", "on the main process only, the model unwrapped")),
        ("    net.train(False)\n", "features('f.mat', net, test)", ("MGP132", "on the main process only, the model unwrapped")),
        # set back to train mode before the call
        ("    net.eval()\n    net.train()\n", "features('f.mat', net, test)", ("MGP322", "not moved, as it runs the wrapped model (evaluation.py:7)")),
        # a function that also trains the model it is given
        ("    net.eval()\n", "tuned('t.mat', net, test)", ("MGP322", "not moved, as it runs the wrapped model (evaluation.py:15)")),
        # a function that sets the model to train mode itself
        ("    net.eval()\n", "switched('s.mat', net, test)", ("MGP322", "not moved, as it runs the wrapped model (evaluation.py:21)")),
        # its result is read
        ("    net.eval()\n", "print(features('f.mat', net, test))", ("MGP322", "not moved, as what it returns is used")),
    ],
)
def test_a_project_writer_that_runs_the_wrapped_model(tmp_path, before, call, said):
    """Face_Pytorch's ``getFeatureFromTorch(path, net, ...)``: it runs the wrapped model over a test set and writes
    the features with ``scipy.io.savemat``. The forward is every process's (its values are global), so the call
    cannot go to the main process alone with the wrapped model (the processes would meet in different
    collectives). With the model in eval mode (``net.eval()`` before it), DataParallel's forward was the plain
    module's, row by row: the call goes to the main process, given the model unwrapped, and the others wait for it.
    Else it is said (MGP322). A writer handed the model only to save it is moved (MGP132)."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "evaluation.py").write_text(_FEATURES)
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.nn as nn\nfrom evaluation import features, keep, switched, tuned\n\n"
        f"if __name__ == '__main__':\n    net = nn.DataParallel(net)\n{_SWITCHED}{before}    {call}\n    keep('k.pt', net)\n"
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    line = 8 + before.count("\n")
    found = {d.line: (d.code, d.message.rpartition(": ")[2]) for d in result.diagnostics if d.code in ("MGP132", "MGP322")}
    assert found[line][0] == said[0] and found[line][1].endswith(said[1]), result.diagnostics
    assert found[line + 1] == ("MGP132", "called on the main process only, then every process waits")
    if said[0] == "MGP132":
        assert (
            "    if mgpu_runtime.is_main_process():\n        features('f.mat', mgpu_runtime.unwrap(net), test)\n"
            "    mgpu_runtime.wait_for_main_process()\n"
        ) in result.output
        assert migrate_source(result.output, "ddp", str(script)).output == result.output


def test_a_model_set_to_eval_mode_before_a_loop_that_sets_it_back_is_not_in_eval_mode_there(tmp_path):
    """``net.eval()`` before the loop, ``net.train()`` later in its body: from the second pass on, the call runs in
    train mode."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "evaluation.py").write_text(_FEATURES)
    script = tmp_path / "train.py"
    body = "        features('f.mat', net, test)\n        net.train()\n        net(x).sum().backward()\n"
    script.write_text(
        "import torch.nn as nn\nfrom evaluation import features\n\n"
        f"if __name__ == '__main__':\n    net = nn.DataParallel(net)\n    net.eval()\n    for x in loader:\n{body}"
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    assert "MGP322" in [d.code for d in result.diagnostics] and "unwrap" not in result.output


def test_a_method_of_an_object_a_project_module_makes_and_a_plotting_helper_are_read(tmp_path):
    """pytorch-playground's ``misc.logger.init(logdir, 'train_log')``: ``logger = Logger()`` made once at module level
    in utee/misc.py, whose ``init`` removes the old log and keeps the logger it makes. Every process ran it without
    a word (each removed the log the others had opened); it is said now (MGP322), as moving it would leave the other
    processes' logger unset. Face_Pytorch's ``Visualizer(env=...)``, whose construction makes a ``visdom.Visdom``
    client, is built on the main process only (MGP135): every process plotted each point. The fixture project
    ``module_objects`` is the same two shapes."""
    project_dir = tmp_path / "project"
    shutil.copytree(FIXTURES / "projects" / "module_objects", project_dir)
    script = project_dir / "train.py"
    result = migrate_source(script.read_text(), "ddp", str(script))
    said = {d.code: d.message for d in result.diagnostics if d.code in ("MGP132", "MGP135", "MGP322")}
    assert said == {
        "MGP322": "`misc.logger.init(...)` writes at utee/misc.py:18 `os.makedirs`, 21 `os.remove`: not moved, as `init` also "
        "changes its object (`self._logger = logging.getL...`)",
        "MGP135": "`Visualizer(...)` plots to a visdom server (utee/misc.py:36): built on the main process only, a stand-in "
        "elsewhere (mgpu_runtime.main_process_only)",
    }, result.diagnostics
    # A name bound at module level to something other than one call of a project class is no object read.
    helpers = project_dir / "utee" / "misc.py"
    helpers.write_text(helpers.read_text().replace("logger = Logger()", "logger = Logger() if os.name else None"))
    result = migrate_source(script.read_text(), "ddp", str(script))
    assert [d.code for d in result.diagnostics if d.code == "MGP322"] == [], result.diagnostics


def test_a_model_class_keeping_its_own_wrap_migrates_with_the_script_that_builds_and_trains_it():
    """CMC's shape: `MyEncoderCMC.__init__` keeps `self.encoder = nn.DataParallel(...)`; train.py builds the class
    and trains it. Both migrate: the wrap in the class, the loader, set-up and save in the script (which says it
    trains the model held there); the module's own main block would stay one process (none here)."""
    root = FIXTURES / "projects" / "built_holder"
    holder = root / "models" / "encoder.py"
    result = migrate_source(holder.read_text(), "ddp", str(holder))
    assert result.changed and [d.code for d in result.diagnostics if d.needs_review] == []
    script = root / "train.py"
    result = migrate_source(script.read_text(), "ddp", str(script))
    said = {d.code: d.message for d in result.diagnostics}
    assert "MGP122" in said and "it trains the model held in models/encoder.py" in said["MGP120"]


def test_a_model_class_built_by_a_module_that_does_not_train_it_is_left_naming_that_module():
    """The same class also built by demo.py, which only runs it: every process would run the demo, so the class's
    module is left (MGP320 names demo.py), and the script that trains it stays as it is with it."""
    root = FIXTURES / "projects" / "built_holder_left"
    holder = root / "models" / "encoder.py"
    result = migrate_source(holder.read_text(), "ddp", str(holder))
    (left,) = result.diagnostics
    assert left.code == "MGP320" and not result.changed
    assert "`MyEncoderCMC` hands the model to the modules building it: ../demo.py:5 builds it and does not train it" in left.message
    script = root / "train.py"
    assert not migrate_source(script.read_text(), "ddp", str(script)).changed


def test_a_main_block_that_never_builds_the_class_holding_the_wrap_gets_no_set_up(tmp_path):
    """CMC's models/alexnet.py tries a network in its main block; the class that keeps the wrap is built by the
    scripts importing it, which set up: the module's own main block stays one process."""
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "net.py").write_text(
        "import torch.nn as nn\n\n\nclass Holder(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.body = nn.DataParallel(nn.Linear(2, 2))\n\n\nif __name__ == '__main__':\n    print(nn.Linear(2, 2))\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader\nfrom net import Holder\n\nif __name__ == '__main__':\n"
        "    model = Holder()\n    for x in DataLoader(torch.randn(8, 2), batch_size=4):\n        model.body(x).sum().backward()\n"
    )
    holder = tmp_path / "net.py"
    result = migrate_source(holder.read_text(), "ddp", str(holder))
    assert result.changed and "setup()" not in result.output
    assert "mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))" in result.output


_MISSING_CLASSES = (
    "import glob\nimport os\nimport torch\n\n\n"
    # pytorch-pose's Mpii: the mean cached unless the cache is there (an own method, in the else of the test)
    "class Cached:\n    def __init__(self, root):\n        self.mean = self._mean(root)\n\n"
    "    def _mean(self, root):\n        path = os.path.join(root, 'mean.pt')\n        if os.path.isfile(path):\n"
    "            return torch.load(path)\n        else:\n            mean = torch.zeros(3)\n"
    "            torch.save(mean, path)\n            return mean\n\n\n"
    # dgcnn's ModelNet40: a loader function calls download(), which makes and fetches what is missing
    "def download():\n    if not os.path.exists('data'):\n        os.mkdir('data')\n"
    "    if not os.path.exists(os.path.join('data', 'set')) and True:\n        os.system('wget x; unzip x')\n\n\n"
    "def load(part):\n    download()\n    return glob.glob('data/set/*' + part)\n\n\n"
    "class Fetched:\n    def __init__(self, part):\n        self.files = load(part)\n\n\n"
    # open-reid's: an early return when the files are there
    "class Returned:\n    def __init__(self, root):\n        if os.path.exists(root):\n            return\n"
    "        os.makedirs(root)\n\n\n"
    # a write outside any test: a log
    "class Logged:\n    def __init__(self, root):\n        if not os.path.exists(root):\n            os.mkdir(root)\n"
    "        open(os.path.join(root, 'log.txt'), 'a').write('built')\n\n\n"
    # pytorch-deeplab-xception's Saver: the directory made is named from the runs listed before it
    "class Counted:\n    def __init__(self, root):\n        runs = glob.glob(os.path.join(root, 'run_*'))\n"
    "        path = os.path.join(root, 'run_%d' % len(runs))\n        if not os.path.exists(path):\n            os.makedirs(path)\n\n\n"
    # the test is for another thing than what is missing: `if exists(a): write`
    "class Inverted:\n    def __init__(self, root):\n        if os.path.exists(root):\n            os.system('rm -r x')\n\n\n"
    # the test looks for one path and the code under it writes another: the others would write it again
    "class Elsewhere:\n    def __init__(self, root):\n        if not os.path.exists(root):\n"
    "            torch.save(torch.zeros(3), 'other.pt')\n"
)


@pytest.mark.parametrize(
    "call, first",
    [
        ("Cached('c')", "sets.py:16 `torch.save`"),
        ("Fetched('train')", "sets.py:22 `os.mkdir`"),
        ("Returned('r')", "sets.py:41 `os.makedirs`"),
        ("Logged('l')", None),
        ("Counted('k')", None),
        ("Inverted('i')", None),
        ("Elsewhere('e')", None),
    ],
)
def test_a_class_that_writes_only_what_it_finds_missing_is_built_on_the_main_process_first(tmp_path, call, first):
    """pytorch-pose's dataset caching its mean and dgcnn's fetching its data (issue 23): a construction whose every
    write sits under a test that the thing is missing (followed into its own methods and the project's functions)
    is built on the main process first (MGP137); the others find what it wrote and skip the writes. A write outside
    such a test, a test for another path than the code under it writes, a directory named from a listing before it
    (that one is built once and copied, MGP132), or a test for the opposite keeps the build from MGP137."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "sets.py").write_text(_MISSING_CLASSES)
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.nn as nn\nfrom sets import Cached, Counted, Elsewhere, Fetched, Inverted, Logged, Returned\n\n"
        f"if __name__ == '__main__':\n    model = nn.DataParallel(model)\n    data = {call}\n    model(data).backward()\n"
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    said = [d.message for d in result.diagnostics if d.code == "MGP137"]
    if first is None:
        assert said == [] and "main_process_first" not in result.output, result.diagnostics
        return
    name, _, arguments = call.partition("(")
    assert said == [
        f"`{name}(...)` writes what it lacks ({first}): built on the main process first, then the others "
        "(mgpu_runtime.main_process_first)"
    ]
    assert f"    data = mgpu_runtime.main_process_first({name}, {arguments}\n" in result.output
    assert migrate_source(result.output, "ddp", str(script)).output == result.output


_DETECTOR = (
    "import torch\nimport torch.nn as nn\nfrom losses import FocalLoss\n\n\n"
    "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.head = nn.Linear(4, 4)\n"
    "        self.focal = FocalLoss()\n\n    def forward(self, x, y):\n        return self.focal(self.head(x), y)\n\n\n"
    "def net18(pretrained=False):\n    model = Net()\n    if pretrained:\n        model.load_state_dict({})\n    return model\n"
)


@pytest.mark.parametrize(
    "empty, said",
    [
        # pytorch-retinanet: a constant in place of the box loss of an image without a positive anchor
        ("losses.append(torch.tensor(0).float())", "Net.forward may give a constant loss (losses.py:10 `torch.tensor`)"),
        ("losses.append(out.new_zeros(()))", "Net.forward may give a constant loss (losses.py:10 `out.new_zeros`)"),
        # a tensor sized by the data, and a loss of the rows themselves: every process's loss reaches the head
        ("losses.append(torch.zeros(out.shape[1]).sum())", None),
        ("losses.append(out[i].sum() * 0)", None),
    ],
)
def test_a_model_whose_loss_may_be_a_constant_is_wrapped_to_look_for_unused_parameters(tmp_path, empty, said):
    """pytorch-retinanet (issue 23): the model comes from a factory of another module (``model.resnet50(...)``) and
    computes its loss in its forward through a loss module it keeps, which appends a constant for an image without a
    positive. A process whose rows all take that branch gives the head no gradient, and DDP waits for it (fixture
    ``constant_loss.py``: the job times out without the option). The wrap gets ``find_unused_parameters=True``
    (MGP130); a loss of the rows themselves does not."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "model.py").write_text(_DETECTOR)
    (tmp_path / "losses.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass FocalLoss(nn.Module):\n    def forward(self, out, y):\n"
        "        losses = []\n        for i in range(out.shape[0]):\n"
        f"            if y[i].sum() == 0:\n                {empty}\n            else:\n"
        "                losses.append((out[i] - y[i]).pow(2).sum())\n        return torch.stack(losses).mean()\n"
    )
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom model import net18\n\nif __name__ == '__main__':\n    net = net18(pretrained=True)\n"
        "    if torch.cuda.is_available():\n        net = net.cuda()\n    net = torch.nn.DataParallel(net)\n"
        "    net(x, y).mean().backward()\n"
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    found = [d.message for d in result.diagnostics if d.code == "MGP130"]
    if said is None:
        assert found == [] and "find_unused_parameters" not in result.output
        return
    assert found == [f"find_unused_parameters=True: {said}, no gradient to some layers"]
    assert "    net = mgpu_runtime.DistributedDataParallel(net, find_unused_parameters=True)\n" in result.output
    assert migrate_source(result.output, "ddp", str(script)).output == result.output


def test_a_project_without_a_root_marker_is_read_from_the_directory_named(tmp_path):
    """A project unpacked from an archive has no .git (nor pyproject.toml): `mgpu-migrate hrnet/ --to ddp` takes
    the directory it is given as the project's top. HRNet's loop in lib/core/function.py (no __init__.py, reached
    through tools/_init_paths.py) is found as what tools/train.py hands its model to, and its debug images are
    written once; its own imports (`from utils.vis import ...`) resolve from lib/. Given the files one by one, no
    top is known: the loop's module is not found to be handed the model, and the script is left (MGP323)."""
    project_dir = tmp_path / "hrnet"
    shutil.copytree(FIXTURES / "projects" / "config_gpus", project_dir, ignore=shutil.ignore_patterns("*.ddp.*", "*.balanced.*", "pyproject.toml"))
    named = run_cli(str(project_dir), "--to", "ddp", "--diff")
    out = named.stdout.decode()
    assert named.returncode == 1, named.stderr.decode()  # --diff: changes to make
    assert "+            mgpu_runtime.on_main_process(save_debug_images, config, input, target, output, prefix)" in out
    assert "mgpu_runtime.setup(devices=cfg.GPUS)" in out
    alone = run_cli(str(project_dir / "tools" / "train.py"), str(project_dir / "lib" / "core" / "function.py"), "--to", "ddp", "--diff")
    assert "MGP323" in alone.stdout.decode() + alone.stderr.decode() and "on_main_process" not in alone.stdout.decode()


@pytest.mark.parametrize("frozen", [True, False])
def test_a_config_filled_then_frozen_gives_the_set_up_its_gpus(tmp_path, frozen):
    """HRNet: `update_config(cfg, args)` fills the module-level config and ends with `cfg.freeze()`; the set-up goes
    right after it, given `cfg.GPUS`, and the project calls handed `cfg` after it cannot change it. Without the
    freeze, such a call may (`create_logger` writes `cfg.GPUS` for one name): the file is left (MGP283) as before."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "config.py").write_text(
        "cfg = Node()\n\n\ndef update_config(cfg, args):\n    cfg.defrost()\n    cfg.GPUS = args.gpus\n"
        + ("    cfg.freeze()\n" if frozen else "")
        + "\n\ndef create_logger(cfg, name):\n    if name == 'all':\n        cfg.GPUS = [0]\n    return name\n"
    )
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom config import cfg, update_config, create_logger\n\n\ndef main():\n    args = parse_args()\n"
        "    update_config(cfg, args)\n    logger = create_logger(cfg, 'train')\n"
        "    model = torch.nn.DataParallel(net, device_ids=cfg.GPUS)\n"
        "    for x in torch.utils.data.DataLoader(data, batch_size=4):\n        model(x).sum().backward()\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    if frozen:
        assert "    update_config(cfg, args)\n    mgpu_runtime.setup(devices=cfg.GPUS)\n" in result.output, result.diagnostics
        assert migrate_source(result.output, "ddp", str(script)).output == result.output
    else:
        assert not result.changed and [d.code for d in result.diagnostics] == ["MGP283"], result.diagnostics


def test_a_writer_that_trains_is_never_moved_to_the_main_process(tmp_path):
    """Teacher-free KD's `train_and_evaluate(model, ...)` builds a SummaryWriter and calls `train(...)`, whose loop
    steps the optimizer: moved under `if is_main_process():` with a barrier after it, the main process trained
    alone and waited in the gradient sums for processes waiting in the barrier (a hang). It stays on every process;
    MGP322 says its writes are every process's."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "train_kd.py").write_text(
        "import torch\n\n\ndef train(model, optimizer, loader):\n    for x in loader:\n        optimizer.zero_grad()\n"
        "        model(x).sum().backward()\n        optimizer.step()\n\n\n"
        "def train_and_evaluate(model, optimizer, loader, path):\n    train(model, optimizer, loader)\n"
        "    torch.save(model.state_dict(), path)\n"
    )
    script = tmp_path / "main.py"
    script.write_text(
        "import torch\nimport torch.nn as nn\nfrom train_kd import train_and_evaluate\n\n\ndef main():\n"
        "    model = nn.DataParallel(net)\n    for x in torch.utils.data.DataLoader(data, batch_size=4):\n"
        "        model(x).sum().backward()\n    train_and_evaluate(student, optimizer, loader, 'best.pt')\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    assert "is_main_process" not in result.output
    said = [d.message for d in result.diagnostics if d.code == "MGP322"]
    assert said == ["`train_and_evaluate(...)` writes files (train_kd.py:13: `torch.save`): not moved, as it trains (`.backward()`, train_kd.py:7)"], result.diagnostics


def test_a_helper_module_changed_only_by_a_wrapper_check_starts_no_program(tmp_path):
    """WS-DAN's utils.py checks `isinstance(net, nn.DataParallel)` for its callers (MGP126): that made it a program,
    and every dataset module importing it, whose main block only tries the dataset, got a set-up ("it starts the
    training of ../utils.py")."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "utils.py").write_text(
        "import torch.nn as nn\n\n\ndef state(net):\n    return net.module.state_dict() if isinstance(net, nn.DataParallel) else net.state_dict()\n"
    )
    dataset = tmp_path / "bird_dataset.py"
    dataset.write_text("import utils\n\n\nclass Birds:\n    pass\n\n\nif __name__ == '__main__':\n    print(len(Birds.__name__), utils)\n")
    result = migrate_source(dataset.read_text(), "ddp", str(dataset))
    assert not result.changed and not result.diagnostics, result.diagnostics


def test_a_file_whose_outputs_go_to_a_project_function_that_trains_nothing_only_evaluates(tmp_path):
    """WS-DAN's eval.py crops the images by the attention maps the model gives (`utils.batch_augment`) and runs the
    model again: nothing trains, so it stays DataParallel (MGP263), not a job where every process evaluates
    everything."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "utils.py").write_text("def batch_augment(images, maps):\n    return images * maps.mean()\n")
    script = tmp_path / "eval.py"
    script.write_text(
        "import torch\nimport torch.nn as nn\nfrom utils import batch_augment\n\n\ndef main():\n    net = nn.DataParallel(model)\n"
        "    with torch.no_grad():\n        for x, y in loader:\n            maps = net(x)\n            print(net(batch_augment(x, maps)))\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    assert not result.changed and [d.code for d in result.diagnostics] == ["MGP263"], result.diagnostics


def test_a_method_that_writes_on_an_object_of_unknown_class_is_said(tmp_path):
    """HRNet's `validate(config, val_loader, val_dataset, ...)` calls `val_dataset.evaluate(...)`; the dataset was
    built by `eval('dataset.' + name)`, so its class is not known, but the project's datasets' `evaluate` writes
    the predictions (pred.mat, a results json): every process would write them (MGP322, said, not moved)."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "mpii.py").write_text(
        "import json\n\n\nclass MPIIDataset:\n    def evaluate(self, preds, output_dir):\n"
        "        json.dump(preds, open(output_dir + '/pred.json', 'w'))\n        return 1.0\n"
    )
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nimport torch.nn as nn\n\n\ndef validate(loader, dataset, model):\n    preds = [model(x) for x in loader]\n"
        "    return dataset.evaluate(preds, 'out')\n\n\ndef main():\n    model = nn.DataParallel(net)\n"
        "    for x in torch.utils.data.DataLoader(data, batch_size=4):\n        model(x).sum().backward()\n"
        "    print(validate(val_loader, eval('mpii.MPIIDataset')(), model))\n\n\nif __name__ == '__main__':\n    main()\n"
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    said = [(d.line, d.message) for d in result.diagnostics if d.code == "MGP322"]
    assert said == [
        (7, "`dataset.evaluate(...)` may write on every process (as mpii.py:6 `open(..., 'w')` does): not moved, as the class of `dataset` is not known here")
    ], result.diagnostics


_TIMED = (
    "import time\n\n\n"
    "class Timed:\n"
    "    def __init__(self, iterable):\n"
    "        self.iterable = iterable\n"
    "        self.iterator = self.iterable.__iter__()\n\n"
    "    def __iter__(self):\n"
    "        return self\n\n"
    "    def __next__(self):\n"
    "        start = time.time()\n"
    "        n = next(self.iterator)\n"
    "        self.last = time.time() - start\n"
    "        return {}\n\n\n"
    "class Block:\n"
    "    def __enter__(self):\n"
    "        return self\n\n"
    "    def __exit__(self, *exception):\n"
    "        pass\n\n"
    "    def log2file(self, path, line):\n"
    "        with open(path, 'a') as f:\n"
    "            f.write(line)\n"
)
_TIMED_TRAIN = (
    "import torch\nfrom torch.utils.data import DataLoader\nfrom tools import Block, Timed\n\n"
    "def train(model, data_loader, optimizer):\n"
    "    for x in Timed(data_loader):\n"
    "        loss = model(x).pow(2).mean()\n"
    "        optimizer.zero_grad()\n"
    "        loss.backward()\n"
    "        optimizer.step()\n\n\n"
    "if __name__ == '__main__':\n"
    "    model = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n"
    "    with Block() as block:\n"
    "        options = {{'lr': 0.1}}\n"
    "    for name, value in sorted(options.items()):\n"
    "        block.log2file('args.txt', name)\n"
    "{}"
    "    train(model, DataLoader(torch.randn(8, 2), batch_size=4), torch.optim.SGD(model.parameters(), lr=0.1))\n"
)


@pytest.mark.parametrize(("returned", "followed"), [("n", True), ("next(self.iterator)", True), ("n * 2", False)])
def test_a_project_iterator_that_passes_its_items_on_is_followed_to_the_loader(tmp_path, returned, followed):
    """flownet2's ``tools.IteratorTimer(data_loader)``: a project class whose ``__next__`` returns what it draws from
    its constructor's iterable, as it is: the loader is split. One that changes the items is not followed: the
    data stays whole on every process (MGP235)."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "tools.py").write_text(_TIMED.format(returned))
    train = tmp_path / "train.py"
    train.write_text(_TIMED_TRAIN.format(""))
    result = migrate_source(train.read_text(), "ddp", str(train))
    assert result.error is None
    assert ("mgpu_runtime.distribute_loader(DataLoader(" in result.output) is followed, codes(result)
    assert ("MGP235" in codes(result)) is not followed


@pytest.mark.parametrize("after", ["", "    print(name)\n"])
def test_a_loop_of_writes_by_a_method_of_an_entered_object_is_made_once(tmp_path, after):
    """flownet2's ``with tools.TimerBlock(...) as block`` (its ``__enter__`` returns itself), then ``for argument,
    value in sorted(vars(args).items()): block.log2file(args.log_file, ...)``: the whole loop on the main process,
    one wait after it; a loop whose names are read after it keeps the guard inside it, one wait a line."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "tools.py").write_text(_TIMED.format("n"))
    train = tmp_path / "train.py"
    train.write_text(_TIMED_TRAIN.format(after))
    result = migrate_source(train.read_text(), "ddp", str(train))
    assert result.error is None and "MGP132" in codes(result), result.diagnostics
    hoisted = (
        "    if mgpu_runtime.is_main_process():\n"
        "        for name, value in sorted(options.items()):\n"
        "            block.log2file('args.txt', name)\n"
        "    mgpu_runtime.barrier()\n"
    )
    inside = (
        "    for name, value in sorted(options.items()):\n"
        "        if mgpu_runtime.is_main_process():\n"
        "            block.log2file('args.txt', name)\n"
        "        mgpu_runtime.barrier()\n"
    )
    assert (hoisted if not after else inside) in result.output, result.output


def test_the_model_handed_to_training_elsewhere_names_the_call_that_trains(tmp_path):
    """Teacher-free KD's main.py: the wrapped teacher goes to ``utils.load_checkpoint(...)``, then to
    ``train_and_evaluate_kd(...)`` of another module, which trains: MGP262 names the second, not the first."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "utils.py").write_text("import torch\n\n\ndef load_checkpoint(path, model):\n    model.load_state_dict(torch.load(path))\n")
    (tmp_path / "data_loader.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n\n\n"
        "def fetch_dataloader(split):\n    return DataLoader(torch.randn(8, 2), batch_size=4, shuffle=split == 'train')\n"
    )
    (tmp_path / "train_kd.py").write_text(
        "import torch\n\n\n"
        "def evaluate_kd(model, loader):\n"
        "    return sum(model(x).sum().item() for x in loader)\n\n\n"
        "def train_kd(model, teacher, optimizer, loader):\n"
        "    for x in loader:\n"
        "        target = teacher(x).detach()\n"
        "        loss = (model(x) - target).pow(2).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n\n\n"
        "def train_and_evaluate_kd(model, teacher, loader, optimizer):\n"
        "    teacher.eval()\n"
        "    print(evaluate_kd(teacher, loader))\n"
        "    train_kd(model, teacher, optimizer, loader)\n"
    )
    main = tmp_path / "main.py"
    main.write_text(
        "import torch\nimport data_loader\nimport utils\nfrom train_kd import train_and_evaluate_kd\n\n\n"
        "def main():\n"
        "    loader = data_loader.fetch_dataloader('train')\n"
        "    model = torch.nn.Linear(2, 2)\n"
        "    teacher = torch.nn.DataParallel(torch.nn.Linear(2, 2)).cuda()\n"
        "    utils.load_checkpoint('best.pth.tar', teacher)\n"
        "    train_and_evaluate_kd(model, teacher, loader, torch.optim.SGD(model.parameters(), lr=0.1))\n"
    )
    result = migrate_source(main.read_text(), "ddp", str(main))
    said = [d.message for d in result.diagnostics if d.code == "MGP262"]
    assert said and "`train_and_evaluate_kd(...)`" in said[0], result.diagnostics


def test_a_wrapped_container_of_losses_handed_to_the_importer_is_said_as_such(tmp_path):
    """EDSR's loss/__init__.py: ``Loss`` wraps ``self.loss_module``, a ``ModuleList`` of its losses that its forward
    calls one by one, and main.py builds it: MGP320 says a ``ModuleList`` goes there, not "the model"."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "loss").mkdir()
    loss = tmp_path / "loss" / "__init__.py"
    loss.write_text(
        "import torch.nn as nn\n\n\n"
        "class Loss(nn.Module):\n"
        "    def __init__(self, n_gpus):\n"
        "        super().__init__()\n"
        "        self.losses = [nn.L1Loss()]\n"
        "        self.loss_module = nn.ModuleList()\n"
        "        for function in self.losses:\n"
        "            self.loss_module.append(function)\n"
        "        if n_gpus > 1:\n"
        "            self.loss_module = nn.DataParallel(self.loss_module, range(n_gpus))\n\n"
        "    def forward(self, sr, hr):\n"
        "        return sum(function(sr, hr) for function in self.losses)\n"
    )
    (tmp_path / "main.py").write_text(
        "import torch\nimport loss\n\n"
        "criterion = loss.Loss(2)\n"
        "model = torch.nn.Linear(2, 2)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=4):\n"
        "    criterion(model(x), x).backward()\n"
        "    optimizer.step()\n"
    )
    result = migrate_source(loss.read_text(), "ddp", str(loss))
    said = [d.message for d in result.diagnostics if d.code == "MGP320"]
    assert said and "hands a `ModuleList` (no forward to run) to" in said[0], result.diagnostics


def test_the_synchronized_batchnorm_package_a_checkout_lacks_is_still_named(tmp_path):
    """SPADE's ``from models.networks.sync_batchnorm import DataParallelWithCallback``: the package is a git submodule
    (its README has the user copy it in), so the checkout has no ``models/networks/sync_batchnorm``. The wrap was
    neither migrated nor said (0 sites); it is read as the package's class, and as its layers cannot be read the
    file is left with the reason (MGP266)."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "models" / "networks").mkdir(parents=True)
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "networks" / "__init__.py").write_text("")
    trainer = tmp_path / "trainer.py"
    trainer.write_text(
        "import torch\nfrom models.networks.sync_batchnorm import DataParallelWithCallback\n\n"
        "model = DataParallelWithCallback(torch.nn.Linear(2, 2), device_ids=[0, 1])\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=4):\n"
        "    model(x).sum().backward()\n"
        "    optimizer.step()\n"
    )
    result = migrate_source(trainer.read_text(), "ddp", str(trainer))
    assert "MGP266" in codes(result), result.diagnostics
    assert result.output == trainer.read_text()
    # under --to balanced the package's class is rebased where it is defined, which the checkout lacks: said too
    result = migrate_source(trainer.read_text(), "balanced", str(trainer))
    said = [d.message for d in result.diagnostics if d.code == "MGP280"]
    assert said and "`models.networks.sync_batchnorm` is not in this checkout" in said[0], result.diagnostics
    assert result.output == trainer.read_text()


@pytest.mark.parametrize(
    ("written", "kept"),
    [
        ("args.corr_levels = 4", True),
        ("self.args = args; self.dropout = torch.nn.Dropout(args.dropout); print(self.args.gpus)", True),
        ("args.gpus = [0]", False),
        ("setattr(args, 'x', 1)", False),
        ("args.merge_from_file('x.yaml')", False),  # (yacs: a method of the object may change anything of it)
        ("self.args = args; self.args.gpus.append(2)", False),
        ("torch.save(args, 'args.pt')", False),  # (handed whole to a call the project does not show)
    ],
)
def test_gpus_chosen_after_the_options_go_to_a_class_that_writes_other_attributes(tmp_path, written, kept):
    """RAFT's ``train(args)``: ``nn.DataParallel(RAFT(args), device_ids=args.gpus)``, where ``RAFT.__init__`` sets
    ``args.corr_levels`` (another module's class): it cannot change ``args.gpus``, so the set-up is given them
    (MGP150). A class that writes ``gpus``, or attributes by name, may: the file is left (MGP283)."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "raft.py").write_text(f"import torch\n\n\nclass RAFT(torch.nn.Linear):\n    def __init__(self, args):\n        super().__init__(2, 2)\n        {written}\n")
    train = tmp_path / "train.py"
    train.write_text(
        "import argparse\nimport torch\nfrom raft import RAFT\n\n\n"
        "def train(args):\n"
        "    model = torch.nn.DataParallel(RAFT(args), device_ids=args.gpus)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x in torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=4):\n"
        "        model(x).sum().backward()\n"
        "        optimizer.step()\n\n\n"
        "if __name__ == '__main__':\n"
        "    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--gpus', type=int, nargs='+', default=[0, 1])\n"
        "    args = parser.parse_args()\n"
        "    train(args)\n"
    )
    result = migrate_source(train.read_text(), "ddp", str(train))
    assert ("mgpu_runtime.setup(devices=args.gpus)" in result.output) is kept, result.diagnostics
    assert ("MGP283" in codes(result)) is not kept


def _spawned_in_main(tmp_path, joined_under: str, main_block: str):
    """pytorch/examples' shape: ``main_worker`` joins under ``if args.<joined_under>:`` beside a DataParallel
    fallback, ``main(args)`` spawns it under ``if args.multiprocessing_distributed:`` (else calls it), then
    ``main_block``."""
    script = tmp_path / "train.py"
    script.write_text(
        "import argparse\nimport torch\nimport torch.multiprocessing as mp\nimport torch.distributed as dist\n\n\n"
        "def main_worker(gpu, args):\n"
        f"    if args.{joined_under}:\n"
        "        dist.init_process_group('nccl')\n"
        "        model = torch.nn.parallel.DistributedDataParallel(net)\n"
        "    else:\n"
        "        model = torch.nn.DataParallel(net)\n"
        "    for x in torch.utils.data.DataLoader(data, batch_size=4):\n"
        "        model(x).sum().backward()\n\n\n"
        "def main(args):\n"
        "    if args.multiprocessing_distributed:\n"
        "        mp.spawn(main_worker, nprocs=4, args=(args,))\n"
        "    else:\n"
        "        main_worker(0, args)\n" + main_block
    )
    return script


def test_an_own_path_spawned_inside_main_says_why_its_fallback_is_left(tmp_path):
    """semseg's and pytorch/examples' ``def main(): if args.multiprocessing_distributed: mp.spawn(...) else:
    main_worker(...)``, where nothing calls ``main()`` once from the main block: the fallback is not migrated beside
    the own path (its set-up would go in that ``else``, which every relaunched process must reach first); MGP231
    said so with its condition cut off and no reason."""
    script = _spawned_in_main(tmp_path, "distributed", "")
    result = migrate_source(script.read_text(), "ddp", str(script))
    said = [d.message for d in result.diagnostics if d.code == "MGP231"]
    assert said and said[0].endswith("and `main()` is not called once from the top") and len(said[0]) <= 160, said


def test_an_own_path_spawned_inside_a_main_called_once_migrates_its_fallback_beside_it(tmp_path):
    """The same, with ``main(args)`` called once by the main block: every relaunched process reaches its ``else``
    first, so the fallback migrates there (the set-up first in that ``else``, ``leave_to_own_path()`` before the
    spawn), and the own path's calls stay as they are."""
    script = _spawned_in_main(
        tmp_path,
        "multiprocessing_distributed",
        "\n\nif __name__ == '__main__':\n"
        "    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--multiprocessing-distributed', action='store_true')\n"
        "    main(parser.parse_args())\n",
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    assert not [d for d in result.diagnostics if d.code == "MGP231"], result.diagnostics
    code = result.output
    assert "        mgpu_runtime.leave_to_own_path()\n        mp.spawn(" in code, code
    assert "    else:\n        mgpu_runtime.setup()\n        main_worker(0, args)" in code, code
    assert "model = torch.nn.parallel.DistributedDataParallel(net)" in code and "mgpu_runtime.DistributedDataParallel(net)" in code
    assert "dist.init_process_group('nccl')" in code


def test_a_gpu_chosen_before_a_wrap_under_an_option_stays_the_one_process_gpu(tmp_path):
    """darts' train_imagenet.py without its module-level writes: ``torch.cuda.set_device(args.gpu)``, then ``if
    args.parallel: model = nn.DataParallel(model)`` ``else: model = model.cuda()``. The set-up relaunches only under
    ``args.parallel``; the GPU it binds is the process's there (DataParallel used every GPU) and ``args.gpu``
    otherwise, where the script stays one process as it was."""
    script = tmp_path / "train.py"
    script.write_text(
        "import argparse\nimport torch\nimport torch.nn as nn\n\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--gpu', type=int, default=0)\n"
        "parser.add_argument('--parallel', action='store_true', default=False)\n"
        "args = parser.parse_args()\n\n\n"
        "def main():\n"
        "    torch.cuda.set_device(args.gpu)\n"
        "    model = nn.Linear(4, 2)\n"
        "    if args.parallel:\n"
        "        model = nn.DataParallel(model).cuda()\n"
        "    else:\n"
        "        model = model.cuda()\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x in torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=4):\n"
        "        optimizer.zero_grad()\n"
        "        model(x.cuda()).sum().backward()\n"
        "        optimizer.step()\n\n\n"
        "if __name__ == '__main__':\n"
        "    main()\n"
    )
    result = migrate_source(script.read_text(), "ddp", str(script))
    code = result.output
    assert "torch.cuda.set_device(mgpu_runtime.device() if args.parallel else args.gpu)" in code, code
    assert "    if args.parallel:\n        mgpu_runtime.setup()\n    else:\n        mgpu_runtime.setup(processes=1)\n    main()" in code, code
    assert not [d for d in result.diagnostics if d.code in ("MGP233", "MGP254")], result.diagnostics


def test_a_dim_passed_on_by_a_wrapper_function_is_said_for_what_it_is(tmp_path):
    """CenterNet's ``def DataParallel(module, device_ids=None, output_device=None, dim=0, chunk_sizes=None)``, which
    passes its ``dim`` on to torch's: MGP201 said "dim != 0", though the parameter is 0 by default."""
    script = tmp_path / "data_parallel.py"
    script.write_text(
        "import torch\n\n\ndef DataParallel(module, device_ids=None, output_device=None, dim=0):\n"
        "    return torch.nn.DataParallel(module, device_ids, output_device, dim)\n"
    )
    said = [d.message for d in migrate_source(script.read_text(), "ddp", str(script)).diagnostics if d.code == "MGP201"]
    assert said == ["DataParallel's dim is `dim`, a parameter of `DataParallel()` (0 by default): DDP has no dim to scatter "
                    "along, so not rewritten; pass no dim if it is always 0"], said


def test_a_wrap_whose_else_resumes_the_model_is_advised_as_such(tmp_path):
    """InsightFace-v2: `if checkpoint is None: model = nn.DataParallel(model)` `else: model = checkpoint['model']`.
    MGP233 advised `... or mgpu_runtime.world_size() > 1`, which would drop a resumed model: it says the else sets the
    model another way instead."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nimport torch.nn as nn\n\n\n"
        "def train(checkpoint, loader):\n"
        "    if checkpoint is None:\n"
        "        model = nn.DataParallel(nn.Linear(2, 2))\n"
        "    else:\n"
        "        model = torch.load(checkpoint)['model']\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x in loader:\n"
        "        model(x).sum().backward()\n"
        "        optimizer.step()\n"
    )
    said = [d.message for d in migrate_source(script.read_text(), "ddp", str(script)).diagnostics if d.code == "MGP233"]
    assert said == ["the wrap runs only under the condition `checkpoint is None`, and its else sets `model` another way: make "
                    "sure every process takes the same branch"], said
