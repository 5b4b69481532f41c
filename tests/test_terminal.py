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
