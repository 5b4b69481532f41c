"""MGP121: a wrap under a GPU guard happens on every process of a multi-process run (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.entrypoint import distributed_program
from mgpu_migrate.analysis.guards import Reliance, gpu_guards, guard_reliance, is_gpu_condition
from mgpu_migrate.rules.base import DDP, Example, Rule
from mgpu_migrate.rules.syntax import RUNTIME, argument, either, mentions

MANY_PROCESSES = f"{RUNTIME}.world_size() > 1"


# The file is left as it is when this is reported (rules.settle).
SWITCHED_OFF = "MGP256"


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
    processes always wrap. Other statements under the same guard then also run in a multi-process run, so
    a guard is extended only when they can run where the condition is false. One whose body needs the
    condition (``net.to(gpu_ids[0])`` under ``if len(gpu_ids) > 0:``; ``model.cuda()``,
    ``assert torch.cuda.is_available()`` or ``"cuda"`` under ``if use_cuda:``) is left as it is with MGP254:
    its wrap is still migrated, so a multi-process run where the condition holds (processes on GPUs) trains
    as one model, and one where it is false (processes on CPU) does not wrap, which the runtime's safety net
    stops at the first optimizer step (``UnsynchronizedTrainingError``) rather than train separate copies.
    A wrap under a condition that is not about GPUs (``if args.resume:``), or in an ``else``/``elif``
    branch, is left with MGP233. The ``if n_gpu > 1: loss = loss.mean()`` that often goes with such a
    guard is left as it is: under DDP the loss is already a scalar, and its mean is itself.
    """

    CODE = "MGP121"
    REVIEW_CODES = {
        "MGP233": "a wrap under a condition that is not a GPU guard, or in an else/elif branch; every process must wrap",
        "MGP254": "a GPU guard around a wrap not extended: a statement under it needs the guard's condition to hold",
        SWITCHED_OFF: "a wrap under a flag set to False (`USE_DATA_PARALLEL = False`): it never runs; file left as it is",
    }
    DESCRIPTION = "GPU guard around a wrap extended so that every process of a multi-process run wraps"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            "import torch.nn as nn\n\nUSE_DATA_PARALLEL = False\nif USE_DATA_PARALLEL:\n    model = nn.DataParallel(model)\n"
            "for x in loader:\n    model(x).mean().backward()\n",
            None,
            DDP,
            ("MGP256",),
        ),
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
        Example(
            "import torch.nn as nn\n\n\ndef init_net(net, gpu_ids):\n    if len(gpu_ids) > 0:\n        net.to(gpu_ids[0])\n"
            "        net = nn.DataParallel(net)\n    return net\n",
            "import mgpu_runtime\n\n\ndef init_net(net, gpu_ids):\n    if len(gpu_ids) > 0:\n        net.to(gpu_ids[0])\n"
            "        net = mgpu_runtime.DistributedDataParallel(net)\n    return net\n",
            DDP,
            ("MGP101", "MGP254", "MGP262"),
        ),
    )

    def apply(self) -> None:
        program = distributed_program(self.analysis, self.edits.replacements)
        if not program.migrates:
            return
        seen: set[cst.CSTNode] = set()
        dropped = self._dropped_by_rewrite(program.wraps)
        for wrap in program.wraps:
            for guard, in_else in gpu_guards(self.analysis, wrap):
                if guard in seen or mentions(guard.test, "world_size"):
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
                switched_off = self._switched_off(guard.test, wrap)
                if switched_off is not None:
                    self.left(
                        wrap,
                        SWITCHED_OFF,
                        f"the wrap never runs: `{condition}` is False (line {switched_off}), so the original never "
                        "parallelized; extending the guard would turn it on, so the file is left as it is",
                    )
                    continue
                if not self.rewrite_allowed(guard.test):
                    continue
                seen.add(guard)
                reliance = guard_reliance(self.analysis, guard, dropped)
                if reliance is not None:
                    self._left_as_it_is(guard, condition, reliance)
                    continue
                self.edits.replace(guard.test, lambda test: either(test, MANY_PROCESSES))
                self.edits.need_import(RUNTIME)
                others = self._other_statements(guard, program.wraps)
                also = f" (and runs the {others} other statement{'s' if others > 1 else ''} under it)" if others else ""
                self.rewrote(guard.test, f"`{condition}` extended: every process of a multi-process run wraps{also}")

    def _switched_off(self, test: cst.BaseExpression, wrap: cst.Call) -> int | None:
        """The line of ``USE_DATA_PARALLEL = False`` when the guard is a name bound only to False there."""
        if not isinstance(test, cst.Name):
            return None
        values = self.analysis.values
        bound = values.of(test, values.scope_of(wrap))
        if bound and all(isinstance(value, cst.Name) and value.value == "False" for value in bound):
            return self.analysis.position(bound[0])[0]
        return None

    @staticmethod
    def _dropped_by_rewrite(wraps: tuple[cst.Call, ...]) -> set[cst.CSTNode]:
        """The parts of the wraps that their rewrite drops or replaces: the callee and every argument but the
        module (``device_ids=gpu_ids`` needs nothing once it is gone)."""
        dropped: set[cst.CSTNode] = set()
        for wrap in wraps:
            module = argument(wrap, "module", 0)
            dropped.add(wrap.func)
            dropped.update(arg for arg in wrap.args if arg is not module)
        return dropped

    def _left_as_it_is(self, guard: cst.If | cst.IfExp, condition: str, reliance: Reliance) -> None:
        code = self.analysis.module.code_for_node
        statement = self.analysis.tree.statement(reliance.node)
        shown = statement if isinstance(statement, cst.SimpleStatementLine) else reliance.node
        text = code(shown).strip().splitlines()[0]
        line, _ = self.analysis.position(reliance.node)
        self.left(
            guard.test,
            "MGP254",
            f"`{condition}` not extended: `{text}` (line {line}) under it {reliance.reason}, so it cannot run where "
            "the condition is false. A multi-process run where the condition is false (processes on CPU, say) does "
            f"not wrap; once {RUNTIME}.setup() has run, the runtime's safety net stops such a run at its first "
            "optimizer step (UnsynchronizedTrainingError). To train there, move the wrap out from under this "
            "condition, so that every process runs it",
        )

    def _other_statements(self, guard: cst.If | cst.IfExp, wraps: tuple[cst.Call, ...]) -> int:
        """How many statements under ``guard`` hold no wrap: they too now run on every process."""
        tree = self.analysis.tree
        holding = {ancestor for wrap in wraps for ancestor in tree.ancestors(wrap)}
        body = guard.body.body if isinstance(guard, cst.If) and isinstance(guard.body, cst.IndentedBlock) else ()
        return sum(1 for statement in body if statement not in holding)
