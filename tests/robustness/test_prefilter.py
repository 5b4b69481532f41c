"""The bytes pre-filter skips files that cannot hold a site, and never one that can."""

import pytest

from mgpu_migrate.engine import might_need_migration
from tests.cli_helpers import run_cli
from tests.robustness.shapes import SITES


@pytest.mark.parametrize(
    "source",
    [
        *(site for site in SITES if "DataParallel" in site),
        "from torch.nn import DataParallel as DP\nmodel = DP(model)",
        "from torch.nn import parallel\nmodel = parallel.DataParallel(model)",
        "import torch.nn.parallel.data_parallel as dp_module\nmodel = dp_module.DataParallel(model)",
        "out = nn.parallel.data_parallel(model, inputs)",
        "from torch.nn.parallel import data_parallel",
        "from torch.nn.parallel import (\n    replicate,\n    data_parallel,\n)",
        "from torch.nn.parallel import replicate, data_parallel as dp",
        "f = torch.nn.parallel . data_parallel",
        "from encoding.parallel import DataParallelModel, DataParallelCriterion",
        "from .parallel import DataParallelCriterion",
        "from apex.parallel import DistributedDataParallel as DDP",
        "import apex\nmodel = apex.parallel.DistributedDataParallel(model)",
        "from apex import parallel\nmodel = parallel.DistributedDataParallel(model)",
        "from apex import amp, parallel",
        "from apex import (\n    amp,\n    parallel,\n)",
        "from apex import amp, \\\n    parallel",
        "import apex.parallel as apex_parallel",
        "import apex as ax\nmodel = ax.parallel.DistributedDataParallel(model)",
        "class MyDataParallel(nn.DataParallel):\n    pass",
        "wrapper = getattr(nn, 'DataParallel')",
        # A project's own copies of DataParallel, called by names that start with the words (first-order-model,
        # WaveRNN): the project reading names them (MGP280, MGP281).
        "generator = DataParallelWithCallback(generator, device_ids=[0])",
        "y = data_parallel_workaround(model, x)",
        "y = data_parallel_workaround (model, x)",
        "import mgpu_runtime\nmodel = mgpu_runtime.DistributedDataParallel(model)",
    ],
)
def test_every_spelling_of_a_site_passes(source):
    assert might_need_migration(source)
    assert might_need_migration(source.encode("latin-1"))


@pytest.mark.parametrize(
    "source",
    [
        "model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])",
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP",
        "import torch.distributed.fsdp.fully_sharded_data_parallel",
        "from fairscale.nn import ShardedDataParallel",
        "x = 'apexes'",
        # apex's other packages hold no site: only its parallel package has a DistributedDataParallel.
        "from apex.normalization import FusedLayerNorm",
        "from apex.normalization.fused_layer_norm import FusedLayerNormAffineFunction",
        "import apex\nfrom apex import amp\nmodel, optimizer = amp.initialize(model, optimizer)",
        "from apex.optimizers import FusedAdam\nmodel = torch.nn.parallel.DistributedDataParallel(model)",
        "from apex.parallel_state import x",
        # Megatron-style names that contain the words but are no site.
        "data_parallel_size = get_data_parallel_world_size()\ngroup = mpu.get_data_parallel_group()",
        "setup(data_parallel_size(), data_parallel_group(with_context=True), data_parallel_sharding_strategy(x))",
        "class DataParallelInferenceCoordinator:\n    pass",
        "buffer = DataParallelBuffer(ddp_config, params)",
        # The word as a keyword argument, a string key or prose (Megatron's inference and config code).
        "broadcast_tensor(size, dtype, data_parallel=True)",
        "checks = [('dl.data_parallel.size', 'data_parallel_size'), (\"data_parallel\", ok)]",
        '"""8 data_parallel groups"""',
        '"""Args:\n    data_parallel (bool): across one replica."""',
        "",
    ],
)
def test_names_that_only_end_like_a_site_are_skipped(source):
    assert not might_need_migration(source)


def test_a_skipped_file_is_never_parsed(tmp_path):
    # The syntax error would be reported if the file reached the parser.
    (tmp_path / "ddp.py").write_text("model = torch.nn.parallel.DistributedDataParallel(model\n")
    (tmp_path / "dp.py").write_text("model = torch.nn.DataParallel(model\n")
    assert run_cli("--to", "ddp", "ddp.py", cwd=tmp_path).returncode == 0
    assert run_cli("--to", "ddp", "dp.py", cwd=tmp_path).returncode == 2
