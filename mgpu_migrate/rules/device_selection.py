"""MGP150/MGP283: the GPUs a DataParallel's ``device_ids`` chose, under one process per GPU (``--to ddp``)."""

from __future__ import annotations

from mgpu_migrate.analysis.devices import first_n
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, TORCH_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME

CHOSEN_DEVICES = Review(
    "MGP283",
    name="chosen-devices",
    summary="device_ids names the GPUs to use: under DDP every visible GPU would run a process",
    why=(
        "`device_ids` names the GPUs DataParallel uses (`device_ids=args.gpus`). Under DDP every visible GPU "
        "runs one process, so a user who picked 2 of 8 GPUs would get 8 processes. The file is left as it is."
    ),
    todo=(
        "Choose the GPUs when launching (`CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node=2 ...`), drop "
        "`device_ids` from the wrap, then run the tool again."
    ),
    veto=True,
)


class DeviceSelection(Rule):
    """
    ## What it does
    Looks at the ``device_ids`` of each DataParallel that becomes ``DistributedDataParallel``, which drops
    them (a process owns one GPU). Every visible GPU (``range(torch.cuda.device_count())``) needs nothing.
    The first N (``range(args.ngpu)``, ``list(range(n))``, ``[0, 1]``) is said (MGP150): launch N processes to keep that
    choice. Named GPUs (``[2, 3]``, ``args.gpus``, a list built from a flag) leave the file as it is (MGP283).

    ## Why is this bad?
    Under DDP one process runs per visible GPU: a user who chose 2 of a machine's 8 GPUs would get 8
    processes, on GPUs other jobs may be using, without a word.

    ## Example
    ```python
    model = nn.DataParallel(model, device_ids=args.gpus)
    ```

    ## Use instead
    Choose the GPUs when launching, drop ``device_ids``, then migrate:
    ``CUDA_VISIBLE_DEVICES=2,3 torchrun --standalone --nproc_per_node=2 train.py``.

    ## Fix safety
    MGP150 is a note on a rewrite that is exact for any number of processes (the same global batch, split
    more or fewer ways). With MGP283 nothing is rewritten, in the whole file.
    """

    CODE = Rewrite("MGP150")
    PHASE = PROGRAM
    REVIEW_CODES = (CHOSEN_DEVICES,)
    DESCRIPTION = "DataParallel's choice of GPUs said (the first N) or kept by leaving the file (named GPUs)"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model, device_ids=args.gpus)
            """,
            None,
            DDP,
            (CHOSEN_DEVICES,),
        ),
        # A filtered comprehension names GPUs (every one but GPU 3), not the first N.
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model, device_ids=[i for i in range(8) if i != 3])
            """,
            None,
            DDP,
            (CHOSEN_DEVICES,),
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model, device_ids=range(args.ngpu))
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            """,
            DDP,
            ("MGP101", "MGP150"),
        ),
    )

    def apply(self) -> None:
        program = self.program
        if not program.migrates:
            return
        chosen = program.chosen_devices(self.analysis)
        if chosen is None:
            return
        passed = chosen.passed is not None and self.options.style != TORCH_STYLE
        for call, value in chosen.sites:
            text = shorten(self.analysis.code_of(value))
            count = first_n(value)
            if passed:
                self.rewrote(call, f"`device_ids={text}` moved to `{RUNTIME}.setup(devices=...)`: one process runs on each of those GPUs")
            elif count is not None:
                self.rewrote(
                    call,
                    f"`device_ids={text}` (the first {self.analysis.code_of(count)} GPUs) dropped: one "
                    f"process runs per visible GPU, so launch that many (`torchrun --nproc_per_node=N`)",
                )
            elif self.options.style == TORCH_STYLE:
                self.left(call, CHOSEN_DEVICES, f"`device_ids={text}` names the GPUs to use (under DDP every visible GPU runs a process): file left as it is")
            else:
                self.left(call, CHOSEN_DEVICES, f"`device_ids={text}` names the GPUs to use, but {chosen.unknown}: file left as it is")
