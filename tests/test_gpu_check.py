"""The GPU check (``benchmarks/gpu_check.py``) rehearsed on the CPU: every line of it runs in CI, so the
minutes a GPU is lent are spent measuring, not finding a typo in the script."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_check_rehearsal_runs_every_measurement(tmp_path):
    out = tmp_path / "gpu.json"
    finished = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--rehearse", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    results = json.loads(out.read_text())
    balanced, ddp = results["balanced"], results["ddp"]
    assert "error" not in balanced and "error" not in ddp
    # The balanced pair against the bare module, split over two CPU replicas.
    assert balanced["exactness"]["float64"]["ok"] and balanced["exactness"]["float64"]["loss_abs_diff"] <= 1e-9
    assert balanced["exactness"]["float32"]["ok"]
    assert set(balanced["overhead"]["median_step_ms"]) == {"bare", "balanced", "nn.DataParallel"}
    # The watch sees nn.DataParallel (unreplicated on the CPU) make the whole logits, and the balanced pair not.
    memory = balanced["memory"]
    assert memory["nn.DataParallel"]["holds_whole_logits"] and not memory["balanced"]["holds_whole_logits"]
    assert memory["ok"] and memory["balanced"]["peak_step_gib"] == "not measured on the CPU"
    # Two torchrun processes over gloo against one plain process.
    assert ddp["exactness"] == {**ddp["exactness"], "ranks_identical": True, "ok": True}
    assert ddp["exactness"]["max_weight_difference"] <= 1e-5
    assert ddp["streams"] == {"rank1_masks_kept": True, "noise_alike_on_ranks": True, "ok": True}
    assert ddp["overhead"]["mgpu_runtime_ms"] > 0 and ddp["overhead"]["bare_ddp_ms"] > 0


def test_gpu_check_without_cuda_says_so_and_succeeds():
    finished = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert finished.returncode == 0
    assert "no CUDA device here" in finished.stdout
