"""MGP261: a file written by every process of a distributed run (``--to ddp``)."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.guards import under_main_process_block
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Review, Rule
from mgpu_migrate.rules.syntax import argument

_WRITING_METHODS = frozenset({"write_text", "write_bytes"})
_RACE = "all write the file at once, so one process's content wins or it comes out garbled"
_SAVERS = frozenset({"numpy.save", "numpy.savez", "numpy.savetxt", "numpy.savez_compressed"})


FILE_WRITTEN_BY_EVERY_PROCESS = Review(
    "MGP261",
    name="file-written-by-every-process",
    summary="a file written by every process: duplicated lines, or writers racing",
    why=(
        "A file is written by every process: all write it at once, so one process's content wins, lines are "
        "duplicated, or it comes out garbled."
    ),
    todo=(
        "Unless each process writes a file of its own, do it under `if mgpu_runtime.is_main_process():`, writing "
        "values computed before the block, on every process (the runtime's losses and metrics are the global "
        "batch's; computed inside the block, a reduction of the batch would wait for processes that never come)."
    ),
)


class SharedFiles(Rule):
    """
    ## What it does
    Reports files that the script opens for writing (``open(path, "w")``, ``"a"``, ``Path.write_text``,
    ``numpy.save``) outside a main-process-only block, in a file that becomes a distributed program. It
    rewrites nothing; checkpoints written with ``torch.save`` are MGP123's.

    ## Why is this bad?
    Every process runs the script, so every process writes the file: appended logs get one copy of each
    line per process, and files written with ``"w"`` are written by all at once, so one process's content
    wins or the result is garbled.

    ## Example
    ```python
    with open("log.txt", "a") as log:
        log.write(f"{epoch} {loss.item()}\\n")
    ```

    ## Use instead
    ```python
    if mgpu_runtime.is_main_process():
        with open("log.txt", "a") as log:
            log.write(f"{epoch} {loss.item()}\\n")
    ```

    ## Fix safety
    Nothing is rewritten: code in the block may need every process (a value written may be computed there
    from the batch, and a reduction of the runtime's global values is a collective).
    """

    CODE = FILE_WRITTEN_BY_EVERY_PROCESS
    PHASE = PROGRAM
    REVIEW_CODES = (FILE_WRITTEN_BY_EVERY_PROCESS,)
    DESCRIPTION = "files written by every process reported"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            with open('log.txt', 'a') as log:
                log.write('started')
            """,
            """
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            with open('log.txt', 'a') as log:
                log.write('started')
            """,
            DDP,
            ("MGP101", "MGP261"),
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            with open('data.txt') as f:
                f.read()
            """,
            """
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            with open('data.txt') as f:
                f.read()
            """,
            DDP,
            ("MGP101",),
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        for call in self.analysis.calls:
            how = self._writes(call)
            if how is None or under_main_process_block(self.analysis, call) or self._checkpoint_file(call):
                continue
            code = self.analysis.code_of(call)
            self.left(
                call,
                FILE_WRITTEN_BY_EVERY_PROCESS,
                f"`{shorten(code)}` runs on every process: {how}",
            )

    def _checkpoint_file(self, call: cst.Call) -> bool:
        """``with open(path, "wb") as f: torch.save(obj, f)``: MGP123 reports that save (MGP240)."""
        item = self.analysis.tree.parent(call)
        block = self.analysis.tree.parent(item) if type(item) is cst.WithItem else None
        return type(block) is cst.With and any(
            self.analysis.resolve(inner.func) == "torch.save"
            for inner in contains(block.body, lambda node: type(node) is cst.Call)
        )

    def _writes(self, call: cst.Call) -> Optional[str]:
        qualified = self.analysis.resolve(call.func)
        if qualified == "open" or (type(call.func) is cst.Name and call.func.value == "open" and qualified is None):
            mode = argument(call, "mode", 1)
            text = mode.value.evaluated_value if mode is not None and type(mode.value) is cst.SimpleString else ""
            if "a" in text:
                return "each appends its own copy of every line"
            if "w" in text or "x" in text:
                return _RACE
            return None
        if qualified in _SAVERS:
            return _RACE
        if type(call.func) is cst.Attribute and call.func.attr.value in _WRITING_METHODS and qualified is None:
            return _RACE
        return None
