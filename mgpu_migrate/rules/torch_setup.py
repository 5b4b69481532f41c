"""MGP161: ``--style torch``: the process group is set up from the torchrun environment, and torn down."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.entrypoint import EntryPoint
from mgpu_migrate.rules.base import DDP, TORCH_STYLE, Example, Rewrite
from mgpu_migrate.rules.entry_point import EntryPointSetup
from mgpu_migrate.rules.torch_style import (
    DIST_IMPORT,
    NEEDS_RUNTIME,
    NO_TORCH_FORM,
    TORCH_OPTIONS,
    dist_taken,
    statement,
)

_SET_UP = (
    "if torch.cuda.is_available():\n    torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n",
    "dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')\n",
)
_TEAR_DOWN = "dist.destroy_process_group()\n"


class TorchSetup(EntryPointSetup):
    """
    ## What it does
    Under ``--to ddp --style torch``, inserts the textbook set-up where the default style would call
    ``mgpu_runtime.setup()`` (the top of the main block, after the imports of a flat script ...): the
    process's GPU bound from torchrun's ``LOCAL_RANK`` on CUDA, then
    ``dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')`` (rank, world size and
    address from the torchrun environment); and ``dist.destroy_process_group()`` after the last statement of
    the same block. The files it cannot write that way are left whole (see the codes below).

    ## Why is this bad?
    One process per GPU needs a process group, and each process bound to its own GPU before CUDA is first
    used. The plain form needs nothing beyond PyTorch, and is the one reviewers know.

    ## Example
    ```python
    if __name__ == "__main__":
        main()
    ```

    ## Use instead
    ```python
    if __name__ == "__main__":
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ['LOCAL_RANK']))
        dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')
        main()
        dist.destroy_process_group()
    ```

    ## Fix safety
    The script must now be launched by ``torchrun`` (``torchrun --nproc_per_node=N train.py``), or any
    launcher that sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``MASTER_ADDR``: unlike the runtime it does
    not relaunch a plain ``python train.py``. A rewrite that only the runtime makes (an explicit device, a
    loss weighted by its targets, a loader the tool cannot rebuild) leaves the whole file as it is, with
    MGP295 or MGP296: the default style migrates it. So does a file that trains but has no place that runs
    first (no main block, no ``main()``): torch's wrapper needs the process group before it is built (MGP296).
    """

    CODE = Rewrite("MGP161")
    STYLES = (TORCH_STYLE,)
    REVIEW_CODES = (NEEDS_RUNTIME, NO_TORCH_FORM)
    DESCRIPTION = "process group set up from the torchrun environment, and destroyed at the end (--style torch)"
    EXAMPLES = (
        Example(
            EntryPointSetup.EXAMPLES[1].before,  # the default style's main block, in this style
            """
            import torch.nn as nn
            import torch
            import torch.distributed as dist
            import os


            def main():
                model = torch.nn.parallel.DistributedDataParallel(nn.Linear(2, 2), device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None)


            if __name__ == "__main__":
                if torch.cuda.is_available():
                    torch.cuda.set_device(int(os.environ['LOCAL_RANK']))
                dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')
                main()
                dist.destroy_process_group()
            """,
            DDP,
            ("MGP160", "MGP161"),
            TORCH_OPTIONS,
        ),
        Example(
            """
            import torch.nn as nn

            dist = None
            model = nn.DataParallel(nn.Linear(2, 2))
            for x in batches:
                model(x).mean().backward()
            """,
            None,
            DDP,
            ("MGP296",),
            TORCH_OPTIONS,
        ),
        Example(EntryPointSetup.EXAMPLES[5].before, None, DDP, ("MGP296",), TORCH_OPTIONS),  # trains, no entry point
    )

    def apply(self) -> None:
        super().apply()
        program = self.program
        if (
            program.migrates
            and not program.already_set_up
            and self.analysis.entry_point is None
            and self.analysis.loaders.training_loops
        ):
            # The runtime's wrapper would set up when built; torch's needs the process group before.
            self.left(program.wraps[0], NO_TORCH_FORM, "it trains, but has no main block or main() for init_process_group; file left")

    def _set_up(self, entry: EntryPoint) -> None:
        if dist_taken(self.analysis):
            self.left(entry.anchor, NO_TORCH_FORM, "this file binds `dist` itself: the scaffold's `dist.` calls would clash; left")
            return
        for module in ("torch", DIST_IMPORT, "os"):
            self.edits.need_import(module)
        set_up = [statement(code) for code in _SET_UP]
        leading = entry.anchor.leading_lines
        if entry.after:
            for new in set_up:
                self.edits.insert_after(entry.anchor, new)
        else:
            if leading and not leading[0].comment:
                set_up[0] = set_up[0].with_changes(leading_lines=[leading[0]])
            for new in set_up:
                self.edits.insert_before(entry.anchor, new)
        self.rewrote(entry.anchor, f"process group from the torchrun environment {entry.place}; launch with torchrun")
        block = self.analysis.tree.parent(entry.anchor)
        last = block.body[-1] if type(block) in (cst.Module, cst.IndentedBlock) and block.body else None
        ends = type(last) is cst.SimpleStatementLine and any(
            type(small) in (cst.Return, cst.Raise) for small in last.body
        )
        if last is not None and not ends:
            self.edits.insert_after(last, statement(_TEAR_DOWN))
