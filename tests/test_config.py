"""``[tool.mgpu-migrate]`` in pyproject.toml: ``to``, ``sync-bn``, ``exclude``, and their errors, through the command line."""

from __future__ import annotations

import os

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
    "content, message",
    [
        (b'[tool.mgpu-migrate]\nto = "ddp"\n# caf\xe9\n', b"pyproject.toml: not UTF-8 (byte 36: invalid continuation byte)"),
        (b"[tool.mgpu-migrate]\nx = " + b"[" * 100_000 + b"]" * 100_000 + b"\n", b"pyproject.toml: nested too deeply to read"),
    ],
    ids=["invalid-utf8", "deeply-nested"],
)
def test_an_unreadable_pyproject_is_one_line_naming_it_not_a_traceback(tmp_path, content, message):
    """Bad settings are usage errors, as a misspelled key is (ruff and black also stop there): they used to be
    a UnicodeDecodeError or a RecursionError traceback, exit 1 ("files would change")."""
    (tmp_path / "pyproject.toml").write_bytes(content)
    (tmp_path / "train.py").write_text(DP_SCRIPT)
    result = run_cli("--check", "train.py", cwd=tmp_path)
    assert result.returncode == 2 and b"Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == b"Error: " + str(tmp_path).encode() + b"/" + message + (
        b", as TOML must be" if b"UTF-8" in message else b""
    )


def test_config_naming_a_fifo_is_refused_at_once(tmp_path):
    """It blocked, waiting for a writer."""
    os.mkfifo(tmp_path / "settings.toml")
    (tmp_path / "train.py").write_text(DP_SCRIPT)
    result = run_cli("--to", "ddp", "--check", "--config", "settings.toml", "train.py", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == b"Error: settings.toml: not a regular file"


def test_fifos_named_like_settings_or_ignore_files_block_nothing(tmp_path):
    """A FIFO where pyproject.toml or .gitignore would be is passed over, as a missing file is."""
    (tmp_path / ".git").mkdir()
    os.mkfifo(tmp_path / ".gitignore")
    (tmp_path / "sub").mkdir()
    os.mkfifo(tmp_path / "sub" / "pyproject.toml")
    (tmp_path / "sub" / "train.py").write_text(DP_SCRIPT)
    result = run_cli("--to", "ddp", "--check", "--show-rewrites", ".", cwd=tmp_path)
    assert result.returncode == 1 and b"sub/train.py:3:9: MGP101" in result.stderr


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


@pytest.mark.parametrize("where", ["command line", "pyproject"])
def test_an_unknown_code_to_select_or_ignore_is_refused_with_the_known_ones(tmp_path, where):
    if where == "pyproject":
        project = _project(tmp_path, 'to = "ddp"\nignore = ["MGP249", "MGP999"]\n')
        arguments = ["train.py"]
    else:
        project = _project(tmp_path, 'to = "ddp"\n')
        arguments = ["train.py", "--select", "MGP24,MGP999"]
    (project / "train.py").write_text(DP_SCRIPT)
    refused = run_cli(*arguments, "--check", cwd=project)
    assert refused.returncode == 2
    message = refused.stderr.decode()
    assert "MGP999 is no code of mgpu-migrate's" in message and "MGP201, MGP202" in message and "MGP249" in message
    assert (project / "train.py").read_text() == DP_SCRIPT
    # Prefixes of known codes stay good: MGP24 selects MGP240-MGP249.
    _project(tmp_path, 'to = "ddp"\nignore = ["MGP248", "MGP3"]\n')
    assert run_cli("train.py", "--check", "--select", "MGP24", cwd=project).returncode == 1


def test_exclude_reads_as_gitignore_negations_included(tmp_path):
    project = _project(tmp_path, 'to = "ddp"\nexclude = ["legacy/*", "!legacy/keep.py", "*_old.py"]\n')
    (project / "legacy").mkdir()
    for name in ("legacy/old.py", "legacy/keep.py", "train_old.py", "train.py"):
        (project / name).write_text(DP_SCRIPT)
    result = run_cli(".", cwd=project)
    assert result.returncode == 0, result.stderr
    migrated = {name for name in ("legacy/old.py", "legacy/keep.py", "train_old.py", "train.py")
                if (project / name).read_text() != DP_SCRIPT}
    assert migrated == {"legacy/keep.py", "train.py"}


def test_exclude_applies_to_the_stdin_filename(tmp_path):
    project = _project(tmp_path, 'to = "ddp"\nexclude = ["legacy/"]\n')
    passed = run_cli("-", "--stdin-filename", "legacy/model.py", cwd=project, stdin=DP_SCRIPT.encode())
    assert passed.returncode == 0, passed.stderr
    assert passed.stdout == DP_SCRIPT.encode()
    migrated = run_cli("-", "--stdin-filename", "model.py", cwd=project, stdin=DP_SCRIPT.encode())
    assert b"mgpu_runtime.DistributedDataParallel" in migrated.stdout


def test_the_global_gitignore_is_respected_in_walked_directories(tmp_path):
    import os
    import subprocess

    from tests.cli_helpers import command

    (tmp_path / "repo").mkdir()
    project = _project(tmp_path / "repo", 'to = "ddp"\n')
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    (tmp_path / "global-ignore").write_text("generated_*.py\n")
    (tmp_path / "gitconfig").write_text(f"[core]\n\texcludesFile = {tmp_path / 'global-ignore'}\n")
    for name in ("generated_model.py", "train.py"):
        (project / name).write_text(DP_SCRIPT)
    environment = {**os.environ, "GIT_CONFIG_GLOBAL": str(tmp_path / "gitconfig")}
    result = subprocess.run([*command(), "."], cwd=project, env=environment, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (project / "generated_model.py").read_text() == DP_SCRIPT
    assert "mgpu_runtime" in (project / "train.py").read_text()
    # Named explicitly, an ignored file is still migrated (as for .gitignore).
    named = subprocess.run([*command(), "generated_model.py"], cwd=project, env=environment, capture_output=True, timeout=120)
    assert named.returncode == 0 and "mgpu_runtime" in (project / "generated_model.py").read_text()
