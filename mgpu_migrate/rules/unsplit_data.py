"""MGP289: a file that trains, whose training data no rule could split, says so (``--to ddp``)."""

from __future__ import annotations

from mgpu_migrate.rules.base import CHECKS, DDP, Example, Rule

UNSPLIT = "MGP289"
# What the data rules say when they split a loader or say why not (MGP162, MGP296: the torch style's).
_SAID = frozenset({"MGP122", "MGP235", "MGP236", "MGP262", "MGP162", "MGP296"})
_LOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})


class UnsplitData(Rule):
    """
    ## What it does
    Reports the backward pass of a migrated file that builds a ``DataLoader`` when no loader of the file was
    split across the processes and no other diagnostic said why: the data comes through a loop the tool does not follow (``while i <
    len(loader): ... next(train_iter)`` in a step function, as crnn.pytorch trains).

    ## Why is this bad?
    Every process would train on whole batches: the original's training only if all draw the same ones, and
    never faster; the runtime stops the first step when they differ. A summary of "0 sites left" would hide it.

    ## Example
    ```python
    train_iter = iter(train_loader)
    while i < len(train_loader):
        cost = train_batch(model, next(train_iter))   # backward inside
    ```

    ## Use instead
    Pass the loader through ``mgpu_runtime.distribute_loader(...)`` where it is built.

    ## Fix safety
    Nothing more is rewritten: the diagnostic only says what the rest of the migration could not do.
    """

    CODE = UNSPLIT
    # A check: it reviews what the program rules said about the file's loaders.
    PHASE = CHECKS
    REVIEW_CODES = {UNSPLIT: "the file trains, but no loader of it is split across the processes"}
    DESCRIPTION = "a training file whose data no rule split says so"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            "import torch.nn as nn\nfrom torch.utils.data import DataLoader\n\nmodel = nn.DataParallel(model)\n"
            "batches = iter(DataLoader(data, batch_size=8))\nwhile step < steps:\n    model(next(batches)).mean().backward()\n",
            "from torch.utils.data import DataLoader\nimport mgpu_runtime\n\n"
            "model = mgpu_runtime.DistributedDataParallel(model)\n"
            "batches = iter(DataLoader(data, batch_size=8))\nwhile step < steps:\n    model(next(batches)).mean().backward()\n",
            DDP,
            ("MGP101", UNSPLIT),
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        if any(diagnostic.code in _SAID for diagnostic in self.edits.diagnostics):
            return
        loaders = [call for call in self.analysis.calls if self.analysis.resolve(call.func) in _LOADERS]
        backward = next((call for call in self.analysis.calls if self.analysis.loaders.is_backward(call)), None)
        if backward is None or not loaders:
            return
        lines = ", ".join(str(self.analysis.position(loader)[0]) for loader in loaders[:3])
        self.left(
            backward,
            UNSPLIT,
            f"no loader of this file (DataLoader at line {lines}) is split across the processes: each process trains "
            "on whole batches (correct but no faster)",
        )
