"""MGP150/MGP283: the GPUs a DataParallel's ``device_ids`` chose, under one process per GPU (``--to ddp``)."""

from __future__ import annotations

from mgpu_migrate.analysis.devices import first_n, what_they_are
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.program import handed_to_a_setup
from mgpu_migrate.rules.base import DDP, PROGRAM, TORCH_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS

CHOSEN_DEVICES = Review(
    "MGP283",
    name="chosen-devices",
    summary="device_ids names the GPUs to use, and mgpu_runtime.setup() cannot be given them: the file is left",
    why=(
        "`device_ids` names the GPUs DataParallel uses (`device_ids=args.gpus`). Under DDP one process runs per "
        "GPU the set-up is given, else per visible GPU, so `--to ddp` hands those GPUs to "
        "`mgpu_runtime.setup(devices=...)`. It cannot here: the message says why (what they are, for a wrap in a "
        "function that is handed them: a parameter of `fit()`, the `gpus` given to a class; something that may "
        "change them after the set-up; no set-up in this file; wraps that choose different GPUs). A user who picked "
        "2 of 8 GPUs would get 8 processes, so the file is left as it is."
    ),
    todo=(
        "Where your program starts, before anything touches CUDA, call `mgpu_runtime.setup(devices=...)` with "
        "the GPUs the message names (the list the user gave: `devices=args.gpus`), then mark the wrap "
        "`# noqa: MGP283` and run the tool again. Or choose the GPUs when launching "
        "(`CUDA_VISIBLE_DEVICES=2,3 torchrun --nproc_per_node=2 ...`) and drop `device_ids`."
    ),
    veto=True,
)


class DeviceSelection(Rule):
    """
    ## What it does
    Keeps the GPUs each DataParallel chose (``device_ids``) when it becomes ``DistributedDataParallel``, which
    runs one process per GPU. Every visible GPU (``range(torch.cuda.device_count())``) needs nothing. GPUs
    chosen by name or by count (``args.gpus``, ``[cfg.GPU_ID]``, a positional list, ``range(args.ngpu)``) go to
    ``mgpu_runtime.setup(devices=...)`` (MGP150, the set-up's MGP120 names them), when every wrap chose the same
    and that expression holds the same where ``setup()`` runs: each name it reads is bound there, and nothing
    that may change it (an assignment, a method called on it, a call it is passed to) runs after the set-up.
    The set-up moves for it into the function the main block calls first, right after its command line is
    parsed (``args = parser.parse_args()``); or, when a method of the wraps' class chooses them and keeps them on
    ``self`` (``gpus = visible_gpus(self.arg.device); self.gpus = gpus`` in ``init_environment()``, which
    ``__init__`` calls before the method that wraps, nothing touching CUDA before), into that method, right
    where they are chosen (``setup(devices=gpus)``); or, when the file's main function hands the wraps' class the
    GPUs inside a namespace its constructor keeps (pytorch-deeplab-xception's ``Trainer(args)``, which wraps on
    ``self.args.gpu_ids``, built once), into that function, right after its last statement that chooses them
    (``if args.cuda: try: args.gpu_ids = [int(s) for s in ...]``), when every statement up to there parses the
    command line or only computes (``setup(devices=args.gpu_ids)``). A wrap in a module with no entry point of its own, on a
    parameter of its function or of its class's constructor, drops them when the script that starts the module
    hands them and gives them to its set-up (first-order-model's ``train(..., opt.device_ids)``, BERT-pytorch's
    ``BERTTrainer(..., cuda_devices=args.cuda_devices)`` in the function its setup.py installs as the ``bert``
    command). Otherwise the first N (``range(n)``) is said (MGP150: launch N processes), and named GPUs leave the
    file as it is (MGP283), saying what they are.

    ## Why is this bad?
    Under DDP one process runs per visible GPU: a user who chose 2 of a machine's 8 GPUs would get 8
    processes, on GPUs other jobs may be using, without a word.

    ## Example
    ```python
    def main():
        args = parser.parse_args()
        model = nn.DataParallel(model, device_ids=args.gpus)


    if __name__ == "__main__":
        main()
    ```

    ## Use instead
    ```python
    def main():
        args = parser.parse_args()
        mgpu_runtime.setup(devices=args.gpus)
        model = mgpu_runtime.DistributedDataParallel(model)
    ```
    A plainly started script then relaunches as one process per chosen GPU, and local rank r runs on GPU
    ``args.gpus[r]``, also under ``torchrun``.

    ## Fix safety
    Safe: the set-up is given the very expression the wrap was, where it holds the same value, and the
    training is exact for any number of processes (the same global batch, split more or fewer ways). Without
    CUDA the devices are ignored. MGP150 on the first N without a set-up to take them is a note: launch that
    many. With MGP283 nothing is rewritten, in the whole file; ``--style torch`` always leaves named GPUs so.
    """

    CODE = Rewrite("MGP150")
    PHASE = PROGRAM
    USES = ("entry_point",)
    REVIEW_CODES = (CHOSEN_DEVICES,)
    DESCRIPTION = "DataParallel's choice of GPUs handed to mgpu_runtime.setup(devices=...), said, or kept by leaving the file"
    TARGETS = (DDP,)
    EXAMPLES = (
        # No set-up in a snippet: the file cannot keep the choice.
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model, device_ids=args.gpus)
            """,
            None,
            DDP,
            (CHOSEN_DEVICES,),
            message="but no set-up here takes them",
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
            message="(the first args.ngpu GPUs) dropped",
        ),
        # Parsed where the set-up runs: it takes them (the set-up's own rule writes `setup(devices=args.gpus)`).
        Example(
            """
            import argparse
            import torch.nn as nn

            parser = argparse.ArgumentParser()
            parser.add_argument("--gpus", type=int, nargs="+")
            args = parser.parse_args()
            model = nn.DataParallel(nn.Linear(2, 2), args.gpus)
            for x in batches:
                model(x).sum().backward()
            """,
            """
            import argparse
            import torch.nn as nn
            import mgpu_runtime

            parser = argparse.ArgumentParser()
            parser.add_argument("--gpus", type=int, nargs="+")
            args = parser.parse_args()
            model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))
            for x in batches:
                model(x).sum().backward()
            """,
            DDP,
            ("MGP101", "MGP150"),
            message="`device_ids=args.gpus` moved to `mgpu_runtime.setup(devices=...)`",
            line=7,
        ),
        # Changed after the set-up would have run: the set-up cannot be given them.
        Example(
            """
            import torch.nn as nn
            from config import cfg


            def main():
                cfg.merge_from_file("gpus.yaml")
                model = nn.DataParallel(nn.Linear(2, 2), device_ids=[cfg.GPU_ID])
                for x in batches:
                    model(x).sum().backward()


            if __name__ == "__main__":
                main()
            """,
            None,
            DDP,
            (CHOSEN_DEVICES,),
            message="`cfg.GPU_ID` may change at line 6, after the set-up",
            line=7,
        ),
        # A library's method is handed its GPUs: the message says which to give the set-up.
        Example(
            """
            import torch.nn as nn


            class BaseModel(nn.Module):
                def __init__(self, gpus=None):
                    super().__init__()
                    self.gpus = gpus

                def fit(self, batches):
                    model = nn.DataParallel(self, device_ids=self.gpus)
                    for x in batches:
                        model(x).sum().backward()
            """,
            None,
            DDP,
            (CHOSEN_DEVICES,),
            message="`self.gpus` is the `gpus` given to BaseModel(), and no set-up here takes them",
            line=10,
        ),
        # Under --style torch no set-up takes them.
        Example(
            """
            import argparse
            import torch.nn as nn

            args = argparse.ArgumentParser().parse_args()
            model = nn.DataParallel(nn.Linear(2, 2), device_ids=args.gpus)
            for x in batches:
                model(x).sum().backward()
            """,
            None,
            DDP,
            (CHOSEN_DEVICES,),
            options=TORCH_OPTIONS,
            message="(under DDP every visible GPU runs a process)",
        ),
    )

    def _handed_to_a_setup(self, call, value) -> str | None:
        """The script that starts this module and gives the GPUs of a wrap's ``device_ids``, a parameter of its
        function, to its set-up (first-order-model's run.py, calling ``train(..., opt.device_ids)``)."""
        if self.options.style == TORCH_STYLE or self.analysis.entry_point is not None:
            return None
        described = what_they_are(self.analysis, value, call)
        if described is None or not described.endswith("()") or " is a parameter of " not in described:
            return None
        return handed_to_a_setup(self.analysis, call)

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
                first = f"the first {shorten(self.analysis.code_of(count), 24)} GPUs"
                if len(text) + len(first) > 50:  # (flownet2's `list(range(args.number_gpus))`: named once)
                    text = "..."
                self.rewrote(
                    call,
                    f"`device_ids={text}` ({first}) dropped: one "
                    f"process runs per visible GPU, so launch that many (`torchrun --nproc_per_node=N`)",
                )
            elif (starter := self._handed_to_a_setup(call, value)) is not None:
                self.rewrote(
                    call,
                    f"`device_ids={text}` dropped: {starter} hands them to `{RUNTIME}.setup(devices=...)`, one process on each",
                )
            elif self.options.style == TORCH_STYLE:
                self.left(call, CHOSEN_DEVICES, f"`device_ids={text}` names the GPUs to use (under DDP every visible GPU runs a process): file left as it is")
            else:
                self.left(call, CHOSEN_DEVICES, f"`device_ids={text}` names the GPUs to use, but {chosen.unknown}: file left as it is")
