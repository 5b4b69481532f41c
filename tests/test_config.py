"""``[tool.mgpu-migrate]`` in pyproject.toml: ``to``, ``sync-bn``, ``exclude``, and their errors, through the command line."""

from __future__ import annotations

import pytest

from mgpu_migrate.config import Settings
from tests.cli_helpers import DP_SCRIPT, run_cli

BATCHNORM_SCRIPT = "import torch.nn as nn\nmodel = nn.DataParallel(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))\n"


def _project(tmp_path, settings: str):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n\n[tool.mgpu-migrate]\n" + settings)
    return tmp_path


def test_sync_bn_from_pyproject_and_overridden_by_no_sync_bn(tmp_path):
    project = _project(tmp_path, 'to = "ddp"\nsync-bn = true\n')
    (project / "train.py").write_text(BATCHNORM_SCRIPT)
    shown = run_cli("--diff", "train.py", cwd=project)
    assert shown.returncode == 1, shown.stderr
    assert b"nn.SyncBatchNorm.convert_sync_batchnorm(" in shown.stdout
    assert b"train.py:2:9: MGP129 " in shown.stderr
    plain = run_cli("--diff", "--no-sync-bn", "train.py", cwd=project)
    assert b"SyncBatchNorm" not in plain.stdout
    assert b"train.py:2:9: MGP101 " in plain.stderr
    # stdin reads the settings of the directory it is run in.
    piped = run_cli("-", cwd=project, stdin=BATCHNORM_SCRIPT.encode())
    assert b"convert_sync_batchnorm" in piped.stdout


def test_exclude_skips_walked_and_named_files(tmp_path):
    project = _project(tmp_path, 'to = "balanced"\nexclude = ["legacy/", "*_old.py", "src/**/gen_*.py"]\n')
    paths = ["train.py", "legacy/train.py", "legacy/deep/a.py", "model_old.py", "src/x/gen_a.py", "src/gen_b.py"]
    kept = ["train.py", "src/x/keep.py", "legacy_not/train.py"]
    for path in paths + kept:
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text(DP_SCRIPT)
    excluded = [path for path in paths if path != "train.py"]

    walked = run_cli(".", cwd=project)
    assert walked.returncode == 0, walked.stderr
    assert b"3 files migrated to balanced, 0 unchanged, 0 failed" in walked.stderr
    for path in excluded:
        assert (project / path).read_text() == DP_SCRIPT, path
    for path in kept:
        assert "DataParallelModel" in (project / path).read_text(), path

    # Named explicitly (as pre-commit passes files), an excluded file is still left alone; so is a whole
    # excluded directory, also from a subdirectory of the project.
    named = run_cli("--check", "model_old.py", "legacy", cwd=project)
    assert named.returncode == 0, named.stderr
    assert b"0 files would be migrated to balanced, 0 unchanged, 0 failed" in named.stderr
    inside = run_cli("--check", "gen_a.py", cwd=project / "src" / "x")
    assert inside.returncode == 0 and (project / "src/x/gen_a.py").read_text() == DP_SCRIPT


@pytest.mark.parametrize(
    "settings, message",
    [
        ("sync-bn = 1\n", b"sync-bn must be true or false"),
        ('exclude = "legacy"\n', b"exclude must be a list of glob patterns"),
        ("to = 3\n", b"to must be a string"),
        ('too = "ddp"\n', b"[tool.mgpu-migrate]: unknown keys: too (known: to, sync-bn, exclude, extend-exclude,"),
        ('to = "dpp"\n', b"[tool.mgpu-migrate]: unknown target 'dpp' (expected balanced or ddp)"),
        ('ignore = ["MGP101"]\n', b"ignore: MGP101 is a rewrite, always reported; select and ignore choose among"),
        ('select = ["XYZ1"]\n', b"select: 'XYZ1' is not a code or a prefix of one"),
    ],
)
def test_bad_settings_are_usage_errors_that_name_the_key(tmp_path, settings, message):
    project = _project(tmp_path, settings)
    (project / "train.py").write_text(DP_SCRIPT)
    result = run_cli("--to", "ddp", "train.py", cwd=project)
    assert result.returncode == 2
    assert message in result.stderr
    assert (project / "train.py").read_text() == DP_SCRIPT


@pytest.mark.parametrize(
    "pattern, path, excluded",
    [
        ("legacy", "legacy/a.py", True),
        ("legacy", "src/legacy/a.py", True),  # a name without "/" matches at any depth
        ("/legacy", "src/legacy/a.py", False),  # a leading "/" anchors at the project root
        ("legacy", "legacy_two/a.py", False),
        ("*_old.py", "deep/down/x_old.py", True),
        ("src/*.py", "src/a/b.py", False),  # "*" stays within one name
        ("src/**/*.py", "src/a/b.py", True),
        ("src/**/*.py", "src/b.py", True),
        ("[ab]?.py", "a1.py", True),
        ("[!ab]?.py", "a1.py", False),
    ],
)
def test_exclude_pattern_semantics(tmp_path, pattern, path, excluded):
    settings = Settings(root=str(tmp_path), exclude=(pattern,))
    assert settings.excluded(str(tmp_path / path)) is excluded
    assert not settings.excluded(str(tmp_path.parent / "elsewhere.py"))  # outside the project: never
