"""MGP120: call ``mgpu_runtime.setup()`` once, where the program starts (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.entrypoint import distributed_program
from mgpu_migrate.rules.base import DDP, Example, Rule
from mgpu_migrate.rules.syntax import RUNTIME, runtime_call

# The file is left as it is when this is reported (rules.settle).
OWN_DISTRIBUTED_PATH = "MGP231"


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

    CODE = "MGP120"
    REVIEW_CODES = {
        "MGP230": "the file trains, but no place that runs first was found for mgpu_runtime.setup()",
        OWN_DISTRIBUTED_PATH: "the file runs distributed training of its own: its DataParallel fallback is left as it is",
        "MGP232": "the file keeps a DataParallel wrap, so it is left as it is: --to ddp migrates a file entirely or not at all",
    }
    DESCRIPTION = "mgpu_runtime.setup() inserted where the program starts"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            "import torch.nn as nn\n\n\ndef main():\n    a = nn.DataParallel(nn.Linear(2, 2), dim=1)\n"
            "    b = nn.DataParallel(nn.Linear(2, 2))\n\n\nif __name__ == '__main__':\n    main()\n",
            None,
            DDP,
            ("MGP201", "MGP232"),
        ),
        Example(
            "import torch.nn as nn\n\n\ndef main():\n    model = nn.DataParallel(nn.Linear(2, 2))\n\n\n"
            'if __name__ == "__main__":\n    main()\n',
            "import torch.nn as nn\nimport mgpu_runtime\n\n\ndef main():\n"
            "    model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))\n\n\n"
            'if __name__ == "__main__":\n    mgpu_runtime.setup()\n    main()\n',
            DDP,
            ("MGP101", "MGP120"),
        ),
        Example(
            "import os\nimport torch.nn as nn\n\n\ndef main():\n    os.environ['CUDA_VISIBLE_DEVICES'] = '0,1'\n"
            "    model = nn.DataParallel(nn.Linear(2, 2))\n\n\nif __name__ == '__main__':\n    main()\n",
            "import os\nimport torch.nn as nn\nimport mgpu_runtime\n\n\ndef main():\n"
            "    os.environ['CUDA_VISIBLE_DEVICES'] = '0,1'\n    mgpu_runtime.setup()\n"
            "    model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))\n\n\nif __name__ == '__main__':\n    main()\n",
            DDP,
            ("MGP101", "MGP120"),
        ),
        Example(
            "import torch.nn as nn\n\nmodel = nn.DataParallel(nn.Linear(2, 2))\nfor x in batches:\n"
            "    model(x).mean().backward()\n",
            "import torch.nn as nn\nimport mgpu_runtime\n\nmgpu_runtime.setup()\n\n"
            "model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))\nfor x in batches:\n"
            "    model(x).mean().backward()\n",
            DDP,
            ("MGP101", "MGP120", "MGP235"),
        ),
        Example(
            "import torch.nn as nn\n\n\ndef build(model):\n    return nn.DataParallel(model)\n",
            "import mgpu_runtime\n\n\ndef build(model):\n    return mgpu_runtime.DistributedDataParallel(model)\n",
            DDP,
            ("MGP101", "MGP262"),
        ),
        Example(
            "import torch.nn as nn\n\n\ndef fit(model, batches):\n    model = nn.DataParallel(model)\n"
            "    for x in batches:\n        model(x).mean().backward()\n",
            "import mgpu_runtime\n\n\ndef fit(model, batches):\n"
            "    model = mgpu_runtime.DistributedDataParallel(model)\n"
            "    for x in batches:\n        model(x).mean().backward()\n",
            DDP,
            ("MGP101", "MGP230", "MGP235"),
        ),
        Example(
            "import torch.distributed as dist\nimport torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
            "if args.distributed:\n    dist.init_process_group('nccl')\n    model = DDP(model)\nelse:\n"
            "    model = nn.DataParallel(model)\n",
            None,
            DDP,
            ("MGP231",),
        ),
    )

    def apply(self) -> None:
        program = distributed_program(self.analysis, self.edits.replacements)
        if not program.wraps:
            return
        first = program.wraps[0]
        if program.existing:
            line, _ = self.analysis.position(program.existing[0])
            self.left(
                first,
                OWN_DISTRIBUTED_PATH,
                f"this file sets up distributed training itself (line {line}): its DataParallel fallback is left, "
                "since processes relaunched from it would not provably take that path with the same global batch; "
                "launch the file's own distributed path instead (torchrun with the flags it reads)",
            )
            return
        if program.kept:
            line, _ = self.analysis.position(program.kept[0])
            for wrap in program.wraps:
                self.left(
                    wrap,
                    "MGP232",
                    f"the DataParallel wrap at line {line} stays, so this file is left as it is (--to ddp migrates "
                    "a file entirely or not at all); migrate that wrap by hand first",
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
                "MGP230",
                f'no entry point here (no `if __name__ == "__main__":` block or main()): call {RUNTIME}.setup() '
                "where your program starts; until then the wrapper calls it when it is built",
            )
            return
        if not self.rewrite_allowed(entry.anchor):
            return
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
