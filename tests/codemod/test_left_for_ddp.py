"""What torch's DDP cannot run that DataParallel could (MGP370 under ``--style torch``, MGP371): ``--to ddp``
leaves the file, and the migration the diagnostic prevents fails when it runs. (The default style migrates the
first, with ``reduce_each_backward=True``, MGP108: ``test_project_shapes_e2e.py`` runs it.)

Each reduction (``fixtures/scripts/two_backward_passes.py``: generative-inpainting-pytorch's two backward passes
over one forward of its trainer module; ``fixtures/scripts/replica_queues.py``: CCNet's InPlaceABNSync, whose
replicas meet through queues and a barrier) trains under the emulated DataParallel and as its balanced migration
in the shared end-to-end runs (``test_balanced_e2e.py``). Here: silenced at its site (``# noqa: CODE``), the file
is migrated (for the backward passes: the default style's ``reduce_each_backward=True`` silenced at the wrap), and
that migration, run under ``torchrun --nproc_per_node=2`` (gloo, the CPU), stops with torch's error (the second
backward pass) or with the runtime's refusal at the wrap (the layer linked across threads).
"""

from __future__ import annotations

import sys

import pytest

from mgpu_migrate.engine import migrate_source
from mgpu_migrate.options import DDP, DEFAULT_OPTIONS
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS
from tests.codemod.e2e_runs import DRIVER, Run, finish, plan
from tests.fixture_cases import FIXTURES

SCRIPTS = FIXTURES / "scripts"
# script -> (the code that leaves it, what the run of its silenced migration fails with, the styles that leave it,
# the code silenced for that run: the leaving one, or the default style's rewrite that makes it train)
CASES = {
    "two_backward_passes": ("MGP370", "Expected to mark a variable ready only once", (TORCH_OPTIONS,), "MGP108"),
    "replica_queues": (
        "MGP371",
        "meets its copies across nn.DataParallel's replica threads through queues or barriers",
        (DEFAULT_OPTIONS, TORCH_OPTIONS),
        "MGP371",
    ),
}


def _codes(result) -> list[str]:
    return [diagnostic.code for diagnostic in result.diagnostics]


def _silenced(name: str) -> str:
    """The script with ``# noqa: CODE`` on the line where the default style reports the silenced code."""
    code = CASES[name][3]
    source = (SCRIPTS / f"{name}.py").read_text()
    (line,) = [d.line for d in migrate_source(source, DDP, f"{name}.py").diagnostics if d.code == code]
    lines = source.splitlines(keepends=True)
    lines[line - 1] = f"{lines[line - 1].rstrip()}  # noqa: {code}\n"
    return "".join(lines)


@pytest.mark.parametrize("name", CASES)
def test_the_file_is_left_and_a_noqa_at_the_site_migrates_it(name):
    code, _, styles, silenced = CASES[name]
    source = (SCRIPTS / f"{name}.py").read_text()
    for options in styles:
        left = migrate_source(source, DDP, f"{name}.py", options=options)
        assert left.output == source and code in _codes(left)
    migrated = migrate_source(_silenced(name), DDP, f"{name}.py")
    assert code not in _codes(migrated) and silenced not in _codes(migrated)
    assert "mgpu_runtime.DistributedDataParallel(" in migrated.output and "reduce_each_backward=True)" not in migrated.output
    assert "nn.DataParallel(" not in migrated.output


def test_the_default_style_sums_the_gradients_after_each_backward_pass():
    source = (SCRIPTS / "two_backward_passes.py").read_text()
    migrated = migrate_source(source, DDP, "two_backward_passes.py")
    assert "MGP370" not in _codes(migrated) and "MGP108" in _codes(migrated)
    assert "mgpu_runtime.DistributedDataParallel(trainer, reduce_each_backward=True)" in migrated.output


@pytest.mark.slow
def test_the_migration_the_diagnostic_prevents_fails_under_torchrun(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    jobs = {}
    for name in CASES:
        script = tmp_path / f"{name}.ddp.py"
        script.write_text(migrate_source(_silenced(name), DDP, f"{name}.py").output)
        jobs[name] = [*torchrun, str(driver), plan([(script, name, None, None)], tmp_path)]
    assert finish(jobs, tmp_path) == []  # the driver writes each run's failure down, and the job ends
    for name, (code, failure, _, _) in CASES.items():
        run = Run(tmp_path / f"{name}.pt")
        assert run.failure is not None and failure in run.failure, (code, run.failure)
