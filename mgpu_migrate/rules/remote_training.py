"""MGP262: a model wrapped here but trained in code this file does not show (``--to ddp``)."""

from __future__ import annotations

from mgpu_migrate.analysis.entrypoint import distributed_program
from mgpu_migrate.rules.base import DDP, Example, Rule
from mgpu_migrate.rules.syntax import RUNTIME


class RemoteTraining(Rule):
    """
    ## What it does
    Reports a wrap whose model is trained elsewhere: the file has no loop that calls ``.backward()``, and
    the wrapped model goes to code outside the file (returned by a builder such as ``build_model()``,
    handed to a trainer). It rewrites nothing beyond the wrap itself.

    ## Why is this bad?
    The migration splits each batch across the processes by passing the training ``DataLoader`` through
    ``mgpu_runtime.distribute_loader``, which it can only do where it sees the loop. The file that trains
    has no DataParallel in it, so the tool does not rewrite it: until someone does, every process trains
    on whole batches. That matches the original only if every process draws the same batches (the
    runtime stops the first optimizer step when they differ), and is never faster.

    ## Example
    ```python
    def build_model(cfg):
        return nn.DataParallel(Net(cfg))
    ```

    ## Use instead
    ```python
    def build_model(cfg):
        return mgpu_runtime.DistributedDataParallel(Net(cfg))

    # in the file with the training loop:
    loader = mgpu_runtime.distribute_loader(DataLoader(dataset, batch_size=256, shuffle=True))
    ```

    ## Fix safety
    Only the wrap is rewritten (MGP101); the runtime's wrapper calls ``setup()`` when it is built.
    """

    CODE = "MGP262"
    REVIEW_CODES = {
        "MGP262": "the model is trained in code this file does not show: its data loader is not distributed",
    }
    DESCRIPTION = "wraps whose training loop is in another file reported"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            "import torch.nn as nn\n\n\ndef build_model(cfg):\n    return nn.DataParallel(Net(cfg))\n",
            "import mgpu_runtime\n\n\ndef build_model(cfg):\n    return mgpu_runtime.DistributedDataParallel(Net(cfg))\n",
            DDP,
            ("MGP101", "MGP262"),
        ),
    )

    def apply(self) -> None:
        program = distributed_program(self.analysis, self.edits.replacements)
        if not program.migrates or self.analysis.loaders.training_loops:
            return
        escapes = self.analysis.models.model_escapes()
        for wrap in program.wraps:  # once per file: the advice is the same for every wrap
            site = self.analysis.models.site_of(wrap)
            where = escapes.get(site) if site is not None else None
            if not where:
                continue
            others = len(program.wraps) - 1
            self.left(
                wrap,
                "MGP262",
                f"this file has no training loop, and the model goes to {where[0].what}"
                f"{f' (and {others} other wrapped model(s) elsewhere)' if others else ''}: if it is trained there, pass "
                f"the training DataLoader through {RUNTIME}.distribute_loader(...) (the tool does not rewrite that "
                "file: it has no DataParallel); until then every process trains on whole batches",
            )
            return
