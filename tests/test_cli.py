"""The command line as a user calls it: exit codes, modes, files, and what is printed."""

import os
import stat
import subprocess
import sys

import pytest

from tests.cli_helpers import DP_SCRIPT, PLAIN_SCRIPT, run_cli


@pytest.fixture
def project(tmp_path):
    (tmp_path / "train.py").write_text(DP_SCRIPT)
    (tmp_path / "plain.py").write_text(PLAIN_SCRIPT)
    return tmp_path


def test_rewrites_in_place_and_exits_0(project):
    result = run_cli("train.py", "--to", "balanced", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "mgpu_runtime.DataParallelModel(model)" in (project / "train.py").read_text()
    # The position is in the file as rewritten (the import added above moved the wrap to line 4).
    assert b"train.py:4:9: MGP101 " in result.stderr
    assert b"1 file migrated to balanced, 0 unchanged, 0 failed" in result.stderr


def test_nothing_to_do_exits_0_and_leaves_bytes(project):
    before = (project / "plain.py").read_bytes()
    mtime = os.stat(project / "plain.py").st_mtime_ns
    result = run_cli("plain.py", "--to", "ddp", cwd=project)
    assert result.returncode == 0
    assert (project / "plain.py").read_bytes() == before
    assert os.stat(project / "plain.py").st_mtime_ns == mtime


def test_check_exits_1_and_writes_nothing(project):
    result = run_cli("--check", "--to", "ddp", ".", cwd=project)
    assert result.returncode == 1
    assert (project / "train.py").read_text() == DP_SCRIPT
    assert result.stdout == b""
    assert run_cli("--check", "--to", "ddp", "plain.py", cwd=project).returncode == 0


def test_diff_prints_unified_diff_exits_1_and_writes_nothing(project):
    result = run_cli("--diff", "--to", "ddp", "train.py", cwd=project)
    assert result.returncode == 1
    assert (project / "train.py").read_text() == DP_SCRIPT
    diff = result.stdout.decode()
    assert diff.startswith("--- a/train.py\n+++ b/train.py\n@@ ")
    assert "-model = nn.DataParallel(model)\n" in diff
    assert "+model = mgpu_runtime.DistributedDataParallel(model)\n" in diff


def test_stdin_to_stdout(project):
    result = run_cli("-", "--to", "balanced", stdin=DP_SCRIPT.encode())
    assert result.returncode == 0
    assert b"model = mgpu_runtime.DataParallelModel(model)\n" in result.stdout
    assert b"<stdin>:3:9: MGP101" in result.stderr
    unchanged = run_cli("-", "--to", "balanced", stdin=PLAIN_SCRIPT.encode())
    assert unchanged.returncode == 0 and unchanged.stdout == PLAIN_SCRIPT.encode()
    assert run_cli("-", "--to", "ddp", "--check", stdin=DP_SCRIPT.encode()).returncode == 1


def test_directory_tree_is_walked_recursively(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "deep.py").write_text(DP_SCRIPT)
    (tmp_path / "pkg" / "top.py").write_text(DP_SCRIPT)
    (tmp_path / "pkg" / "notes.txt").write_text(DP_SCRIPT)
    (tmp_path / "pkg" / ".hidden").mkdir()
    (tmp_path / "pkg" / ".hidden" / "skipped.py").write_text(DP_SCRIPT)
    result = run_cli("pkg", "--to", "ddp", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "DistributedDataParallel" in (tmp_path / "pkg" / "sub" / "deep.py").read_text()
    assert "DistributedDataParallel" in (tmp_path / "pkg" / "top.py").read_text()
    assert (tmp_path / "pkg" / "notes.txt").read_text() == DP_SCRIPT
    assert (tmp_path / "pkg" / ".hidden" / "skipped.py").read_text() == DP_SCRIPT
    lines = [line for line in result.stderr.decode().splitlines() if "MGP101" in line]
    assert lines == sorted(lines) and len(lines) == 2


def test_syntax_error_file_among_good_ones_exits_2(project):
    broken = "import torch.nn as nn\nmodel = nn.DataParallel(model\nprint 'py2'\n"
    (project / "broken.py").write_text(broken)
    result = run_cli(".", "--to", "ddp", cwd=project)
    assert result.returncode == 2
    assert (project / "broken.py").read_text() == broken
    assert "DistributedDataParallel" in (project / "train.py").read_text()
    error_lines = [line for line in result.stderr.decode().splitlines() if "MGP002" in line]
    assert len(error_lines) == 1 and error_lines[0].startswith("broken.py:")
    assert "1 failed" in result.stderr.decode()


def test_missing_path_exits_2(project):
    result = run_cli("nope.py", "--to", "ddp", cwd=project)
    assert result.returncode == 2
    assert b"nope.py:1:1: MGP001" in result.stderr


@pytest.mark.parametrize(
    "args",
    [("train.py",), ("--to", "sideways", "train.py"), ("--to", "ddp"), ("--to", "ddp", "-", "train.py"), ("--bogus",)],
)
def test_usage_errors_exit_2(project, args):
    result = run_cli(*args, cwd=project)
    assert result.returncode == 2
    assert (project / "train.py").read_text() == DP_SCRIPT


def test_target_from_pyproject(project):
    (project / "pyproject.toml").write_text('[tool.mgpu-migrate]\nto = "ddp"\n')
    result = run_cli("train.py", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "DistributedDataParallel" in (project / "train.py").read_text()


def test_bad_pyproject_setting_is_a_usage_error(project):
    (project / "pyproject.toml").write_text('[tool.mgpu-migrate]\nto = "sideways"\n')
    assert run_cli("train.py", cwd=project).returncode == 2


def test_crlf_and_file_mode_are_kept(project):
    path = project / "train.py"
    path.write_bytes(DP_SCRIPT.replace("\n", "\r\n").encode())
    os.chmod(path, 0o751)
    assert run_cli("train.py", "--to", "ddp", cwd=project).returncode == 0
    data = path.read_bytes()
    assert b"mgpu_runtime.DistributedDataParallel(model)\r\n" in data
    assert b"\n" not in data.replace(b"\r\n", b"")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o751


def test_encoding_and_bom_are_kept(project):
    path = project / "latin.py"
    path.write_bytes("# -*- coding: latin-1 -*-\n# caf\xe9\n".encode("latin-1") + DP_SCRIPT.encode())
    bom = project / "bom.py"
    bom.write_bytes(b"\xef\xbb\xbf" + DP_SCRIPT.encode())
    assert run_cli("latin.py", "bom.py", "--to", "balanced", cwd=project).returncode == 0
    assert path.read_bytes().startswith("# -*- coding: latin-1 -*-\n# caf\xe9\n".encode("latin-1"))
    assert b"DataParallelModel" in path.read_bytes()
    assert bom.read_bytes().startswith(b"\xef\xbb\xbfimport")


def test_second_run_changes_nothing(project):
    assert run_cli("train.py", "--to", "ddp", cwd=project).returncode == 0
    once = (project / "train.py").read_bytes()
    again = run_cli("train.py", "--to", "ddp", "--check", cwd=project)
    assert again.returncode == 0
    assert (project / "train.py").read_bytes() == once


def test_review_sites_are_reported_and_counted(project):
    (project / "dim.py").write_text("import torch\nm = torch.nn.DataParallel(m, dim=1)\n")
    result = run_cli("dim.py", "--to", "ddp", cwd=project)
    assert result.returncode == 0
    assert b"dim.py:2:5: MGP201 " in result.stderr
    assert b"1 site left for a manual look" in result.stderr


def test_noqa_silences_a_site(project):
    (project / "kept.py").write_text("import torch\nm = torch.nn.DataParallel(m)  # noqa: MGP101\n")
    result = run_cli("kept.py", "--to", "ddp", "--check", cwd=project)
    assert result.returncode == 0


def test_version_help_and_explain():
    assert run_cli("--version").stdout.startswith(b"mgpu-migrate, version ")
    help_text = run_cli("--help").stdout.decode()
    for option in ("--to", "--diff", "--check", "--version"):
        assert option in help_text
    explained = run_cli("--explain", "MGP201")
    assert explained.returncode == 0 and explained.stdout.startswith(b"# MGP201 ") and b"## What to do" in explained.stdout
    assert run_cli("--explain", "MGP999").returncode == 2


def test_quiet_prints_only_review_sites_and_stdin_filename_names_them(project):
    source = b"import torch\nm = torch.nn.DataParallel(m)\nn = torch.nn.DataParallel(n, dim=1)\n"
    result = run_cli("-", "--to", "ddp", "-q", "--stdin-filename", "train.py", stdin=source)
    assert result.returncode == 0
    lines = result.stderr.decode().splitlines()
    assert [line.split(" ")[:2] for line in lines] == [["train.py:2:5:", "MGP232"], ["train.py:3:5:", "MGP201"]]


def test_readme_example_diff_is_what_the_tool_prints():
    import re

    from tests.fixture_cases import ROOT

    readme = (ROOT / "README.md").read_text()
    command, shown = re.search(r"```diff\n\$ (mgpu-migrate[^\n]*)\n(.*?)```", readme, re.S).groups()
    printed = run_cli(*command.split()[1:], cwd=ROOT).stdout.decode()
    # Markdown keeps no trailing spaces: compare line by line without them.
    assert [line.rstrip() for line in shown.splitlines()] == [line.rstrip() for line in printed.splitlines()]


def test_the_users_syntax_warnings_are_not_printed(tmp_path):
    """CPython warns about `x is "literal"` when it compiles the file; the tool compiles it (and the rewrite)
    only to check the syntax, so neither compile prints the warning, nor makes it an error under -W error."""
    script = tmp_path / "train.py"
    script.write_text('import os\nimport torch.nn as nn\nif os.name is "nt":\n    pass\nmodel = nn.DataParallel(model)\n')
    for flags in ([], ["-W", "error"]):
        result = subprocess.run(
            [sys.executable, *flags, "-m", "mgpu_migrate", "--to", "ddp", "--diff", str(script)],
            capture_output=True, text=True, timeout=120, check=False,
        )
        assert result.returncode == 1, result.stderr
        assert "Warning" not in result.stderr and "MGP101" in result.stderr


def test_a_noqa_that_keeps_a_whole_file_or_silences_nothing_is_said(tmp_path):
    kept = "import torch.nn as nn\nmodel = nn.DataParallel(nn.Linear(2, 2))  # noqa: MGP101\n"
    (tmp_path / "kept.py").write_text(kept)
    result = run_cli("kept.py", "--to", "ddp", "--check", "--fail-on", "review", cwd=tmp_path)
    assert result.returncode == 1  # a site for a person: the file stays DataParallel
    (line,) = [line for line in result.stderr.decode().splitlines() if line.startswith("kept.py:")]
    assert line.startswith("kept.py:2:9: MGP351 the `# noqa` here (MGP101) keeps this DataParallel")
    # Said on purpose, it is silent.
    (tmp_path / "kept.py").write_text(kept.replace("MGP101", "MGP101, MGP351"))
    assert run_cli("kept.py", "--to", "ddp", "--check", "--fail-on", "review", cwd=tmp_path).returncode == 0

    stale = "import torch.nn as nn\nmodel = nn.DataParallel(nn.Linear(2, 2))  # noqa: F401\nx = 1  # noqa: MGP101, MGP999\n"
    (tmp_path / "stale.py").write_text(stale)
    said = run_cli("stale.py", "--to", "balanced", "--diff", cwd=tmp_path).stderr.decode().splitlines()
    assert "stale.py:3:1: MGP350 `# noqa: MGP101` silences nothing on this line: remove it" in said
    assert "stale.py:3:1: MGP350 `# noqa: MGP999`: mgpu-migrate has no code MGP999 (--list-codes)" in said
    assert not [line for line in said if "F401" in line]  # another tool's code is not judged


def test_a_filtered_device_ids_comprehension_names_gpus_not_the_first_n(tmp_path):
    (tmp_path / "train.py").write_text(
        "import torch.nn as nn\nmodel = nn.DataParallel(nn.Linear(2, 2), device_ids=[i for i in range(8) if i != 3])\n"
    )
    result = run_cli("train.py", "--to", "ddp", "--check", cwd=tmp_path)
    said = result.stderr.decode()
    assert "MGP283 `device_ids=[i for i in range(8) if i != 3]` names the GPUs to use" in said
    assert "first" not in said and result.returncode == 0


def test_sync_bn_under_balanced_is_a_usage_error(tmp_path):
    script = "import torch.nn as nn\nmodel = nn.DataParallel(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))\n"
    (tmp_path / "train.py").write_text(script)
    refused = run_cli("train.py", "--to", "balanced", "--sync-bn", cwd=tmp_path)
    assert refused.returncode == 2
    assert "--sync-bn is a choice of --to ddp; --to balanced keeps DataParallel's per-device BatchNorm" in refused.stderr.decode()
    (tmp_path / "pyproject.toml").write_text("[tool.mgpu-migrate]\nsync-bn = true\n")
    from_settings = run_cli("train.py", "--to", "balanced", cwd=tmp_path)
    assert from_settings.returncode == 2 and b"sync-bn = true (" in from_settings.stderr
    assert (tmp_path / "train.py").read_text() == script
    assert run_cli("train.py", "--to", "balanced", "--no-sync-bn", cwd=tmp_path).returncode == 0


def test_a_diff_of_a_file_outside_the_current_directory_applies_from_the_work_trees_top(tmp_path):
    import subprocess

    (tmp_path / "scripts").mkdir()
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "train.py").write_text(DP_SCRIPT)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    diff = run_cli("../models/train.py", "--to", "ddp", "--diff", cwd=tmp_path / "scripts")
    assert diff.returncode == 1, diff.stderr
    assert diff.stdout.decode().splitlines()[:2] == ["--- a/models/train.py", "+++ b/models/train.py"]
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=diff.stdout, check=True)
    assert "mgpu_runtime.DistributedDataParallel(model)" in (tmp_path / "models" / "train.py").read_text()
    # Inside the current directory the path stays the one given, without ./
    (tmp_path / "scripts" / "job.py").write_text(DP_SCRIPT)
    inside = run_cli("./job.py", "--to", "ddp", "--diff", cwd=tmp_path / "scripts")
    assert inside.stdout.decode().splitlines()[0] == "--- a/job.py"


def test_a_dry_run_says_its_rewrites_as_what_a_run_would_do(tmp_path):
    (tmp_path / "train.py").write_text(DP_SCRIPT)
    for mode in (["--diff"], ["--check", "--show-rewrites"]):
        said = run_cli("train.py", "--to", "ddp", *mode, cwd=tmp_path).stderr.decode()
        assert "train.py:3:9: MGP101 would be: DataParallel replaced with mgpu_runtime.DistributedDataParallel" in said
        assert "would be migrated to ddp" in said
    written = run_cli("train.py", "--to", "ddp", cwd=tmp_path).stderr.decode()
    assert "MGP101 DataParallel replaced with" in written and "would be" not in written
