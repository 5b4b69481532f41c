"""How far ``distribute_loader`` reads the original's sampler ahead, in a real torchrun job (gloo, CPU).

The loader draws each global batch's indices on rank 0 and broadcasts them. torch's own samplers draw their
order when an epoch starts, so they are read in chunks (few collectives); a sampler of the script's own, which
may keep a position the script saves with its checkpoint (audioset_tagging_cnn's TrainSampler), is read as the
original DataLoader read it: one batch at a time, so the position saved after step k is the original's.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.runtime.test_rank_output import _environment

pytestmark = pytest.mark.slow

SCRIPT = """\
import json
import sys

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler, TensorDataset

import mgpu_runtime


class Counting(Sampler):
    \"\"\"An endless sampler of the script's own that counts the batches drawn (its saved state).\"\"\"

    def __init__(self):
        self.drawn = 0

    def __iter__(self):
        while True:
            self.drawn += 1
            yield [(4 * self.drawn + row) % 40 for row in range(4)]


mgpu_runtime.setup()
data = TensorDataset(torch.arange(40.0).unsqueeze(1))
own = Counting()
positions = []
for step, (x,) in enumerate(mgpu_runtime.distribute_loader(DataLoader(data, batch_sampler=own))):
    positions.append(own.drawn)
    if step == 5:
        break
torch_sampler = BatchSampler(RandomSampler(data), batch_size=4, drop_last=False)
rows = sum(len(x) for (x,) in mgpu_runtime.distribute_loader(DataLoader(data, batch_sampler=torch_sampler)))
if mgpu_runtime.rank() == 0:
    print(json.dumps({"positions": positions, "rows": rows}), flush=True)
"""


def test_a_sampler_of_the_scripts_own_is_read_one_batch_at_a_time(tmp_path):
    (tmp_path / "job.py").write_text(SCRIPT)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "job.py"]
    done = subprocess.run(command, cwd=tmp_path, env=_environment(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    # At step k the original DataLoader (no workers) had drawn k + 1 batches; torch's sampler gives every row.
    assert done.stdout.strip().splitlines()[-1] == '{"positions": [1, 2, 3, 4, 5, 6], "rows": 40}'
