"""MGP282: a training step each process would skip (or not) on its own keeps the file off DDP (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.tree import contains, item_target
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, TORCH_STYLE, Example, Review, Rule
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS

PER_RANK_STEP = Review(
    "MGP282",
    name="per-process-step",
    summary=(
        "each process would decide alone whether to take a training step (an error it catches; --style torch: "
        "its own rows)"
    ),
    why=(
        "A `try: ... except ...: continue` around the training step skips it on the process where the error is "
        "raised, and only there (running out of memory is one process's error): the others go on into the step's "
        "collectives, so the reductions of different steps pair up, or the run hangs. Under `--style torch` the "
        "same holds for a statement before `backward` that decides from the batch whether to take the step (`if "
        "loss == 0: continue`, `if labels.numel() == 0: continue`): each process would decide from its own rows. "
        "(The default style migrates such an `if`: its runtime's batches, outputs and losses are the global "
        "batch's, so every process decides alike, as the original did.) The file is left as it is."
    ),
    todo=(
        "Make the decision the same on every process (`skip = mgpu_runtime.reduce_sum(torch.tensor(float(failed))) > "
        "0`, skipping when any process failed), or remove it; then run the tool again. `--to balanced` keeps one "
        "process and is exact."
    ),
    veto=True,
)
_LOOPS = (cst.For, cst.While)
_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
# A `raise` stops the run on that process, loudly: not a silent drift.
_LEAVES = (cst.Continue, cst.Break, cst.Return)


class PerRankSteps(Rule):
    """
    ## What it does
    Reports a training step inside ``try: ... except ...: continue`` (or ``pass``), which each process would
    skip alone, where its own error is raised. Under ``--style torch`` it also reports a decision inside a
    training loop, before its backward pass, that each process would take from its own share of the batch:
    ``if labels.numel() == 0: continue``, ``if bool(loss == 0): continue``,
    ``if torch.isnan(loss.item()): break``, a backward pass under such an ``if``. The file is then left as it
    is. The default style migrates such an ``if``: the values it reads are the global batch's on every process.

    ## Why is this bad?
    DataParallel took the decision once, in its one process. Under DDP a process that skips while the others
    run their backward pass pairs the gradient reductions of different steps: training drifts without an
    error (or hangs at the end), and no rewrite of the ``try`` alone can say what the original meant for a
    step that failed on one device.

    ## Example
    ```python
    for images, labels in loader:
        try:
            loss = criterion(model(images), labels)
            loss.backward()
        except RuntimeError:   # out of memory
            continue
    ```

    ## Use instead
    Make the decision the same on every process (``skip = mgpu_runtime.reduce_sum(torch.tensor(float(failed)))
    > 0``, skipping when any process failed), then migrate the file.

    ## Fix safety
    Nothing is rewritten, in the whole file: ``--to ddp`` migrates a file entirely or not at all.
    """

    CODE = PER_RANK_STEP
    PHASE = PROGRAM
    USES = ("loaders", "models", "values")
    REVIEW_CODES = (PER_RANK_STEP,)
    DESCRIPTION = "per-process decisions to skip a training step keep the file off DDP"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model)
            for x, y in loader:
                try:
                    loss = model(x).sum()
                    loss.backward()
                except RuntimeError:
                    continue
            """,
            None,
            DDP,
            (PER_RANK_STEP,),
            message="skips the step on the process where it fails",
            line=5,
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model)
            for x, y in loader:
                if y.numel() == 0:
                    continue
                loss = model(x).sum()
                loss.backward()
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            for x, y in loader:
                if y.numel() == 0:
                    continue
                loss = model(x).sum()
                loss.backward()
            """,
            DDP,
            ("MGP101",),
            name="a-decision-from-the-global-batch-is-every-processs",
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model)
            for x, y in loader:
                if y.numel() == 0:
                    continue
                loss = model(x).sum()
                loss.backward()
            """,
            None,
            DDP,
            (PER_RANK_STEP,),
            TORCH_OPTIONS,
            message="decides from this process's own rows whether to skip the step",
            line=5,
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model)
            for i, (x, y) in enumerate(loader):
                if i < start:
                    continue
                loss = model(x).sum()
                loss.backward()
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            for i, (x, y) in enumerate(loader):
                if i < start:
                    continue
                loss = model(x).sum()
                loss.backward()
            """,
            DDP,
            ("MGP101",),
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        for call in self.analysis.calls:
            if not self.analysis.loaders.is_backward(call):
                continue
            found = self._per_rank_decision(call)
            if found is not None:
                node, what = found
                text = self.analysis.code_of(node.test if type(node) is cst.If else node).strip()
                text = text.splitlines()[0]
                self.left(
                    node,
                    PER_RANK_STEP,
                    f"`{shorten(text, 32)}` {what}: under DDP each process would decide alone; file left as it is",
                )
                return

    def _per_rank_decision(self, backward: cst.Call) -> tuple[cst.CSTNode, str] | None:
        tree = self.analysis.tree
        loop = None
        path = []
        for ancestor in tree.ancestors(backward):
            if isinstance(ancestor, _SCOPES):
                return None
            path.append(ancestor)
            if isinstance(ancestor, _LOOPS):
                loop = ancestor
                break
        if loop is None:
            return None
        # A loop that counts (`for iteration in range(n)`) binds the same values on every process.
        counts = type(loop) is cst.For and self.analysis.loaders.counts(loop)
        tainted = set() if counts else _loop_targets(loop)
        statement = tree.statement(backward)
        for node in path:
            if type(node) is cst.Try and any(_leaves_or_passes(handler.body) for handler in node.handlers):
                return node, "skips the step on the process where it fails, and only there"
        if self.options.style != TORCH_STYLE:
            return None  # the runtime's values are the global batch's: every process takes the same branch
        for before in loop.body.body:
            if before is statement or before in path:
                for node in path:
                    if type(node) is cst.If and node is not loop and self._per_rank(node.test, tainted):
                        return node, "decides from this process's own rows whether to run the backward pass"
                return None
            for branch in contains(before, lambda n: type(n) is cst.If):
                if _leaves(branch) and self._per_rank(branch.test, tainted):
                    return branch, "decides from this process's own rows whether to skip the step"
            tainted |= self._assigned_from(before, tainted)
        return None

    def _per_rank(self, test: cst.BaseExpression, tainted: set[str]) -> bool:
        """Whether a condition reads the batch or what the model made of it (``.item()`` of a loss)."""
        for node in contains(test, lambda n: type(n) in (cst.Name, cst.Attribute)):
            if type(node) is cst.Attribute and node.attr.value == "item":
                return True
            if type(node) is cst.Name and node.value in tainted:
                return True
        scope = self.analysis.values.scope_of(test)
        return bool(self.analysis.models.derived_sites(test, scope))

    def _assigned_from(self, statement: cst.CSTNode, tainted: set[str]) -> set[str]:
        found = set()
        for assign in contains(statement, lambda n: type(n) in (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            value = assign.value
            if value is None or not self._per_rank(value, tainted):
                continue
            targets = [t.target for t in assign.targets] if type(assign) is cst.Assign else [assign.target]
            for target in targets:
                found |= {n.value for n in contains(target, lambda n: type(n) is cst.Name)}
        return found


def _loop_targets(loop: cst.For | cst.While) -> set[str]:
    """The names a ``for`` loop binds from its data (not the counter of ``enumerate``)."""
    if type(loop) is not cst.For:
        return set()
    target = item_target(loop.target, loop.iter)
    return {node.value for node in contains(target, lambda n: type(n) is cst.Name)}


def _leaves(branch: cst.If) -> bool:
    """Whether the body of an ``if`` leaves the step (``continue``, ``break``, ``return``), outside
    any loop of its own."""
    return _leaves_or_passes(branch.body, passes=False)


def _leaves_or_passes(block: cst.BaseSuite, passes: bool = True) -> bool:
    kinds = (*_LEAVES, cst.Pass) if passes else _LEAVES
    found = contains(block, lambda n: isinstance(n, (*kinds, *_LOOPS)))
    # A `continue` or `break` of a loop inside the block leaves that loop, not the step.
    inside_loops = {id(n) for loop in found if isinstance(loop, _LOOPS) for n in contains(loop, lambda n: True)}
    return any(
        not isinstance(node, _LOOPS)
        and not (type(node) in (cst.Continue, cst.Break) and id(node) in inside_loops)
        for node in found
    )
