"""--jobs: files are migrated on worker processes only when they are enough work, and what is printed
does not depend on how many processes did the work."""

import subprocess
import sys

import pytest

from mgpu_migrate.report import workers_for
from tests.cli_helpers import DP_SCRIPT, PLAIN_SCRIPT, run_cli

# Enough source for the six scripts to be worth a second process (report.BYTES_PER_WORKER beside the
# largest), as a long module docstring: one token, so the tests do not parse any more code for it.
DOCUMENTED = '"""' + "What this training script does, at length. " * 200 + '"""\n' + DP_SCRIPT


@pytest.fixture
def tree(tmp_path):
    for index in range(6):
        package = tmp_path / f"pkg{index % 3}"
        package.mkdir(exist_ok=True)
        (package / f"train_{index}.py").write_text(DOCUMENTED + f"step = {index}\n")
        (package / f"plain_{index}.py").write_text(PLAIN_SCRIPT)
    (tmp_path / "pkg0" / "dim.py").write_text("import torch\nm = torch.nn.DataParallel(m, dim=1)\n")
    (tmp_path / "pkg1" / "broken.py").write_text("import torch.nn as nn\nmodel = nn.DataParallel(model\n")
    return tmp_path


def test_output_is_the_same_whatever_the_number_of_jobs(tree):
    runs = [run_cli("--diff", "--to", "ddp", "--jobs", jobs, ".", cwd=tree) for jobs in ("1", "2", "5")]
    assert all(run.returncode == 2 for run in runs)
    assert runs[0].stdout.count(b"+++ b/") == 6
    assert runs[0].stderr.count(b"MGP101") == 6 and b"MGP201" in runs[0].stderr and b"MGP002" in runs[0].stderr
    for run in runs[1:]:
        assert (run.stdout, run.stderr) == (runs[0].stdout, runs[0].stderr)


def test_in_place_rewrites_are_the_same_on_several_processes(tree, tmp_path_factory):
    serial = tmp_path_factory.mktemp("serial")
    subprocess.run(["cp", "-a", f"{tree}/.", str(serial)], check=True)
    assert run_cli("--to", "balanced", "-j", "1", ".", cwd=serial).returncode == 2
    assert run_cli("--to", "balanced", "-j", "2", ".", cwd=tree).returncode == 2
    for path in serial.rglob("*.py"):
        assert (tree / path.relative_to(serial)).read_bytes() == path.read_bytes(), path


def test_jobs_must_be_positive(tree):
    assert run_cli("--to", "ddp", "--jobs", "0", ".", cwd=tree).returncode == 2


PROBE = """
import sys
from pathlib import Path
from mgpu_migrate.report import process_files

files = sorted(str(path) for path in Path(sys.argv[1]).rglob("*.py"))
outcomes = process_files(files, "ddp", write=False, want_diff=False, jobs=int(sys.argv[2]))
changed = sum(outcome.status == "changed" for outcome in outcomes)
print(changed, "libcst" in sys.modules, "concurrent.futures.process" in sys.modules)
"""


def probe(directory, jobs):
    command = [sys.executable, "-c", PROBE, str(directory), str(jobs)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    return result.stdout.split()


def test_a_tree_with_nothing_to_migrate_starts_no_worker_and_no_parser(tmp_path):
    for index in range(20):
        (tmp_path / f"plain_{index}.py").write_text(f"import torch\nx = torch.ones({index})\n")
    (tmp_path / "ddp.py").write_text("import torch\nm = torch.nn.parallel.DistributedDataParallel(m)\n")
    assert probe(tmp_path, jobs=4) == ["0", "False", "False"]


def test_files_to_migrate_go_to_workers_when_they_are_enough_work(tree):
    assert probe(tree, jobs=2) == ["6", "True", "True"]
    assert probe(tree, jobs=1) == ["6", "True", "False"]


def test_a_few_small_files_are_migrated_here_whatever_the_jobs(tmp_path):
    for index in range(8):
        (tmp_path / f"train_{index}.py").write_text(DP_SCRIPT + f"step = {index}\n")
    assert probe(tmp_path, jobs=2) == ["8", "True", "False"]


def test_the_number_of_workers_follows_the_work_beside_the_largest_file():
    # Megatron-LM's 8 files that reach the parser (of 1,344): one of 114 kB, the rest 79 kB together.
    assert workers_for([114_374, 35_190, 21_598, 7_439, 4_150, 4_150, 4_062, 2_454], jobs=2) == 2
    assert workers_for([114_374, 35_190, 21_598, 7_439, 4_150, 4_150, 4_062, 2_454], jobs=8) == 3
    assert workers_for([], jobs=4) == workers_for([500_000], jobs=4) == 1
    assert workers_for([500_000, 20_000, 5_000], jobs=4) == 1  # nothing much beside the largest
    assert workers_for([20_000] * 8, jobs=8) == 4  # one more for each 40 kB beside the largest file
    assert workers_for([400_000] * 4, jobs=8) == 2  # and at least MIN_FILES_PER_WORKER files each
    assert workers_for([90] * 300, jobs=2) == 2  # many small files: their fixed costs add up
    assert workers_for([40_000] * 8, jobs=1) == 1
