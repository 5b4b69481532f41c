"""MGPU_LOG=prefix hands on whole lines: every rank writes to the same terminal or pipe, and a line handed on
in pieces (``print`` writes its text, then the newline) could be cut by another rank's line."""

from __future__ import annotations

import io

from mgpu_runtime.distributed.rank_output import _Prefixed


class _Shared(io.StringIO):
    """One terminal for every rank: records each write it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_each_write_is_whole_prefixed_lines():
    shared = _Shared()
    rank0, rank1 = _Prefixed(shared, "[rank 0] "), _Prefixed(shared, "[rank 1] ")
    print("hello from 0", file=rank0)
    print("hello from 1", file=rank1)
    rank0.write("a\nb\nunfinished")
    rank1.write("x\n")
    rank0.write(" line\n")
    assert shared.writes == [
        "[rank 0] hello from 0\n",
        "[rank 1] hello from 1\n",
        "[rank 0] a\n[rank 0] b\n",
        "[rank 1] x\n",
        "[rank 0] unfinished line\n",
    ]


def test_a_flushed_partial_line_goes_on_and_its_rest_is_not_prefixed_again():
    shared = _Shared()
    bar = _Prefixed(shared, "[rank 1] ")
    bar.write(" 50%\r")
    bar.flush()
    bar.write("100%\r\n")
    bar.flush()
    assert shared.getvalue() == "[rank 1]  50%\r100%\r\n"
    assert shared.writes == ["[rank 1]  50%\r", "100%\r\n"]
