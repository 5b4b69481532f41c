"""MGP289: a file that trains on loaders it builds but splits none of them is left as it is (``--to ddp``)."""

from __future__ import annotations

from mgpu_migrate.rules.base import CHECKS, DDP, RUNTIME_STYLE, Example, Review, Rule
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS

UNSPLIT = Review(
    "MGP289",
    name="unsplit-data",
    summary="the file trains on loaders it builds, but none is split across the processes: file left as it is",
    why=(
        "The file trains (a backward pass) and builds a `DataLoader`, but no loader of it reaches the training "
        "loop in a way the tool follows (a helper of another module, a dict of loaders indexed by the phase, "
        "`next(iter(loader))` each step, whose iterator ends before the backward pass), so none was split across the processes, and no other diagnostic "
        "gave a reason that keeps the migration right (a loss summed by hand, MGP236; with the runtime, a training "
        "loop whose data it cannot follow, which then stays whole on every process and the wrapped model runs "
        "each process's chunk, MGP235). Under `--style torch` every process would train on whole batches with "
        "plain DDP: the original's training only for a mean loss over batches drawn alike, and no faster than one "
        "process. With the runtime this is said when the backward pass runs in no loop the tool reads as a "
        "training loop (a `while True:` loop drawing `next(batches)`), so it cannot tell what the program trains "
        "on. The file is left as it is (the whole file)."
    ),
    todo=(
        "Pass the training loader through `mgpu_runtime.distribute_loader(...)` where it is built (only the one "
        "that trains) and migrate the file again, or use `--to balanced`, which keeps one process."
    ),
    veto=True,
)
_LOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})


class UnsplitData(Rule):
    """
    ## What it does
    Leaves a file as it is when it trains (a backward pass) and builds a ``DataLoader``, but no loader of it
    was split across the processes and no other diagnostic gave a reason that keeps the migration right: the
    data reaches the training loop in a way the tool does not follow (``dataloaders[phase]``, a helper of
    another module), so the diagnostic names the loaders and the loop whose data was not followed (MGP235).

    ## Why is this bad?
    Under ``--style torch`` every process would train on whole batches with plain DDP: the original's training only
    for a mean loss over batches drawn alike, and never faster than one process. With the runtime, a training loop
    whose data the tool cannot follow migrates with its data whole (MGP235: the wrapped model runs each process's
    chunk of each batch, as DataParallel's devices did); this code is left for a backward pass in no loop the tool
    reads as training, where it cannot tell what the program trains on.

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
    USES = ("loaders",)
    REVIEW_CODES = (UNSPLIT,)
    DESCRIPTION = "a training file whose data no rule split is left as it is"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            from torch.utils.data import DataLoader
            from data import make_loaders

            model = nn.DataParallel(model)
            evaluation = DataLoader(data, batch_size=8)
            loaders = make_loaders(data)
            for x in loaders[phase]:
                model(x).mean().backward()
            """,
            None,
            DDP,
            (UNSPLIT,),
            TORCH_OPTIONS,
            message="(line 8's loop: data not followed): every process would train on whole batches",
            line=9,
        ),
        # With the runtime: a backward pass in no loop the tool reads as a training loop.
        Example(
            """
            import torch.nn as nn
            from torch.utils.data import DataLoader

            model = nn.DataParallel(model)
            batches = iter(DataLoader(data, batch_size=8, shuffle=True))
            while True:
                model(next(batches)).mean().backward()
            """,
            None,
            DDP,
            (UNSPLIT,),
            message="no DataLoader here (line 5) is split: no loop the tool reads trains on it",
            line=7,
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        # A split, or data left whole for a reason of its own that a migration keeps right (a loss summed by
        # hand, a model trained elsewhere, the torch style's).
        if any(code.accounts_for_data for code in self.reported):
            return
        if self.options.style == RUNTIME_STYLE and any(code.whole_under_the_runtime for code in self.reported):
            return  # a training loop's data left whole, said (MGP235): the wrapper runs each process's chunk of it
        loaders = [call for call in self.analysis.calls if self.analysis.resolve(call.func) in _LOADERS]
        backward = next((call for call in self.analysis.calls if self.analysis.loaders.is_backward(call)), None)
        if backward is None or not loaders:
            return
        lines = ", ".join(map(str, sorted({self.analysis.position(loader)[0] for loader in loaders})[:3]))
        unfollowed = self._unfollowed_loops()
        why = f" (line {unfollowed[0]}'s loop: data not followed)" if unfollowed else ""
        self.left(
            backward,
            UNSPLIT,
            f"no DataLoader here (line {lines}) is split{why}: "
            f"{'no loop the tool reads trains on it' if self.options.style == RUNTIME_STYLE else 'every process would train on whole batches'}"
            ": file left as it is",
        )
        backward_line = self.analysis.position(backward)[0]
        for wrap in self.program.wraps:
            # Every wrap the file keeps is named at its own line, not only the first site of the reason.
            self.left(wrap, UNSPLIT, f"kept as DataParallel: no DataLoader here is split (backward at line {backward_line})")

    def _unfollowed_loops(self) -> list[int]:
        """The lines of the training loops whose data the analysis did not follow to a loader, or whose training it
        could not tell (``if train:`` in a function of unknown callers)."""
        traces = self.analysis.loaders.traces
        followed = {trace.loop for trace in traces if trace.origin is not None}
        loops = {trace.loop for trace in traces if trace.unsure is not None or (trace.training and trace.loop not in followed)}
        return sorted(self.analysis.position(loop)[0] for loop in loops)
