"""MGP141, MGP282: a training step each process would skip (or not) on its own (``--to ddp``).

The runtime's style migrates a ``try:`` that skips a failing step with ``mgpu_runtime.fail_together()`` (MGP141);
``--style torch``, which has no runtime, leaves the file (MGP282)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.tree import contains, item_target
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, TORCH_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, runtime_call
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS

PER_RANK_STEP = Review(
    "MGP282",
    name="per-process-step",
    summary=(
        "each process would decide alone whether to take a training step (an error it catches; --style torch: "
        "its own rows)"
    ),
    why=(
        "Under `--style torch`: a `try: ... except ...: continue` around the training step skips it on the process "
        "where the error is raised, and only there (running out of memory is one process's error): the others go on "
        "into the step's collectives, so the reductions of different steps pair up, or the run hangs. The same "
        "holds for a statement before `backward` that decides from the batch whether to take the step (`if loss == "
        "0: continue`, `if labels.numel() == 0: continue`): each process would decide from its own rows. The file "
        "is left as it is. (The default style migrates both: its runtime's batches, outputs and losses are the "
        "global batch's, so every process decides alike, and `mgpu_runtime.fail_together()` (MGP141) raises an "
        "error of one process's forward in every process.)"
    ),
    todo=(
        "Migrate with the default style, or make the decision the same on every process (`skip = "
        "mgpu_runtime.reduce_sum(torch.tensor(float(failed))) > 0`, skipping when any process failed), or remove "
        "it; then run the tool again. `--to balanced` keeps one process and is exact."
    ),
    veto=True,
)
FAIL_TOGETHER = Rewrite("MGP141")
_TRY_AROUND_THE_STEP = """
    import torch.nn as nn

    model = nn.DataParallel(model)
    for x, y in loader:
        try:
            loss = model(x).sum()
            loss.backward()
        except RuntimeError:
            continue
    """
_LOOPS = (cst.For, cst.While)
_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
# A `raise` stops the run on that process, loudly: not a silent drift.
_LEAVES = (cst.Continue, cst.Break, cst.Return)


class PerRankSteps(Rule):
    """
    ## What it does
    Under ``--to ddp``, finds a training step inside ``try: ... except ...: continue`` (or ``pass``, ``break``,
    ``return``: a step function's own ``try``), which each process would skip alone, where its own error is
    raised. The runtime's style starts the ``try``'s body with ``mgpu_runtime.fail_together()``: from then on
    an error raised in one process's replica forward is raised in every process (the lowest failing rank's, as
    DataParallel re-raised its first failing replica's: the same type, ``Caught <type> in replica <r> on device
    <r>.`` and the original traceback), so every process takes the same ``except`` branch and skips the same
    step.

    Under ``--style torch``, which has no runtime, the file is left as it is (MGP282). So it is for a decision
    inside a training loop, before its backward pass, that each process would take from its own share of the
    batch: ``if labels.numel() == 0: continue``, ``if bool(loss == 0): continue``,
    ``if torch.isnan(loss.item()): break``, a backward pass under such an ``if``. The default style migrates such
    an ``if`` as it is: the values it reads are the global batch's on every process.

    ## Why is this bad?
    DataParallel ran the step in one process: an error of any replica was re-raised there, and the step was
    skipped once. Under DDP a process that skips while the others run their backward pass pairs the gradient
    reductions of different steps: training drifts without an error, or hangs.

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
    ```python
    for images, labels in loader:
        try:
            mgpu_runtime.fail_together()
            loss = criterion(model(images), labels)
            loss.backward()
        except RuntimeError:   # out of memory
            continue
    ```

    ## Fix safety
    Exact for an error raised in the forward of a wrapped model (where each process runs its own rows) and for
    one raised outside it: there every process computes the same global values, so an error is every process's.
    It costs one host-side exchange of a flag per forward. Not covered: an error inside ``backward()`` on one
    process only (one GPU out of memory in the backward pass); DDP's gradient reduction has started on the
    others by then, and the job stops instead of skipping the step. Under ``--style torch`` nothing is
    rewritten, in the whole file.
    """

    CODE = FAIL_TOGETHER
    PHASE = PROGRAM
    USES = ("loaders", "models", "values")
    REVIEW_CODES = (PER_RANK_STEP,)
    DESCRIPTION = "a try: that skips a failing step: its error raised in every process (fail_together)"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            _TRY_AROUND_THE_STEP,
            """
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            for x, y in loader:
                try:
                    mgpu_runtime.fail_together()
                    loss = model(x).sum()
                    loss.backward()
                except RuntimeError:
                    continue
            """,
            DDP,
            ("MGP101", FAIL_TOGETHER),
            message="raises one process's forward error in every process",
            line=5,
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model)


            def train_step(x):
                try:
                    loss = model(x).sum()
                    loss.backward()
                    optimizer.step()
                except RuntimeError as error:  # out of memory
                    print(error)
                    return None
                return loss.item()


            for x, y in loader:
                train_step(x)
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)


            def train_step(x):
                try:
                    mgpu_runtime.fail_together()
                    loss = model(x).sum()
                    loss.backward()
                    optimizer.step()
                except RuntimeError as error:  # out of memory
                    print(error)
                    return None
                return loss.item()


            for x, y in loader:
                train_step(x)
            """,
            DDP,
            ("MGP101", FAIL_TOGETHER),
            name="a-step-functions-own-try",
        ),
        Example(
            _TRY_AROUND_THE_STEP,
            None,
            DDP,
            (PER_RANK_STEP,),
            TORCH_OPTIONS,
            message="skips the step on the process where it fails",
            line=5,
            name="style-torch-leaves-a-try-around-the-step",
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
        if self.options.style != TORCH_STYLE:
            self._fail_together()
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
        path = _path_to_loop(tree, backward)
        if path is None:
            return None
        loop = path[-1]
        assert isinstance(loop, _LOOPS)
        # A loop that counts (`for iteration in range(n)`) binds the same values on every process.
        counts = type(loop) is cst.For and self.analysis.loaders.counts(loop)
        tainted = set() if counts else _loop_targets(loop)
        statement = tree.statement(backward)
        for node in _failing_steps(path):
            return node, "skips the step on the process where it fails, and only there"
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

    def _fail_together(self) -> None:
        """The runtime's style: each ``try:`` that skips a failing step starts with ``mgpu_runtime.fail_together()``,
        so an error raised in one process's forward is raised in every process (the runtime's values outside the
        forward are the global batch's, so an error there is every process's already)."""
        done: set[int] = set()
        for call in self.analysis.calls:
            if not self.analysis.loaders.is_backward(call):
                continue
            for node in _failing_steps(_path_in_scope(self.analysis.tree, call)):
                if id(node) in done:
                    continue
                done.add(id(node))
                if not self.rewrite_allowed(node):
                    continue  # silenced at the try by its author: no error there is one process's alone
                body = node.body
                if type(body) is not cst.IndentedBlock:
                    self.left(node, PER_RANK_STEP, "`try:` with its body on its line: under DDP each process would skip alone; file left as it is")
                    continue
                first = body.body[0]
                if self.analysis.code_of(first).strip() == f"{RUNTIME}.fail_together()":
                    continue
                self.edits.insert_before(first, cst.SimpleStatementLine([cst.Expr(runtime_call("fail_together"))]))
                self.edits.need_import(RUNTIME)
                self.rewrote(
                    node,
                    "`try:` skips a failing step: `fail_together()` raises one process's forward error in every process",
                )

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


def _path_to_loop(tree, backward: cst.Call) -> list[cst.CSTNode] | None:
    """The nodes from ``backward`` up to the loop it is in, that loop included (None: no loop before its function
    or class)."""
    path = _path_in_scope(tree, backward)
    for index, node in enumerate(path):
        if isinstance(node, _LOOPS):
            return path[: index + 1]
    return None


def _path_in_scope(tree, backward: cst.Call) -> list[cst.CSTNode]:
    """The nodes from ``backward`` up to its function (or the module): a step function's own ``try:`` (``except
    RuntimeError: return None``) counts, with or without a loop around it there."""
    path = []
    for ancestor in tree.ancestors(backward):
        if isinstance(ancestor, _SCOPES):
            break
        path.append(ancestor)
    return path


def _failing_steps(path: list[cst.CSTNode]) -> list[cst.Try]:
    """The ``try:`` statements on ``path`` that catch an error and leave the step (``continue``, ``pass`` ...)."""
    return [
        node
        for node in path
        if type(node) is cst.Try and any(_leaves_or_passes(handler.body) for handler in node.handlers)
    ]


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
