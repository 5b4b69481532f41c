"""--sync-bn from the command line to the rule: BatchNorm layers become SyncBatchNorm only when asked."""

from tests.cli_helpers import run_cli

SCRIPT = b"import torch.nn as nn\nmodel = nn.DataParallel(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))\n"


def test_sync_bn_converts_batchnorm_under_ddp():
    result = run_cli("-", "--to", "ddp", "--sync-bn", stdin=SCRIPT)
    assert result.returncode == 0, result.stderr
    assert (
        b"mgpu_runtime.DistributedDataParallel(nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(" in result.stdout
    )
    assert b"<stdin>:2:9: MGP129 " in result.stderr


def test_without_sync_bn_batchnorm_stays_per_process_as_it_was_per_gpu():
    result = run_cli("-", "--to", "ddp", stdin=SCRIPT)
    assert result.returncode == 0, result.stderr
    assert b"SyncBatchNorm" not in result.stdout
    assert b"<stdin>:2:9: MGP101 " in result.stderr
    assert b"0 sites left for a manual look" in result.stderr  # the DataParallel original's own statistics: no note
