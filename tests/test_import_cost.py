"""The command-line package never imports torch, and skips libcst for files with nothing to migrate."""

import subprocess
import sys

PROBE = """
import sys
import mgpu_migrate.cli
from mgpu_migrate.engine import migrate_source
migrate_source("x = 1\\n", "ddp", "plain.py")
print("torch" in sys.modules, "libcst" in sys.modules)
migrate_source("import torch.nn as nn\\nm = nn.DataParallel(m)\\n", "ddp", "site.py")
print("torch" in sys.modules, "libcst" in sys.modules)
"""


def test_cli_never_imports_torch_and_libcst_only_when_needed():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.split() == ["False", "False", "False", "True"]
