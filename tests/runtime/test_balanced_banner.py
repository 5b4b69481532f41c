"""The line a balanced model says when its replicas start: once per process, on stderr, only for two or more."""

from __future__ import annotations

import subprocess
import sys

from tests.runtime.test_rank_output import _environment

SCRIPT = """\
import torch.nn as nn

import mgpu_runtime

first = mgpu_runtime.DataParallelModel(nn.Linear(4, 2))
second = mgpu_runtime.DataParallelModel(nn.Linear(4, 2))  # the same replicas: said once
print(first(__import__("torch").ones(6, 4)).shape)
"""


def _run(tmp_path, **extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "train.py").write_text(SCRIPT)
    result = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=_environment(**extra),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    return result


def test_the_replicas_say_where_they_run_once(tmp_path):
    result = _run(tmp_path, MGPU_CPU_REPLICAS="3")
    said = [line for line in result.stderr.splitlines() if line.startswith("mgpu_runtime:")]
    assert said == [
        "mgpu_runtime: balanced over 3 replicas on the CPU (MGPU_CPU_REPLICAS=3): outputs stay on their devices, "
        "the loss is computed beside each piece and combined on cpu"
    ]
    assert result.stdout.strip() == "torch.Size([6, 2])"


def test_one_process_on_one_device_says_nothing(tmp_path):
    assert "mgpu_runtime:" not in _run(tmp_path).stderr
