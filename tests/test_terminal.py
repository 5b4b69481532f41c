"""Colour and progress only on a terminal (stderr a real pseudo-terminal here); plain text when piped or -q."""

from __future__ import annotations

import os
import pty
import subprocess

from tests.cli_helpers import command, run_cli

REVIEW_SCRIPT = "import torch\nm = torch.nn.DataParallel(m, dim=1)\n"


def stderr_on_a_terminal(*args: str, cwd, env=None) -> bytes:
    master, slave = pty.openpty()
    process = subprocess.Popen([*command(), *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=slave,
                               env={**os.environ, **(env or {})})
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the other side closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert process.wait(timeout=120) == 0
    return b"".join(chunks)


def test_colour_and_progress_on_a_terminal_only(tmp_path):
    for number in range(10):
        (tmp_path / f"f{number}.py").write_text(REVIEW_SCRIPT)
    shown = stderr_on_a_terminal(".", "--to", "ddp", "--check", "-j", "1", cwd=tmp_path)
    assert b"mgpu-migrate: migrating" in shown and b"100%" in shown
    assert b"\x1b[33m\x1b[1mMGP201\x1b[0m" in shown  # the code, in yellow

    quiet = stderr_on_a_terminal(".", "--to", "ddp", "--check", "-j", "1", "-q", cwd=tmp_path)
    assert b"migrating" not in quiet and b"MGP201" in quiet
    plain = stderr_on_a_terminal(".", "--to", "ddp", "--check", "-j", "1", cwd=tmp_path, env={"NO_COLOR": "1"})
    assert b"\x1b[33m" not in plain

    piped = run_cli(".", "--to", "ddp", "--check", "-j", "1", cwd=tmp_path)
    assert b"\x1b" not in piped.stderr and b"migrating" not in piped.stderr
    assert piped.stderr.count(b"MGP201") == 10


def test_color_always_and_force_color_colour_piped_diffs_and_diagnostics(tmp_path):
    import re

    from tests.cli_helpers import DP_SCRIPT

    (tmp_path / "train.py").write_text(DP_SCRIPT)
    plain = run_cli("train.py", "--to", "ddp", "--diff", cwd=tmp_path)
    assert b"\x1b[" not in plain.stdout + plain.stderr  # piped: plain
    environment = {key: value for key, value in os.environ.items() if key not in ("NO_COLOR", "FORCE_COLOR")}

    def piped(*arguments: str, **variables: str) -> subprocess.CompletedProcess:
        return subprocess.run([*command(), "train.py", "--to", "ddp", "--diff", *arguments], cwd=tmp_path,
                              capture_output=True, env={**environment, **variables}, timeout=120)

    for coloured in (piped("--color", "always"), piped(FORCE_COLOR="1")):
        assert b"\x1b[32m+import mgpu_runtime\x1b[0m" in coloured.stdout and b"\x1b[36m@@ " in coloured.stdout
        assert b"\x1b[1m" in coloured.stderr  # the diagnostics too
        assert re.sub(rb"\x1b\[[0-9;]*m", b"", coloured.stdout) == plain.stdout
    for off in (piped("--color", "never", FORCE_COLOR="1"), piped(FORCE_COLOR="1", NO_COLOR="1")):
        assert b"\x1b[" not in off.stdout + off.stderr
