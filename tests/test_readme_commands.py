"""The README's commands, run as a user would: its console examples print what it shows, its GitHub
Actions job annotates a pull request (run here the same way, output parsed back), its shell and SLURM
scripts are valid, and its marker example is a marker the tool reads."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import jsonschema
import yaml

from mgpu_migrate.output.markers import marked
from tests.cli_helpers import run_cli
from tests.fixture_cases import ROOT
from tests.test_output_formats import SARIF_SCHEMA, parse_annotations

README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def test_console_examples_print_what_the_readme_shows():
    examples = blocks("console")
    assert examples
    for block in examples:
        for command, shown in re.findall(r"^\$ (mgpu-migrate[^\n]*)\n(.*?)(?=^\$ |\Z)", block, re.S | re.M):
            printed = run_cli(*command.split()[1:], cwd=ROOT)
            assert printed.returncode in (0, 1), printed.stderr
            assert printed.stdout.decode().splitlines() == shown.splitlines(), command


def test_the_github_actions_job_annotates_a_pull_request(tmp_path):
    (workflow,) = [yaml.safe_load(block) for block in blocks("yaml") if "jobs:" in block]
    steps = {step.get("name"): step for step in workflow["jobs"]["review"]["steps"]}
    repository = tmp_path / "project"
    (repository / "models").mkdir(parents=True)
    shutil.copy(ROOT / "fixtures" / "shapes" / "dim_one.py", repository / "models" / "dim_one.py")
    shutil.copy(ROOT / "fixtures" / "scripts" / "flat_script.py", repository / "train.py")
    subprocess.run(["git", "init", "-q"], cwd=repository, check=True)

    annotate = subprocess.run(["bash", "-c", steps["Annotate the pull request"]["run"]], cwd=repository,
                              capture_output=True, text=True, timeout=120)
    assert annotate.returncode == 1  # the job fails: a file would change and a site needs a person
    annotations = parse_annotations(annotate.stdout)
    warnings = [(a["file"], a["line"], a["title"]) for a in annotations if a["level"] == "warning"]
    assert ("models/dim_one.py", "6", "mgpu-migrate MGP201") in warnings
    assert {a["file"] for a in annotations} == {"models/dim_one.py", "train.py"}

    sarif = subprocess.run(["bash", "-c", steps["SARIF for code scanning"]["run"]], cwd=repository, timeout=120)
    assert sarif.returncode == 0
    log = json.loads((repository / "mgpu-migrate.sarif").read_text())
    jsonschema.Draft4Validator(SARIF_SCHEMA).validate(log)
    assert {r["ruleId"] for r in log["runs"][0]["results"]} >= {"MGP201", "MGP101"}


def test_shell_and_slurm_scripts_parse():
    scripts = blocks("bash")
    assert any("#SBATCH --nodes=2" in script for script in scripts)
    assert any("torchrun --nnodes=2" in script for script in scripts)
    for script in scripts:
        result = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
        assert result.returncode == 0, result.stderr


def test_the_marker_example_is_a_marker_the_tool_reports():
    (example,) = [block for block in blocks("python") if "mgpu-migrate: review" in block]
    (diagnostic,) = marked("train.py", example)
    assert diagnostic.code == "MGP262" and diagnostic.line == 2
