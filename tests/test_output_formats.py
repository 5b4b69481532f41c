"""``--output-format json|github|sarif`` and ``--fail-on review``: each format read back as its consumer reads it."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from mgpu_migrate.diagnostics import Diagnostic
from mgpu_migrate.codes import lookup
from mgpu_migrate.output import Run, code_help, github
from mgpu_migrate.report import FileOutcome
from tests.cli_helpers import DP_SCRIPT, PLAIN_SCRIPT, run_cli
from tests.fixture_cases import ROOT

REPORT_SCHEMA = json.loads((ROOT / "mgpu_migrate" / "schemas" / "report-v1.json").read_text())
SARIF_SCHEMA = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
REVIEW_SCRIPT = "import torch\nm = torch.nn.DataParallel(m, dim=1)\n"
BROKEN_SCRIPT = "import torch.nn as nn\nmodel = nn.DataParallel(model\n"


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(DP_SCRIPT)
    (tmp_path / "plain.py").write_text(PLAIN_SCRIPT)
    (tmp_path / "dim.py").write_text(REVIEW_SCRIPT)
    (tmp_path / "broken.py").write_text(BROKEN_SCRIPT)
    return tmp_path


def _text_diagnostics(project, *args):
    """The default text output's diagnostics, as (path, line, col, code, message)."""
    result = run_cli(*args, cwd=project)
    found = []
    for line in result.stderr.decode().splitlines():
        match = re.match(r"(.+?):(\d+):(\d+): (MGP\d{3}) (.*)$", line)
        if match:
            path, row, col, code, message = match.groups()
            found.append((path.removeprefix("./"), int(row), int(col), code, message))
    return found


@pytest.mark.parametrize("mode", [(), ("--check",), ("--diff",)])
def test_json_matches_its_schema_and_the_text_output(project, mode, tmp_path_factory):
    import shutil

    twin = tmp_path_factory.mktemp("twin") / "project"
    shutil.copytree(project, twin)
    expected = _text_diagnostics(twin, ".", "--to", "ddp", *mode)  # in place: positions in the new files
    result = run_cli(".", "--to", "ddp", "--output-format", "json", *mode, cwd=project)
    assert result.returncode == 2, result.stderr  # broken.py
    report = json.loads(result.stdout)
    jsonschema.Draft202012Validator(REPORT_SCHEMA).validate(report)
    assert report["mode"] == {(): "write", ("--check",): "check", ("--diff",): "diff"}[mode]
    found = [(d["path"], d["line"], d["column"], d["code"], d["message"]) for d in report["diagnostics"]]
    assert found == expected
    kinds = {d["code"]: d["kind"] for d in report["diagnostics"]}
    assert kinds == {"MGP002": "error", "MGP201": "review"} | {code: "rewrite" for code in kinds if code.startswith("MGP1")}
    files = {f["path"]: f for f in report["files"]}
    assert "plain.py" not in files and files["broken.py"]["status"] == "failed" and files["broken.py"]["fix"] is None
    fix = files["pkg/train.py"]["fix"]
    assert fix["applied"] is (mode == ())
    assert fix["diff"].startswith("--- a/pkg/train.py\n+++ b/pkg/train.py\n")
    assert report["summary"] == {"changed": 1, "unchanged": 2, "failed": 1, "review": 1}


def test_json_fix_applies_with_git_apply(project):
    import subprocess

    report = json.loads(run_cli(".", "--to", "ddp", "--check", "--output-format", "json", cwd=project).stdout)
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    for entry in report["files"]:
        if entry["fix"]:
            subprocess.run(["git", "apply", "-"], cwd=project, input=entry["fix"]["diff"].encode(), check=True)
    assert "mgpu_runtime.DistributedDataParallel(model)" in (project / "pkg" / "train.py").read_text()


def test_json_from_stdin_needs_check_or_diff():
    assert run_cli("-", "--to", "ddp", "--output-format", "json", stdin=DP_SCRIPT.encode()).returncode == 2
    result = run_cli("-", "--to", "ddp", "--diff", "--output-format", "json", stdin=DP_SCRIPT.encode())
    assert result.returncode == 1
    report = json.loads(result.stdout)
    jsonschema.Draft202012Validator(REPORT_SCHEMA).validate(report)
    assert report["mode"] == "stdin" and report["files"][0]["path"] == "<stdin>"


_ANNOTATION = re.compile(r"^::(?P<level>notice|warning|error) (?P<properties>[^:]*)::(?P<message>.*)$")


def _unescape(text: str) -> str:
    return text.replace("%0A", "\n").replace("%0D", "\r").replace("%3A", ":").replace("%2C", ",").replace("%25", "%")


def parse_annotations(output: str) -> list[dict]:
    """Workflow commands read back the way the Actions runner reads them."""
    annotations = []
    for line in output.splitlines():
        match = _ANNOTATION.match(line)
        assert match, line
        properties = dict(item.split("=", 1) for item in match["properties"].split(","))
        annotations.append(
            {"level": match["level"], **{key: _unescape(value) for key, value in properties.items()},
             "message": _unescape(match["message"])}
        )
    return annotations


def test_github_annotations_parse_back_to_the_diagnostics(project):
    expected = _text_diagnostics(project, ".", "--to", "ddp", "--check", "--show-rewrites")
    result = run_cli(".", "--to", "ddp", "--check", "--show-rewrites", "--output-format", "github", cwd=project)
    assert result.returncode == 2
    annotations = parse_annotations(result.stdout.decode())
    assert [(a["file"], int(a["line"]), int(a["col"]), a["title"].split()[-1]) for a in annotations] == [
        entry[:4] for entry in expected
    ]
    levels = {a["title"].split()[-1]: a["level"] for a in annotations}
    assert levels["MGP002"] == "error" and levels["MGP201"] == "warning" and levels["MGP101"] == "notice"
    for annotation, entry in zip(annotations, expected):
        assert annotation["message"].startswith(f"{entry[3]} {entry[4]}")


def test_github_escapes_what_the_runner_decodes():
    awkward = Diagnostic("dir,with:odd%/a.py", 3, 1, "MGP201", "100% of it: a, b\nand more")
    output = github.render(Run("ddp", "check", [FileOutcome("dir,with:odd%/a.py", "unchanged", [awkward])]))
    assert output.count("\n") == 1
    (annotation,) = parse_annotations(output)
    assert annotation["file"] == "dir,with:odd%/a.py"
    assert annotation["message"].startswith("MGP201 100% of it: a, b\nand more")


def test_sarif_validates_against_the_official_schema(project):
    result = run_cli(".", "--to", "ddp", "--check", "--show-rewrites", "--output-format", "sarif", cwd=project)
    assert result.returncode == 2
    log = json.loads(result.stdout)
    jsonschema.Draft4Validator(SARIF_SCHEMA).validate(log)
    (sarif_run,) = log["runs"]
    rules = sarif_run["tool"]["driver"]["rules"]
    assert [rule["id"] for rule in rules] == sorted({r["ruleId"] for r in sarif_run["results"]})
    for rule in rules:
        summary, page = code_help(rule["id"])
        assert rule["shortDescription"]["text"] == summary and summary
        assert page and rule["help"]["markdown"] == page
        heading = "## What it does" if lookup(rule["id"]).kind == "rewrite" else "## Why it was left"
        assert heading in page or lookup(rule["id"]).kind == "error"
    for sarif_result in sarif_run["results"]:
        assert rules[sarif_result["ruleIndex"]]["id"] == sarif_result["ruleId"]
    located = {
        (r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"], r["ruleId"]): r["level"]
        for r in sarif_run["results"]
    }
    assert located[("dim.py", "MGP201")] == "warning" and located[("broken.py", "MGP002")] == "error"
    assert located[("pkg/train.py", "MGP101")] == "note"


def test_fail_on_review_blocks_on_sites_left_for_a_person(project):
    (project / "broken.py").unlink()
    (project / "dim.py").unlink()
    (project / "kept.py").write_text("import torch\nm = torch.nn.DataParallel(m)\nn = torch.nn.DataParallel(n, dim=1)\n")
    migrated = run_cli("pkg", "--to", "ddp", cwd=project)
    assert migrated.returncode == 0
    # Nothing would change and no site is left: 0 under either policy.
    assert run_cli("pkg", "--to", "ddp", "--check", "--fail-on", "review", cwd=project).returncode == 0
    # kept.py would not change (--to ddp leaves the file), so plain --check passes it; --fail-on review does not.
    assert run_cli("kept.py", "--to", "ddp", "--check", cwd=project).returncode == 0
    blocked = run_cli("kept.py", "--to", "ddp", "--check", "--fail-on", "review", cwd=project)
    assert blocked.returncode == 1 and b"kept.py:3:5: MGP201" in blocked.stderr
    assert run_cli("kept.py", "--to", "ddp", "--fail-on", "review", cwd=project).returncode == 1
    # A file that cannot be processed is still 2.
    (project / "broken.py").write_text(BROKEN_SCRIPT)
    assert run_cli(".", "--to", "ddp", "--check", "--fail-on", "review", cwd=project).returncode == 2


def test_full_text_shows_the_line_of_code_as_it_now_is(tmp_path):
    (tmp_path / "train.py").write_text(DP_SCRIPT)
    (tmp_path / "dim.py").write_text(REVIEW_SCRIPT)
    result = run_cli("train.py", "dim.py", "--to", "balanced", "--output-format", "full", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.decode().splitlines()
    at = lines.index("train.py:4:9: MGP101 DataParallel replaced with mgpu_runtime.DataParallelModel")
    # The rewritten file's line 4, with the caret under column 9.
    assert lines[at + 1] == "    4 | model = mgpu_runtime.DataParallelModel(model)"
    assert lines[at + 2] == "      |         ^"
    assert lines[at + 3] == "      = help: mgpu-migrate --explain MGP101"
    (tmp_path / "dim.py").write_text(REVIEW_SCRIPT)  # balanced rewrote it
    concise = run_cli("dim.py", "--to", "ddp", "--output-format", "concise", cwd=tmp_path)
    assert concise.stderr.decode().splitlines()[0] == (
        "dim.py:2:5: MGP201 DataParallel with dim != 0 has no DistributedDataParallel equivalent; not rewritten"
    )


ODD_NAMES = ["new\nline.py", "tab\tname.py", 'quo"te.py', "back\\slash.py", "bell\a.py", "caf\u00e9 au lait.py"]
# Characters str.splitlines() breaks at but Python does not: a diff split there said "No newline at end of
# file" in the middle of the file, and git apply refused it.
NOT_LINE_BREAKS = "\x0c\n# page \x1c one \x85 two \u2028 three\n"


@pytest.mark.parametrize("how", ["diff", "json"])
def test_diffs_of_odd_file_names_and_lines_apply_with_git_apply(tmp_path, how):
    """A name with a newline broke the header line of the text diff and of the JSON fix; git quotes such
    names, and so does the tool."""
    import subprocess

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    source = DP_SCRIPT + NOT_LINE_BREAKS + "print(model)\n"
    for name in ODD_NAMES:
        (tmp_path / name).write_text(source)
    if how == "diff":
        result = run_cli("--to", "ddp", "--diff", *ODD_NAMES, cwd=tmp_path)
        patches = [result.stdout.decode()]
    else:
        result = run_cli("--to", "ddp", "--check", "--output-format", "json", *ODD_NAMES, cwd=tmp_path)
        patches = [entry["fix"]["diff"] for entry in json.loads(result.stdout)["files"]]
        assert len(patches) == len(ODD_NAMES)
    assert result.returncode == 1, result.stderr
    assert any('--- "a/new\\nline.py"\n+++ "b/new\\nline.py"\n' in patch for patch in patches)
    for patch in patches:
        subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=patch.encode(), check=True)
    expected = run_cli("-", "--to", "ddp", stdin=source.encode()).stdout.decode()
    assert "DistributedDataParallel" in expected
    for name in ODD_NAMES:
        assert (tmp_path / name).read_text() == expected, name


def test_check_reports_what_needs_a_person_and_names_the_files_that_would_change(project):
    """--check leaves the rewrites out of every format (a CI job's annotations are the sites for a person and
    the errors); --show-rewrites lists them, and a run that writes lists them unless --hide-rewrites."""
    github = run_cli(".", "--to", "ddp", "--check", "--output-format", "github", cwd=project)
    levels = [a["level"] for a in parse_annotations(github.stdout.decode())]
    assert sorted(levels) == ["error", "warning"]  # broken.py's MGP002, dim.py's MGP201
    shown = run_cli(".", "--to", "ddp", "--check", "--show-rewrites", "--output-format", "github", cwd=project)
    assert "notice" in [a["level"] for a in parse_annotations(shown.stdout.decode())]
    sarif = json.loads(run_cli(".", "--to", "ddp", "--check", "--output-format", "sarif", cwd=project).stdout)
    assert {result["ruleId"] for result in sarif["runs"][0]["results"]} == {"MGP002", "MGP201"}

    text = run_cli(".", "--to", "ddp", "--check", cwd=project).stderr.decode().splitlines()
    assert "pkg/train.py: would be migrated (--show-rewrites lists the rewrites)" in text
    assert not [line for line in text if ": MGP1" in line]
    assert not [line for line in run_cli(".", "--to", "ddp", "--check", "-q", cwd=project).stderr.decode().splitlines()
                if "would be migrated" in line]

    hidden = run_cli("pkg", "--to", "ddp", "--hide-rewrites", "--output-format", "github", cwd=project)
    assert hidden.returncode == 0 and hidden.stdout == b""
    assert "mgpu_runtime" in (project / "pkg" / "train.py").read_text()  # written all the same
