"""Running the command line as a user does: the installed ``mgpu-migrate`` script in a subprocess."""

from __future__ import annotations

import shutil
import subprocess
import sys

DP_SCRIPT = "import torch.nn as nn\nmodel = nn.Linear(2, 2)\nmodel = nn.DataParallel(model)\n"
PLAIN_SCRIPT = "import torch\nx = torch.ones(3)  # no DataParallel here\n"


def command() -> list[str]:
    script = shutil.which("mgpu-migrate")
    return [script] if script else [sys.executable, "-m", "mgpu_migrate"]


def run_cli(*args: str, cwd=None, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*command(), *args], cwd=cwd, input=stdin, capture_output=True, timeout=120, check=False
    )
