"""A model class handed to a program whose loader derives from torch 0.4's ``_DataLoaderIter`` (RCAN's
``MSDataLoader``): the original cannot run on any torch since 1.2, so the wrap is left with MGP341, which names
the importer and the import (``analysis/old_loader.py``). The fixture project ``old_loader`` holds the goldens."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from mgpu_migrate.engine import migrate_source
from tests.fixture_cases import FIXTURES

PROJECT = FIXTURES / "projects" / "old_loader"


def _migrate(path: Path):
    return migrate_source(path.read_text(), "ddp", str(path))


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(PROJECT, tmp_path / "old_loader", ignore=shutil.ignore_patterns("*.ddp.*", "*.balanced.*"))
    return tmp_path / "old_loader"


def test_the_fixtures_loader_cannot_be_imported_on_this_torch():
    """The premise, on the torch the suite runs: importing the project's loader module fails."""
    run = subprocess.run([sys.executable, "-B", "-c", "import dataloader"], cwd=PROJECT, capture_output=True, text=True)
    assert run.returncode == 1 and "_DataLoaderIter" in run.stderr


def test_the_wrap_names_the_importer_and_the_old_import():
    result = _migrate(PROJECT / "model" / "__init__.py")
    assert not result.changed
    (left,) = result.diagnostics
    assert left.code == "MGP341"
    assert "`Model` goes to ../main.py:4" in left.message and "(../dataloader.py:4), gone since 1.2" in left.message


def test_a_loader_that_imports_the_old_iterator_only_as_a_fallback_is_not_named(tmp_path):
    project = _copy(tmp_path)
    loader = project / "dataloader.py"
    loader.write_text(
        loader.read_text().replace(
            "from torch.utils.data.dataloader import DataLoader, _DataLoaderIter\n",
            "from torch.utils.data.dataloader import DataLoader\n\n"
            "try:\n"
            "    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter as _DataLoaderIter\n"
            "except ImportError:\n"
            "    from torch.utils.data.dataloader import _DataLoaderIter\n",
        )
    )
    (left,) = _migrate(project / "model" / "__init__.py").diagnostics
    assert left.code == "MGP320"


def test_the_old_import_is_found_through_relative_imports_of_a_package(tmp_path):
    project = _copy(tmp_path)
    (project / "dataloader.py").rename(project / "data" / "loading.py")
    init = project / "data" / "__init__.py"
    init.write_text(init.read_text().replace("from dataloader import ScaleLoader", "from .loading import ScaleLoader"))
    (left,) = _migrate(project / "model" / "__init__.py").diagnostics
    assert left.code == "MGP341" and "(../data/loading.py:4)" in left.message
