"""MGP120: call ``mgpu_runtime.setup()`` once, where the program starts (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.entrypoint import EntryPoint
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, runtime_call

NO_ENTRY_POINT = Review(
    "MGP230",
    name="no-entry-point",
    summary="the file trains, but no place that runs first was found for mgpu_runtime.setup()",
    why=(
        "The file trains, but it has no `if __name__ == \"__main__\":` block or `main()` where "
        "`mgpu_runtime.setup()` could run first. The runtime's wrapper calls `setup()` when it is built, so "
        "the other processes start late (after any work done before the wrap)."
    ),
    todo="Call `mgpu_runtime.setup()` where your program starts.",
)
EXISTING_DISTRIBUTED_SETUP = Review(
    "MGP231",
    name="existing-distributed-setup",
    summary="the file runs distributed training of its own: its DataParallel fallback is left as it is",
    why=(
        "The file sets up distributed training itself (`init_process_group`, torch's or apex's DDP, "
        "`DistributedSampler`, `mp.spawn`). Only its DataParallel fallback is migrated; its data and "
        "checkpoints are left as they are. Started plainly on several GPUs, the fallback relaunches the script "
        "under torchrun."
    ),
    todo=(
        "Check that the relaunched script takes its own distributed path (it reads `LOCAL_RANK` or `WORLD_SIZE` "
        "from the environment)."
    ),
    veto=True,
)
FILE_KEEPS_A_WRAP = Review(
    "MGP232",
    name="file-keeps-a-wrap",
    summary=(
        "the file keeps a DataParallel wrap, so it is left as it is: --to ddp migrates a file entirely or not at all"
    ),
    why=(
        "`--to ddp` migrates a file entirely or not at all: a file that ran some wraps as one process per GPU "
        "and others as DataParallel, without the set-up and data of a distributed program, would work neither "
        "way. Another wrap in this file stays DataParallel (its own diagnostic says why)."
    ),
    todo="Migrate the wrap named in the message by hand first (or make it migratable), then run the tool again.",
)


class EntryPointSetup(Rule):
    """
    ## What it does
    Inserts ``mgpu_runtime.setup()`` once, where it runs before any model or tensor touches CUDA: at the top
    of the ``if __name__ == "__main__":`` block; in the function that block calls first when that function
    sets ``CUDA_VISIBLE_DEVICES`` (right after it does); after the imports of a flat script; or at the top of
    ``def main()`` in a module without a main block.

    It also decides whether the file becomes a distributed program at all: a file that already sets up
    distributed training itself (``init_process_group``, torch's or apex's ``DistributedDataParallel``,
    ``DistributedSampler``, ``mp.spawn``) is left as it is, its DataParallel fallback too (MGP231: processes
    relaunched from the fallback would not provably take the file's own path with the same global batch); a file that
    keeps a DataParallel wrap (``dim != 0``, ``# noqa``, part of a model: MGP250) is left as it is, its other
    wraps included (MGP232): ``--to ddp`` migrates a file entirely or not at all.

    ## Why is this bad?
    One process per GPU needs each process bound to its own GPU before CUDA is first used, and a process
    group. ``setup()`` reads the launch environment (torchrun, SLURM, or none), binds the GPU, joins the
    group, and relaunches a plainly started ``python train.py`` under torchrun when it should use several
    GPUs, so the script keeps running the way it always did.

    ## Example
    ```python
    if __name__ == "__main__":
        main()
    ```

    ## Use instead
    ```python
    if __name__ == "__main__":
        mgpu_runtime.setup()
        main()
    ```

    ## Fix safety
    Safe: ``setup()`` is idempotent, and in a single process (world of one) changes nothing the script can
    see. In a module of helpers nothing is inserted: the runtime's wrapper calls ``setup()`` when it is built.
    A file that trains but has no place that runs first (MGP230) is left the same way, with a note, since
    the other processes then start late (after any work done before the wrap).
    """

    CODE = Rewrite("MGP120")
    PHASE = PROGRAM
    STYLES = (RUNTIME_STYLE,)
    REVIEW_CODES = (NO_ENTRY_POINT, EXISTING_DISTRIBUTED_SETUP, FILE_KEEPS_A_WRAP)
    DESCRIPTION = "mgpu_runtime.setup() inserted where the program starts"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn


            def main():
                a = nn.DataParallel(nn.Linear(2, 2), dim=1)
                b = nn.DataParallel(nn.Linear(2, 2))


            if __name__ == '__main__':
                main()
            """,
            None,
            DDP,
            ("MGP201", "MGP232"),
        ),
        Example(
            """
            import torch.nn as nn


            def main():
                model = nn.DataParallel(nn.Linear(2, 2))


            if __name__ == "__main__":
                main()
            """,
            """
            import torch.nn as nn
            import mgpu_runtime


            def main():
                model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))


            if __name__ == "__main__":
                mgpu_runtime.setup()
                main()
            """,
            DDP,
            ("MGP101", "MGP120"),
        ),
        Example(
            """
            import os
            import torch.nn as nn


            def main():
                os.environ['CUDA_VISIBLE_DEVICES'] = '0,1'
                model = nn.DataParallel(nn.Linear(2, 2))


            if __name__ == '__main__':
                main()
            """,
            """
            import os
            import torch.nn as nn
            import mgpu_runtime


            def main():
                os.environ['CUDA_VISIBLE_DEVICES'] = '0,1'
                mgpu_runtime.setup()
                model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))


            if __name__ == '__main__':
                main()
            """,
            DDP,
            ("MGP101", "MGP120"),
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(nn.Linear(2, 2))
            for x in batches:
                model(x).mean().backward()
            """,
            """
            import torch.nn as nn
            import mgpu_runtime

            mgpu_runtime.setup()

            model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))
            for x in batches:
                model(x).mean().backward()
            """,
            DDP,
            ("MGP101", "MGP120"),
        ),
        Example(
            """
            import torch.nn as nn


            def build(model):
                return nn.DataParallel(model)
            """,
            """
            import mgpu_runtime


            def build(model):
                return mgpu_runtime.DistributedDataParallel(model)
            """,
            DDP,
            ("MGP101",),
        ),
        Example(
            """
            import torch.nn as nn


            def fit(model, batches):
                model = nn.DataParallel(model)
                for x in batches:
                    model(x).mean().backward()
            """,
            """
            import mgpu_runtime


            def fit(model, batches):
                model = mgpu_runtime.DistributedDataParallel(model)
                for x in batches:
                    model(x).mean().backward()
            """,
            DDP,
            ("MGP101", "MGP230"),
        ),
        Example(
            """
            import torch.distributed as dist
            import torch.nn as nn
            from torch.nn.parallel import DistributedDataParallel as DDP

            if args.distributed:
                dist.init_process_group('nccl')
                model = DDP(model)
            else:
                model = nn.DataParallel(model)
            """,
            None,
            DDP,
            ("MGP231",),
        ),
    )

    def apply(self) -> None:
        program = self.program
        if not program.wraps:
            return
        first = program.wraps[0]
        if program.existing:
            line, _ = self.analysis.position(program.existing[0])
            self.left(
                first,
                EXISTING_DISTRIBUTED_SETUP,
                f"this file sets up distributed training itself (line {line}): its DataParallel fallback is left; "
                "launch its own distributed path",
            )
            return
        if program.kept:
            line, _ = self.analysis.position(program.kept[0])
            for wrap in program.wraps:
                self.left(
                    wrap,
                    FILE_KEEPS_A_WRAP,
                    f"the DataParallel wrap at line {line} stays, so this file is left as it is; migrate that wrap "
                    "first",
                )
            return
        if program.already_set_up:
            return
        entry = self.analysis.entry_point
        if entry is None:
            if not self.analysis.loaders.training_loops:
                return  # a module of helpers: the program starts elsewhere, the wrapper sets up when built
            self.left(
                first,
                NO_ENTRY_POINT,
                f"no entry point here (no main block or main()): call {RUNTIME}.setup() where your program starts",
            )
            return
        if not self.rewrite_allowed(entry.anchor):
            return
        self._set_up(entry)

    def _set_up(self, entry: EntryPoint) -> None:
        """Insert the set-up at the entry point."""
        self.edits.need_import(RUNTIME)
        statement = cst.SimpleStatementLine([cst.Expr(runtime_call("setup"))])
        if entry.after:
            self.edits.insert_after(entry.anchor, statement)
        else:
            leading = entry.anchor.leading_lines
            if leading and not leading[0].comment:
                statement = statement.with_changes(leading_lines=[leading[0]])
            self.edits.insert_before(entry.anchor, statement)
        self.rewrote(entry.anchor, f"{RUNTIME}.setup() inserted {entry.place}")
