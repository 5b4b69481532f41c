"""MGP310, MGP311: under ``--style torch`` random draws for the batch that each process makes alone keep the file off DDP."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.draws import GENERATOR_DRAWS, GENERATORS, names_rows, numpy_draw, project_draws
from mgpu_migrate.analysis.project import project_of
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, TORCH_STYLE, Example, Review, Rule
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS
from mgpu_migrate.analysis.batch import rows_of_a_tensor, split_training_loops

# The file is left as it is when either is reported (rules.settle).
NUMPY_DRAWS = Review(
    "MGP310",
    name="numpy-draws-per-row",
    summary=(
        "--style torch: numpy's or Python's generator draws for the batch in training (per row, or unseeded): "
        "each process its own"
    ),
    why=(
        "The training loop, or a function or method of the project it calls (the message names the draw's "
        "line), draws from numpy's or Python's generator for the batch's rows (a mixup lambda per pair of rows, "
        "`np.random.beta(a, a, len(x))`), or once a step in a file that seeds neither generator (CutMix's "
        "`np.random.rand(1)`). The original drew once for the whole batch; under `--style torch` each process "
        "would draw for its own rows from its own generator (seeded alike: every process gets the first rows' "
        "numbers; unseeded: a coefficient or decision of its own). The file is left as it is."
    ),
    todo=(
        "Use the default style (`--to ddp`): its runtime makes every process's Python, numpy and torch generators "
        "rank 0's and draws for the global batch, as the original did. Or seed numpy alike in every process for a "
        "draw once a step, then migrate."
    ),
    veto=True,
)
_NUMPY_SEEDS = frozenset({"numpy.random.seed", "random.seed"})
REPEATED_ROWS_DRAW = Review(
    "MGP311",
    name="repeated-rows-draw",
    summary="--style torch: a torch draw for repeated rows of the batch in training: each process draws its own",
    why=(
        "A function of the project that the training loop calls draws torch random numbers for copies of the "
        "batch laid end to end (`dup = x.expand(n, *x.shape).reshape(-1, ...)`, then `torch.randn_like(dup)`: "
        "sliced score matching's particles). Under `--style torch` each process draws them for its own rows from "
        "a generator seeded alike: every process gets the numbers the original drew for the first rows. The file "
        "is left as it is."
    ),
    todo=(
        "Use the default style (`--to ddp`), whose runtime draws for the global batch as the original did, or "
        "`--to balanced`."
    ),
    veto=True,
)


def _may_draw(source: str) -> bool:
    """Whether the file's own functions can hold a draw ``project_draws`` finds: every one is named through an
    import or a call that spells numpy's or Python's ``random`` module or a torch ``*_like`` draw (no alias of
    ``names.canonical`` leads there otherwise). Most files spell neither, and their text is then not parsed
    again with ``ast`` (a fifth of the LibCST parse's time, for each file whose loop calls a function of its own)."""
    return "random" in source or "_like" in source


class UnsyncedDraws(Rule):
    """
    ## What it does
    Under ``--to ddp --style torch``, reads each training loop whose data is split across processes, and the
    project's functions and methods it calls (in other modules too: ``Mixup.get_lambda`` in
    ``utils/utilities.py``), for random draws made for the batch that each process would make alone:

    * numpy's or Python's generator drawing for the batch's rows (``np.random.beta(a, a, len(x))``, a
      ``RandomState`` method called with the batch's size) (MGP310);
    * a torch draw shaped like copies of the batch laid end to end (``torch.randn_like(dup)`` after
      ``dup = x.expand(n, *x.shape).reshape(-1, ...)``) (MGP311).

    The file is then left as it is. The default style migrates such a file: its runtime gives every process
    rank 0's Python, numpy and torch generators at set-up and keeps them in step, and the loop draws for the
    global batch, so every process draws the original's numbers.

    ## Why is this bad?
    The original drew these numbers once for the whole batch. Under plain DDP each process draws them for its
    own rows from its own generator: seeded alike, every process gets the first rows' numbers (a mixup
    lambda, a noise vector), and the generators drift apart when the shares differ. A draw once per step for
    the whole batch (``lam = np.random.beta(a, a)``) is reported only when the file does not seed numpy's or
    Python's generator (``np.random.seed``, ``random.seed``): seeded alike, every process draws the original's
    number; unseeded, each process would mix its rows with a coefficient of its own.

    ## Example
    ```python
    mixup_augmenter = Mixup(mixup_alpha=1.0)    # utils/utilities.py: np.random.RandomState(...).beta(...)
    for batch in train_loader:
        lam = mixup_augmenter.get_lambda(batch_size=len(batch["waveform"]))
    ```

    ## Use instead
    The default style (``--to ddp``), or ``--to balanced`` (one process draws for the whole batch, as before).

    ## Fix safety
    Nothing is rewritten, in the whole file: ``--to ddp`` migrates a file entirely or not at all.
    """

    CODE = NUMPY_DRAWS
    PHASE = PROGRAM
    USES = ("bindings", "values")
    REVIEW_CODES = (NUMPY_DRAWS, REPEATED_ROWS_DRAW)
    DESCRIPTION = "--style torch: draws for the batch that each process makes alone keep the file off DDP"
    TARGETS = (DDP,)
    STYLES = (TORCH_STYLE,)
    EXAMPLES = (
        Example(
            """
            import numpy as np
            import torch.nn as nn
            from torch.utils.data import DataLoader

            model = nn.DataParallel(model)
            for x, y in DataLoader(data, batch_size=64, shuffle=True):
                lam = np.random.beta(1.0, 1.0, size=len(x))
                loss = criterion(model(x), y)
                loss.backward()
            """,
            None,
            DDP,
            ("MGP310",),
            TORCH_OPTIONS,
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        for loop in split_training_loops(self.analysis):
            for call in contains(loop.body, lambda node: type(node) is cst.Call):
                if self._report(call):
                    return

    def _report(self, call: cst.Call) -> bool:
        code = shorten(self.analysis.code_of(call), 30)
        if self._draws_here(call) and self._passes_rows(call):
            self.left(
                call,
                NUMPY_DRAWS,
                f"`{code}` draws from numpy's or Python's generator for the batch's rows: per process under plain "
                "DDP; file left as it is",
            )
            return True
        if self._draws_here(call) and not self._seeds_numpy():
            self.left(
                call,
                NUMPY_DRAWS,
                f"`{code}` draws from numpy's or Python's generator, not seeded in this file: each process would "
                "draw its own for its rows; file left",
            )
            return True
        project = project_of(self.analysis.path)
        for draw in self._project_draws(call, project) if project is not None else ():
            if draw.numpy and (draw.sized or self._passes_rows(call) or (draw.shared and not self._seeds_numpy())):
                self.left(
                    call,
                    NUMPY_DRAWS,
                    f"`{code}` draws from numpy's or Python's generator ({draw.where}) for the batch: per "
                    "process under plain DDP; file left",
                )
                return True
            if not draw.numpy:
                self.left(
                    call,
                    REPEATED_ROWS_DRAW,
                    f"the call draws `{shorten(draw.code, 32)}` ({draw.where}) for repeated rows of the batch: "
                    "each process draws its own; file left",
                )
                return True
        return False

    def _seeds_numpy(self) -> bool:
        """``np.random.seed(...)`` or ``random.seed(...)`` in this file: every process then draws, once per step,
        the number the original drew for the whole batch."""
        return any(self.analysis.resolve(call.func) in _NUMPY_SEEDS for call in self.analysis.calls)

    def _passes_rows(self, call: cst.Call) -> bool:
        """An argument that is the batch's number of rows: ``batch_size=len(x)``, ``x.size(0)``, ``bs``."""
        for arg in call.args:
            if arg.keyword is not None and names_rows(arg.keyword.value):
                return True
            rows = contains(arg.value, lambda node: type(node) in (cst.Call, cst.Subscript) and rows_of_a_tensor(node))
            names = contains(arg.value, lambda node: type(node) is cst.Name and names_rows(node.value))
            if rows or names:
                return True
        return False

    def _draws_here(self, call: cst.Call) -> bool:
        """``np.random.X(...)``, ``random.X(...)``, or a draw of a generator object made in this file."""
        if numpy_draw(self.analysis.resolve(call.func)):
            return True
        func = call.func
        if not (type(func) is cst.Attribute and func.attr.value in GENERATOR_DRAWS):
            return False
        values = self.analysis.values
        return any(
            type(value) is cst.Call and self.analysis.resolve(value.func) in GENERATORS
            for value in values.of(func.value, values.scope_of(call))
        )

    def _project_draws(self, call: cst.Call, project):
        """The draws of the project function called (this file's own too), or of the project class's method
        called on an object this file made (``Mixup(...).get_lambda``)."""
        qualified = self.analysis.resolve(call.func)
        found = project.find(qualified) if qualified else None
        if (
            found is None
            and type(call.func) is cst.Name
            and call.func.value in self.analysis.bindings.local
            and _may_draw(self.analysis.source)
        ):
            found = project.own(call.func.value, self.analysis.source)
        if found is not None:
            return project_draws(project, found)
        func = call.func
        if type(func) is not cst.Attribute:
            return []
        values = self.analysis.values
        for value in values.of(func.value, values.scope_of(call)):
            constructor = self.analysis.resolve(value.func) if type(value) is cst.Call else None
            cls = project.find(constructor) if constructor else None
            if cls is not None:
                return project_draws(project, cls, func.attr.value)
        return []
