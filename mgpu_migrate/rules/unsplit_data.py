"""MGP289: a file that trains on loaders it builds but splits none of them is left as it is (``--to ddp``)."""

from __future__ import annotations

from mgpu_migrate.rules.base import CHECKS, DDP, Example, Rule

UNSPLIT = "MGP289"
# Splits (MGP122), or leave the data whole for a reason of their own that a migration keeps right: a loss
# summed by hand (MGP236), a model trained elsewhere (MGP262), the torch style's (MGP162, MGP296).
_SAID = frozenset({"MGP122", "MGP236", "MGP262", "MGP162", "MGP296"})
NOT_FOLLOWED = "MGP235"
_LOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})


class UnsplitData(Rule):
    """
    ## What it does
    Leaves a file as it is when it trains (a backward pass) and builds a ``DataLoader``, but no loader of it
    was split across the processes and no other diagnostic gave a reason that keeps the migration right: the
    data reaches the training loop in a way the tool does not follow (``dataloaders[phase]``, a helper of
    another module), so the diagnostic names the loaders and the loop whose data was not followed (MGP235).

    ## Why is this bad?
    Every process would train on whole batches: the original's training only if all draw the same ones (the
    runtime stops the first step when they differ), and never faster than one process. A file whose data is
    not split gains nothing from DDP, so a migration of its wraps alone is no migration.

    ## Example
    ```python
    loaders = {"train": DataLoader(train_set, batch_size=8, shuffle=True), "val": DataLoader(val_set)}
    for phase in ("train", "val"):
        for x, y in loaders[phase]:
            ...
            if phase == "train":
                loss.backward()
    ```

    ## Use instead
    Pass the training loader through ``mgpu_runtime.distribute_loader(...)`` where it is built (only the one
    that trains), then migrate the file; or use ``--to balanced``, which keeps one process.

    ## Fix safety
    Nothing is rewritten, in the whole file: ``--to ddp`` migrates a file entirely or not at all.
    """

    CODE = UNSPLIT
    # A check: it reviews what the program rules said about the file's loaders.
    PHASE = CHECKS
    VETOES = frozenset({UNSPLIT})
    REVIEW_CODES = {
        UNSPLIT: "the file trains on loaders it builds, but none is split across the processes: file left as it is"
    }
    DESCRIPTION = "a training file whose data no rule split is left as it is"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            "import torch.nn as nn\nfrom torch.utils.data import DataLoader\n\nmodel = nn.DataParallel(model)\n"
            "loaders = {'train': DataLoader(data, batch_size=8)}\nfor x in loaders[phase]:\n"
            "    model(x).mean().backward()\n",
            None,
            DDP,
            (UNSPLIT,),
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        diagnostics = self.edits.diagnostics
        if any(diagnostic.code in _SAID for diagnostic in diagnostics):
            return
        loaders = [call for call in self.analysis.calls if self.analysis.resolve(call.func) in _LOADERS]
        backward = next((call for call in self.analysis.calls if self.analysis.loaders.is_backward(call)), None)
        if backward is None or not loaders:
            return
        lines = ", ".join(map(str, sorted({self.analysis.position(loader)[0] for loader in loaders})[:3]))
        unfollowed = sorted({diagnostic.line for diagnostic in diagnostics if diagnostic.code == NOT_FOLLOWED})
        why = f" (line {unfollowed[0]}'s loop: data not followed)" if unfollowed else ""
        self.left(
            backward,
            UNSPLIT,
            f"no DataLoader here (line {lines}) is split{why}: every process would train on whole batches: file left "
            "as it is",
        )
