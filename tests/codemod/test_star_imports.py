"""A name that only a star import binds (``from models import *``, where ``models`` imports torch) is what the
project's copy of that module binds it to, read with the modules it star-imports in turn
(``Project.star_binding``); where that cannot be told, MGP253 still leaves the wrap."""

from __future__ import annotations

import textwrap

import pytest

from mgpu_migrate.engine import migrate_source

TRAIN = textwrap.dedent(
    """\
    from models import *

    model = torch.nn.DataParallel(Net())
    """
)


def project(tmp_path, models: str, helpers: str = "import torch\n") -> str:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "models.py").write_text(textwrap.dedent(models))
    (tmp_path / "helpers.py").write_text(textwrap.dedent(helpers))
    (tmp_path / "train.py").write_text(TRAIN)  # the project is that of a file on disk
    return str(tmp_path / "train.py")


def codes(path: str, target: str = "balanced") -> set[str]:
    result = migrate_source(TRAIN, target, path)
    assert result.error is None
    return {d.code for d in result.diagnostics}


@pytest.mark.parametrize(
    "models",
    [
        "import torch\nclass Net: pass\n",
        "import torch.nn as nn\nfrom helpers import *\nclass Net: pass\n",  # through a star import in turn
        "from . import helpers\nimport torch as torch\n__all__ = ['torch', 'Net']\nclass Net: pass\n",
    ],
)
def test_torch_from_the_project_s_star_import_is_torch(tmp_path, models):
    assert codes(project(tmp_path, models)) == {"MGP101"}


@pytest.mark.parametrize(
    ("models", "helpers"),
    [
        # assigned, or imported only under a condition: what it is at run time is not read off the text
        ("import torch\ntorch = None\n", "import torch\n"),
        ("try:\n    import torch\nexcept ImportError:\n    torch = None\n", ""),
        # two star imports that bind it to different things
        ("from helpers import *\nimport numpy as torch\n", "import torch\n"),
        # not exported, or exported by a list that is not literal
        ("import torch\n__all__ = ['Net']\n", ""),
        ("import torch\n__all__ = ['torch'] + names\n", ""),
        # a star import of a module the project does not hold
        ("import torch\nfrom somewhere_else import *\n", ""),
    ],
)
def test_what_cannot_be_told_is_still_left_with_mgp253(tmp_path, models, helpers):
    assert "MGP253" in codes(project(tmp_path, models, helpers))


def test_a_star_module_nowhere_on_disk_leaves_it_too(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    assert "MGP253" in codes(str(tmp_path / "train.py"))


def test_the_file_s_own_binding_wins_over_any_star_import(tmp_path):
    path = project(tmp_path, "import numpy as torch\n")
    source = "from models import *\nimport torch\nmodel = torch.nn.DataParallel(Net())\n"
    result = migrate_source(source, "balanced", path)
    assert {d.code for d in result.diagnostics} == {"MGP101"}
