"""MGP121: a wrap under a GPU guard happens on every process of a multi-process run (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.entrypoint import distributed_program
from mgpu_migrate.analysis.guards import gpu_guards, is_gpu_condition
from mgpu_migrate.rules.base import DDP, Example, Rule
from mgpu_migrate.rules.syntax import RUNTIME, either, mentions

MANY_PROCESSES = f"{RUNTIME}.world_size() > 1"


class WrapGuard(Rule):
    """
    ## What it does
    Extends the condition around a DataParallel wrap that only wraps when there are GPUs to spread over
    (``if n_gpu > 1:``, ``if torch.cuda.device_count() > 1:``, ``if len(gpu_ids) > 1:``, ``if args.multi_gpu:``,
    ``if use_cuda:``) with ``or mgpu_runtime.world_size() > 1``.

    ## Why is this bad?
    Under DDP every process of a multi-process run must wrap its model, or the processes train separate
    copies. A process may see one GPU (SLURM's ``--gpus-per-task``) or none (processes on CPU), so the
    original condition can be false exactly where wrapping matters.

    ## Example
    ```python
    if n_gpu > 1:
        model = torch.nn.DataParallel(model)
    ```

    ## Use instead
    ```python
    if n_gpu > 1 or mgpu_runtime.world_size() > 1:
        model = mgpu_runtime.DistributedDataParallel(model)
    ```

    ## Fix safety
    Safe: a single process evaluates the original condition and behaves as the original did; several
    processes always wrap. Other statements under the same guard then also run in a multi-process run.
    A wrap under a condition that is not about GPUs (``if args.resume:``), or in an ``else``/``elif``
    branch, is left with MGP233. The ``if n_gpu > 1: loss = loss.mean()`` that often goes with such a
    guard is left as it is: under DDP the loss is already a scalar, and its mean is itself.
    """

    CODE = "MGP121"
    REVIEW_CODES = {
        "MGP233": "a wrap under a condition that is not a GPU guard, or in an else/elif branch; every process must wrap",
    }
    DESCRIPTION = "GPU guard around a wrap extended so that every process of a multi-process run wraps"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            "import torch\nif torch.cuda.device_count() > 1:\n    model = torch.nn.DataParallel(model)\n",
            "import torch\nimport mgpu_runtime\n"
            "if torch.cuda.device_count() > 1 or mgpu_runtime.world_size() > 1:\n"
            "    model = mgpu_runtime.DistributedDataParallel(model)\n",
            DDP,
            ("MGP101", "MGP121"),
        ),
        Example(
            "import torch.nn as nn\nif args.multi_gpu:\n    model = nn.DataParallel(model)\n",
            "import mgpu_runtime\n"
            "if args.multi_gpu or mgpu_runtime.world_size() > 1:\n    model = mgpu_runtime.DistributedDataParallel(model)\n",
            DDP,
            ("MGP101", "MGP121"),
        ),
        Example(
            "import torch.nn as nn\nif args.resume:\n    model = nn.DataParallel(model)\n",
            "import mgpu_runtime\nif args.resume:\n    model = mgpu_runtime.DistributedDataParallel(model)\n",
            DDP,
            ("MGP101", "MGP233"),
        ),
    )

    def apply(self) -> None:
        program = distributed_program(self.analysis, self.edits.replacements)
        if not program.migrates:
            return
        extended: set[cst.CSTNode] = set()
        for wrap in program.wraps:
            for guard, in_else in gpu_guards(self.analysis, wrap):
                if guard in extended or mentions(guard.test, "world_size"):
                    continue
                is_elif = isinstance(self.analysis.tree.parent(guard), cst.If)
                condition = self.analysis.module.code_for_node(guard.test)
                if in_else or is_elif or not is_gpu_condition(guard.test):
                    branch = "the else branch of" if in_else else "the elif" if is_elif else "the condition"
                    self.left(
                        wrap,
                        "MGP233",
                        f"the wrap runs only under {branch} `{condition}`: with several processes every process must "
                        f"wrap, so make sure it holds on each (e.g. `... or {MANY_PROCESSES}`)",
                    )
                    continue
                if not self.rewrite_allowed(guard.test):
                    continue
                extended.add(guard)
                self.edits.replace(guard.test, lambda test: either(test, MANY_PROCESSES))
                self.edits.need_import(RUNTIME)
                others = self._other_statements(guard, program.wraps)
                also = f" (and runs the {others} other statement{'s' if others > 1 else ''} under it)" if others else ""
                self.rewrote(guard.test, f"`{condition}` extended: every process of a multi-process run wraps{also}")

    def _other_statements(self, guard: cst.If | cst.IfExp, wraps: tuple[cst.Call, ...]) -> int:
        """How many statements under ``guard`` hold no wrap: they too now run on every process."""
        tree = self.analysis.tree
        holding = {ancestor for wrap in wraps for ancestor in tree.ancestors(wrap)}
        body = guard.body.body if isinstance(guard, cst.If) and isinstance(guard.body, cst.IndentedBlock) else ()
        return sum(1 for statement in body if statement not in holding)
