"""A whole wrapped model pickled by a migrated script loads as the original's did: torch alone, no runtime.

``torch.save(model, "model.pth")`` of the wrapped model is common in old code, and the loader code goes on
with ``model.module`` or ``model.eval()``. The original's file held an ``nn.DataParallel``; so does the
migration's, from a real 2-process torchrun job and from a balanced run on 2 CPU replicas. The files are
loaded in a fresh interpreter where ``mgpu_runtime`` cannot be imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixture_cases import HARNESS

SCRIPT = Path(__file__).parent / "distributed_scripts" / "pickled_models.py"
TIMEOUT_S = 240

# A machine with torch alone: any reference to the runtime in a file fails its load.
_LOAD = """
import json, sys
sys.modules["mgpu_runtime"] = None
import torch
report = {}
for folder in sys.argv[1:]:
    for name in ("model", "teacher"):
        try:
            model = torch.load(f"{folder}/{name}.pt", weights_only=False)
        except FileNotFoundError:
            continue
        entry = report[f"{folder}/{name}"] = {
            "type": f"{type(model).__module__}.{type(model).__qualname__}",
            "modules": sorted({f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules()}),
        }
        model.eval()
        model(torch.randn(2, 3, dtype=next(model.parameters()).dtype))
        if name == "model":
            weights = torch.load(f"{folder}/weights.pt")
            inner = model.module.state_dict()
            entry["weights_equal"] = inner.keys() == weights.keys() and all(torch.equal(v, weights[k]) for k, v in inner.items())
            entry["keys"] = list(model.state_dict())
            entry["saved_keys"] = torch.load(f"{folder}/keys.pt")
print(json.dumps(report))
"""


def _environment(**extra: str) -> dict[str, str]:
    runtime = str(Path(__file__).parents[2] / "runtime")
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
        and not name.startswith(("SLURM_", "MGPU_", "TORCHELASTIC_"))
    }
    return {**environment, "PYTHONPATH": os.pathsep.join([str(HARNESS), runtime]), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **extra}


def _run_together(*commands: tuple[list[str], dict[str, str]]) -> None:
    processes = [
        subprocess.Popen(command, env=_environment(**extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for command, extra in commands
    ]
    for process in processes:
        output, _ = process.communicate(timeout=TIMEOUT_S)
        assert process.returncode == 0, output


def _loaded(*folders: Path) -> dict:
    # Without the runtime on the path at all, and blocked should it be installed.
    environment = {name: value for name, value in _environment().items() if name != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, *map(str, folders)],
        env=environment, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _check_original_shape(report: dict, folder: Path, normalisation: str) -> None:
    model = report[f"{folder}/model"]
    assert model["type"] == "torch.nn.parallel.data_parallel.DataParallel"
    assert all(name.startswith("torch.") for name in model["modules"]), model["modules"]
    assert normalisation in model["modules"]
    assert model["weights_equal"]
    assert model["keys"] == model["saved_keys"]
    assert model["keys"] and all(key.startswith("module.") for key in model["keys"])


@pytest.mark.slow
def test_pickled_wrappers_load_with_torch_alone(tmp_path):
    """A 2-process torchrun job, and in one plain process a balanced run on 2 CPU replicas and a world of one."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    _run_together(
        ([*torchrun, str(SCRIPT), str(tmp_path / "torchrun"), "ddp"], {}),
        ([sys.executable, str(SCRIPT), str(tmp_path / "plain"), "balanced", "ddp"], {"MGPU_CPU_REPLICAS": "2"}),
    )
    folders = {"torchrun": tmp_path / "torchrun" / "ddp", "balanced": tmp_path / "plain" / "balanced", "one": tmp_path / "plain" / "ddp"}
    report = _loaded(*folders.values())
    _check_original_shape(report, folders["balanced"], "torch.nn.modules.linear.Identity")
    for ddp in ("torchrun", "one"):
        _check_original_shape(report, folders[ddp], "torch.nn.modules.batchnorm.SyncBatchNorm")
        assert report[f"{folders[ddp]}/teacher"]["type"] == "torch.nn.parallel.data_parallel.DataParallel"
