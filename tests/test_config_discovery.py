"""Settings found per file (nearest pyproject.toml with the table), ``--config``, select/ignore, .gitignore,
files named explicitly that are not Python, and diffs that ``git apply`` takes."""

from __future__ import annotations

import json
import subprocess

import jsonschema
import pytest

from tests.cli_helpers import DP_SCRIPT, run_cli
from tests.test_output_formats import REPORT_SCHEMA

TWO_SITES = "import torch\nm = torch.nn.DataParallel(m)\nn = torch.nn.DataParallel(n, dim=1)\n"


def write(root, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def migrated_to(path) -> str | None:
    text = path.read_text()
    if "DistributedDataParallel" in text:
        return "ddp"
    return "balanced" if "DataParallelModel" in text else None


@pytest.fixture
def nested(tmp_path):
    write(
        tmp_path,
        {
            "pyproject.toml": '[project]\nname = "root"\n\n[tool.mgpu-migrate]\nto = "ddp"\nexclude = ["legacy/"]\n',
            "train.py": DP_SCRIPT,
            "legacy/old.py": DP_SCRIPT,
            # A sub-package's pyproject.toml without the table hides nothing: the root's settings govern it.
            "pkg/pyproject.toml": '[project]\nname = "pkg"\n',
            "pkg/model.py": DP_SCRIPT,
            "pkg/legacy/old.py": DP_SCRIPT,
            # A sub-project with its own table is governed by it alone (as ruff and black do it).
            "vision/pyproject.toml": '[tool.mgpu-migrate]\nto = "balanced"\nextend-exclude = ["gen_*.py"]\n',
            "vision/net.py": DP_SCRIPT,
            "vision/gen_net.py": DP_SCRIPT,
            "vision/legacy/kept.py": DP_SCRIPT,
        },
    )
    return tmp_path


def test_each_file_takes_its_nearest_settings(nested):
    result = run_cli(".", cwd=nested)
    assert result.returncode == 0, result.stderr
    expected = {
        "train.py": "ddp",
        "legacy/old.py": None,
        "pkg/model.py": "ddp",
        "pkg/legacy/old.py": None,
        "vision/net.py": "balanced",
        "vision/gen_net.py": None,
        "vision/legacy/kept.py": "balanced",
    }
    assert {name: migrated_to(nested / name) for name in expected} == expected
    assert b"4 files migrated to balanced and ddp" in result.stderr


def test_sub_projects_named_together_and_from_inside(nested):
    # Named together (as pre-commit passes them), each file still gets its own project's settings.
    result = run_cli("--check", "--output-format", "json", "pkg/model.py", "vision/net.py", "vision/gen_net.py", cwd=nested)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    jsonschema.Draft202012Validator(REPORT_SCHEMA).validate(report)
    assert report["target"] == "balanced,ddp"
    markdown = run_cli("--check", "--report", "r.md", "pkg/model.py", "vision/net.py", cwd=nested)
    assert markdown.returncode == 1
    report_text = (nested / "r.md").read_text()
    assert report_text.startswith("# mgpu-migrate: migration to balanced and ddp")
    assert "`--to balanced`: One process" in report_text and "`--to ddp`: One process per GPU" in report_text
    assert b"vision/gen_net.py" not in result.stdout
    inside = run_cli("--check", "old.py", cwd=nested / "pkg" / "legacy")
    assert inside.returncode == 0 and b"0 files would be migrated" in inside.stderr
    # --to on the command line wins over every file's setting.
    forced = run_cli("--to", "ddp", "vision/net.py", cwd=nested)
    assert forced.returncode == 0 and migrated_to(nested / "vision" / "net.py") == "ddp"


def test_config_option_replaces_discovery(nested):
    write(nested, {"ci.toml": 'to = "balanced"\nexclude = ["pkg/"]\n'})
    result = run_cli("--config", "ci.toml", ".", cwd=nested)
    assert result.returncode == 0, result.stderr
    assert migrated_to(nested / "train.py") == "balanced"
    assert migrated_to(nested / "pkg" / "model.py") is None
    # The vision project's own exclude does not apply under --config.
    assert migrated_to(nested / "vision" / "gen_net.py") == "balanced"
    write(nested, {"bad.toml": 'to = "dpp"\n'})
    bad = run_cli("--config", "bad.toml", "train.py", cwd=nested)
    assert bad.returncode == 2 and b"unknown target 'dpp' (expected balanced or ddp)" in bad.stderr


def test_select_and_ignore_choose_the_sites_reported(tmp_path):
    write(tmp_path, {"kept.py": TWO_SITES})

    def codes(*args):
        result = run_cli("--to", "ddp", "--check", "--fail-on", "review", *args, "kept.py", cwd=tmp_path)
        return result.returncode, sorted({line.split()[1] for line in result.stderr.decode().splitlines() if ": MGP" in line})

    assert codes() == (1, ["MGP201", "MGP232"])
    assert codes("--ignore", "MGP232") == (1, ["MGP201"])
    assert codes("--select", "MGP23") == (1, ["MGP232"])
    assert codes("--ignore", "MGP2") == (0, [])
    write(tmp_path, {"pyproject.toml": '[tool.mgpu-migrate]\nignore = ["MGP201"]\n'})
    assert codes() == (1, ["MGP232"])
    assert codes("--ignore", "mgp232") == (0, [])
    bad = run_cli("--to", "ddp", "--ignore", "MGP101", "kept.py", cwd=tmp_path)
    assert bad.returncode == 2 and b"# noqa: CODE" in bad.stderr


def test_gitignore_is_respected_in_walked_directories(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    write(
        tmp_path,
        {
            ".gitignore": "generated/\n*_tmp.py\n!keep_tmp.py\n",
            "src/.gitignore": "local.py\n",
            "src/train.py": DP_SCRIPT,
            "src/local.py": DP_SCRIPT,
            "src/run_tmp.py": DP_SCRIPT,
            "src/keep_tmp.py": DP_SCRIPT,
            "generated/model.py": DP_SCRIPT,
            "other/local.py": DP_SCRIPT,
        },
    )
    result = run_cli(".", "--to", "ddp", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    migrated = {name for name in ("src/train.py", "src/local.py", "src/run_tmp.py", "src/keep_tmp.py",
                                  "generated/model.py", "other/local.py") if migrated_to(tmp_path / name)}
    assert migrated == {"src/train.py", "src/keep_tmp.py", "other/local.py"}
    # Named explicitly, an ignored file is processed (as ruff does); respect-gitignore = false walks them all.
    assert run_cli("src/local.py", "--to", "ddp", cwd=tmp_path).returncode == 0
    assert migrated_to(tmp_path / "src" / "local.py") == "ddp"
    write(tmp_path, {"pyproject.toml": "[tool.mgpu-migrate]\nrespect-gitignore = false\n"})
    assert run_cli(".", "--to", "ddp", cwd=tmp_path).returncode == 0
    assert migrated_to(tmp_path / "generated" / "model.py") == "ddp"


def test_gitignore_outside_a_git_work_tree_is_not_read(tmp_path):
    write(tmp_path, {".gitignore": "*.py\n", "train.py": DP_SCRIPT})
    assert run_cli(".", "--to", "ddp", cwd=tmp_path).returncode == 0
    assert migrated_to(tmp_path / "train.py") == "ddp"


def test_files_named_that_are_not_python_are_skipped_with_a_note(tmp_path):
    write(tmp_path, {"notes.txt": DP_SCRIPT, "config.yaml": "model: DataParallel\n", "run": "#!/usr/bin/env python3\n" + DP_SCRIPT})
    result = run_cli("notes.txt", "config.yaml", "run", "--to", "ddp", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert b"notes.txt: skipped: not a Python file" in result.stderr
    assert b"config.yaml: skipped: not a Python file" in result.stderr
    assert (tmp_path / "notes.txt").read_text() == DP_SCRIPT
    assert migrated_to(tmp_path / "run") == "ddp"  # a script without a suffix that runs Python is migrated
    assert b"skipped" not in run_cli("-q", "notes.txt", "--to", "ddp", cwd=tmp_path).stderr


def test_diff_of_a_directory_applies_with_git_apply(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    write(tmp_path, {"train.py": DP_SCRIPT, "pkg/model.py": DP_SCRIPT})
    diff = run_cli(".", "--to", "ddp", "--diff", cwd=tmp_path).stdout
    assert b"--- a/pkg/model.py\n+++ b/pkg/model.py\n" in diff and b"a/./" not in diff
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=diff, check=True)
    assert migrated_to(tmp_path / "train.py") == migrated_to(tmp_path / "pkg" / "model.py") == "ddp"
