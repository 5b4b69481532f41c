"""The README's code blocks, and its commands by what they are for: CI runs these very lines (``.ci/run``).

``python3 tests/readme_blocks.py NAME`` prints the command NAME (``try``, ``runtime``, ``test``); standalone,
so CI can read the README before anything is installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"

# Each command is the README's one line of shell that starts so.
COMMANDS = {
    "try": "pip install mgpu-migrate ",  # set-up and the main job: the tool by name, then a migration as a diff
    "runtime": "pip install mgpu-runtime ",  # the runtime by name, on a training machine
    "test": "pip install torch==",  # from a clone: the CPU build of torch, the packages, the test suite
}


def blocks(language: str, text: str | None = None) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text() if text is None else text, re.S)


def command(name: str) -> str:
    """The README's line for ``name``, its trailing ``# comment`` dropped; exactly one such line must exist."""
    start = COMMANDS[name]
    found = [line for block in blocks("bash") for line in block.splitlines() if line.startswith(start)]
    if len(found) != 1:
        raise LookupError(f"README.md: {len(found)} bash lines start with {start!r}; expected one")
    return re.sub(r"\s+#[^'\"]*$", "", found[0])


if __name__ == "__main__":
    print(command(sys.argv[1]))
