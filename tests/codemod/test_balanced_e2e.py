"""End to end, --to balanced: each runnable fixture script's committed migration trains as its original does under
nn.DataParallel on the same number of devices.

The reference is the original under the emulated DataParallel on 2 and 3 devices; the migration runs with
``MGPU_CPU_REPLICAS=2`` and ``=3`` (the CPU replicas emulate as many devices, so a ``device_count() > 1`` guard
wraps as on GPUs), in float64: the final weights agree to 1e-9 and the printed lines are the same. Each run must
really have split its batches over the replicas (``tests/codemod/e2e_runs.py`` counts them).
"""

from __future__ import annotations

import pytest

from tests.codemod.e2e_runs import BALANCED_SCRIPTS, LEGACY_ASYNC, WORLD_SIZES, compare
from tests.codemod.test_ddp_e2e import UNTRAINABLE_ON_SEVERAL

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

SCRIPTS = [script for script in BALANCED_SCRIPTS if script != UNTRAINABLE_ON_SEVERAL]


@pytest.mark.parametrize("replicas", WORLD_SIZES)
@pytest.mark.parametrize("script", SCRIPTS)
def test_the_migration_trains_as_dataparallel_on_as_many_devices(e2e_runs, script, replicas):
    assert compare(e2e_runs, script, f"emulated{replicas}", f"balanced{replicas}") == []
    # At most `replicas`: main_argparse's device_ids=list(range(args.gpus)) asks for two of three.
    assert 1 < e2e_runs(script, f"balanced{replicas}").replicas <= replicas


@pytest.mark.parametrize("replicas", WORLD_SIZES)
def test_a_script_dataparallel_cannot_train_on_several_devices_fails_as_it_did(e2e_runs, replicas):
    """MGP340 keeps the wrap under --to balanced: on several replicas the migration fails as DataParallel did."""
    failure = e2e_runs(UNTRAINABLE_ON_SEVERAL, f"balanced{replicas}").failure
    assert failure is not None and "grad can be implicitly created only for scalar outputs" in failure


@pytest.mark.parametrize("replicas", WORLD_SIZES)
def test_a_script_with_pytorch_03s_async_keyword_trains_as_dataparallel_once_migrated(e2e_runs, replicas):
    assert compare(e2e_runs, LEGACY_ASYNC.stem, f"emulated{replicas}", f"balanced{replicas}") == []
    assert 1 < e2e_runs(LEGACY_ASYNC.stem, f"balanced{replicas}").replicas <= replicas
