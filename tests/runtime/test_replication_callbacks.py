"""``DistributedDataParallel(..., replication_callbacks=True)``: the Synchronized-BatchNorm package's layers linked over
the ranks. Its exactness against DataParallel is fixtures/scripts/patched_sync_batchnorm.py's end-to-end run
(tests/codemod/test_ddp_e2e.py, at 2 and 3 processes); here, what the link does and does not do."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from torch import nn

from mgpu_runtime.distributed.replication_callbacks import _master_computes_on_the_layer, linked, told_copies
from tests.fixture_cases import FIXTURES

FIXTURE = FIXTURES / "scripts" / "patched_sync_batchnorm.py"
_LAUNCH = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}


def _layer_class() -> type:
    """The fixture's layer, its definitions run without its training."""
    namespace: dict = {}
    source = FIXTURE.read_text().split("torch.set_default_dtype")[0]
    exec(compile(source, str(FIXTURE), "exec"), namespace)
    return namespace["SynchronizedBatchNorm1d"]


class _Unknown(nn.BatchNorm1d):
    def __data_parallel_replicate__(self, ctx, copy_id):
        self.copy_id = copy_id


def test_a_layer_with_a_callback_of_another_kind_is_refused_at_the_wrap():
    with pytest.raises(TypeError, match="meets its copies through __data_parallel_replicate__ in a way the runtime"):
        told_copies(nn.Sequential(nn.Linear(2, 2), _Unknown(2)))


def test_the_layer_is_plain_again_after_the_forward():
    layer = _layer_class()(3)
    assert told_copies(nn.Sequential(layer)) == [layer]
    with linked([layer]):
        assert layer._is_parallel and layer._parallel_id == 1 and layer._slave_pipe is not None
    assert layer._is_parallel is False and layer._parallel_id is None and layer._slave_pipe is None


@pytest.mark.slow
def test_without_the_link_each_rank_normalises_its_own_rows(tmp_path):
    """The migration without ``replication_callbacks=use_sync_bn``: the last batch's two rows leave one per process,
    which a BatchNorm of its own rows refuses; the linked run (the e2e test) normalises over both."""
    migrated = FIXTURE.with_name(f"{FIXTURE.stem}.ddp.py").read_text()
    assert "replication_callbacks=use_sync_bn" in migrated
    script = tmp_path / "unlinked.py"
    script.write_text(migrated.replace(", replication_callbacks=use_sync_bn", ""))
    environment = {k: v for k, v in os.environ.items() if k not in _LAUNCH and not k.startswith(("MGPU_", "TORCHELASTIC_"))}
    environment.update(MGPU_NPROC="2", OMP_NUM_THREADS="1", FIXTURE_OUTPUT=str(tmp_path / "out.pt"))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "Expected more than 1 value per channel" in done.stdout + done.stderr


def test_the_statistics_are_computed_where_dataparallels_master_copy_computed_them():
    """The package's master holds the callback bound when the layer was built: DataParallel's master copy computes
    on the module's own layer, whose running statistics then move; a layer whose callback binds a new master to its
    replica (the fixture's) computes on the replica, and they are lost. The probe leaves the layer as it was."""
    class _Master:
        def __init__(self, callback):
            self._master_callback = callback

    class _Layer(nn.BatchNorm1d):
        rebinds = False

        def __init__(self):
            super().__init__(3)
            self._sync_master = _Master(self._data_parallel_master)
            self._is_parallel, self._parallel_id, self._slave_pipe = False, None, None

        def __data_parallel_replicate__(self, ctx, copy_id):
            self._is_parallel, self._parallel_id = True, copy_id
            if copy_id == 0 and self.rebinds:
                self._sync_master.__init__(self._data_parallel_master)
            ctx.sync_master = self._sync_master

        def _data_parallel_master(self, messages):
            return messages

        def _compute_mean_std(self, total, squares, rows):
            return total / rows, squares

    layer = _Layer()
    assert _master_computes_on_the_layer(layer)
    layer.rebinds = True
    assert not _master_computes_on_the_layer(layer)
    assert layer._sync_master._master_callback.__self__ is layer and not layer._is_parallel
