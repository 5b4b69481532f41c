"""MGP123: checkpoints are written once, by the main process, through ``mgpu_runtime.save`` (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.entrypoint import distributed_program
from mgpu_migrate.analysis.guards import under_main_process_block
from mgpu_migrate.rules.base import DDP, Example, Rule
from mgpu_migrate.rules.syntax import RUNTIME, argument, runtime_attr

TORCH_SAVE = "torch.save"
# Calls that make a file object (or an in-memory one): each process would write its own.
_FILE_MAKERS = {"open", "io.open", "io.BytesIO", "gzip.open", "bz2.open", "lzma.open", "builtins.open"}


class CheckpointSave(Rule):
    """
    ## What it does
    Replaces ``torch.save(obj, path)`` with ``mgpu_runtime.save(obj, path)``, which every process calls and
    the main process alone carries out, atomically (temporary file, then rename), while the others wait.

    ## Why is this bad?
    Under DDP every process runs the script, so each would write the same checkpoint to the same path at
    the same time: wasted work at best, a truncated file at worst, and a process that reads the checkpoint
    right after may see it half written.

    ## Example
    ```python
    torch.save(model.module.state_dict(), "model.pt")
    ```

    ## Use instead
    ```python
    mgpu_runtime.save(model.module.state_dict(), "model.pt")
    ```

    ## Fix safety
    Safe: the state of every process is the same after a synchronized step, and ``save`` returns on every
    process once the file is complete. A ``torch.save`` already under a main-process-only ``if`` is left as
    it is (the runtime's ``save`` waits for every process, so it would wait forever there). A save into a file
    object or a buffer (``with open(...) as f: torch.save(obj, f)``, ``io.BytesIO()``) is left with MGP240, as
    is ``save_pretrained``: every process still runs them.
    """

    CODE = "MGP123"
    REVIEW_CODES = {
        "MGP240": "a save every process still runs: into a file object or buffer, or save_pretrained",
    }
    DESCRIPTION = "torch.save replaced with mgpu_runtime.save (main process only, atomic)"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            "import torch\n\nmodel = torch.nn.DataParallel(model)\ntorch.save(model.module.state_dict(), 'model.pt')\n",
            "import mgpu_runtime\n\nmodel = mgpu_runtime.DistributedDataParallel(model)\n"
            "mgpu_runtime.save(model.module.state_dict(), 'model.pt')\n",
            DDP,
            ("MGP101", "MGP123"),
        ),
        Example(
            "import torch\n\nmodel = torch.nn.DataParallel(model)\nwith open('model.pt', 'wb') as f:\n"
            "    torch.save(model.state_dict(), f)\n",
            "import torch\nimport mgpu_runtime\n\nmodel = mgpu_runtime.DistributedDataParallel(model)\n"
            "with open('model.pt', 'wb') as f:\n    torch.save(model.state_dict(), f)\n",
            DDP,
            ("MGP101", "MGP240"),
        ),
    )

    def apply(self) -> None:
        if not distributed_program(self.analysis, self.edits.replacements).migrates:
            return
        for call in self.analysis.calls_to(TORCH_SAVE):
            if under_main_process_block(self.analysis, call):
                continue
            destination = argument(call, "f", 1)
            if destination is not None and self._is_file_object(call, destination.value):
                self.left(
                    call,
                    "MGP240",
                    "saving into a file object or buffer: every process runs this; put it under "
                    f"`if {RUNTIME}.is_main_process():` or save to a path with {RUNTIME}.save",
                )
                continue
            if not self.rewrite_allowed(call):
                continue
            self.edits.replace(call.func, lambda _: runtime_attr("save"))
            self.edits.need_import(RUNTIME)
            self.rewrote(call, f"{RUNTIME}.save: written once, by the main process, atomically")
        for call in self.analysis.calls:
            if (
                isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "save_pretrained"
                and not under_main_process_block(self.analysis, call)
            ):
                self.left(
                    call,
                    "MGP240",
                    f"save_pretrained runs on every process: put it under `if {RUNTIME}.is_main_process():` "
                    f"followed by {RUNTIME}.barrier()",
                )

    def _is_file_object(self, call: cst.Call, destination: cst.BaseExpression) -> bool:
        """Whether the destination is an open file or a buffer rather than a path."""
        if isinstance(destination, cst.Name):
            for ancestor in self.analysis.tree.ancestors(call):
                if isinstance(ancestor, cst.With):
                    for item in ancestor.items:
                        asname = item.asname.name if item.asname else None
                        if (
                            isinstance(asname, cst.Name)
                            and asname.value == destination.value
                            and self._makes_file(item.item)
                        ):
                            return True
        values = self.analysis.values
        return any(self._makes_file(value) for value in values.of(destination, values.scope_of(call)))

    def _makes_file(self, expr: cst.BaseExpression) -> bool:
        if not isinstance(expr, cst.Call):
            return False
        if isinstance(expr.func, cst.Name) and expr.func.value == "open":
            return True
        return self.analysis.resolve(expr.func) in _FILE_MAKERS
