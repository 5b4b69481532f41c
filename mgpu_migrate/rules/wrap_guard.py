"""MGP121: a wrap under a GPU guard happens on every process of a multi-process run (``--to ddp``)."""

from __future__ import annotations

import re

import libcst as cst

from mgpu_migrate.analysis.guards import Reliance, gpu_guards, guard_reliance, is_gpu_condition
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Review, Rewrite, Rule
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.rules.syntax import RUNTIME, argument, either, mentions

MANY_PROCESSES = f"{RUNTIME}.world_size() > 1"


SWITCHED_OFF = Review(
    "MGP256",
    name="wrap-switched-off",
    summary="a wrap under a flag set to False (`USE_DATA_PARALLEL = False`): it never runs; file left as it is",
    why=(
        "The wrap sits under a flag set to False (`USE_DATA_PARALLEL = False`): it never runs, so the original "
        "never parallelized. Extending the guard would turn it on, so the file is left as it is."
    ),
    todo="Nothing; set the flag and run the tool again to migrate the file.",
    veto=True,
)


WRAP_UNDER_OTHER_CONDITION = Review(
    "MGP233",
    name="wrap-under-other-condition",
    summary="a wrap under a condition that is not a GPU guard, or in an else/elif branch; every process must wrap",
    why=(
        "With several processes every process must wrap its model. The wrap runs only under a condition that "
        "is not a GPU guard, or in an `else`/`elif` branch, which the tool cannot extend safely."
    ),
    todo="Make sure the condition holds on every process, e.g. `... or mgpu_runtime.world_size() > 1`.",
)
GUARD_NEEDS_CONDITION = Review(
    "MGP254",
    name="guard-needs-condition",
    summary="a GPU guard around a wrap not extended: a statement under it needs the guard's condition to hold",
    why=(
        "A statement under the GPU guard needs the guard's condition to hold (`.cuda()` needs a GPU), so the "
        "guard cannot be extended to every process. A multi-process run where the condition is false does not "
        "wrap; after `mgpu_runtime.setup()` the runtime stops such a run at its first optimizer step "
        "(`UnsynchronizedTrainingError`)."
    ),
    todo="To train there, move the wrap out from under the condition, so that every process runs it.",
)


# A flag that says "several GPUs" (faster-rcnn's ``args.mGPUs``, ``multi_gpu``, SAGAN's ``self.parallel``), not one
# that says "a GPU" (``args.cuda``, ``use_gpu``), whose other tests are about the device, not the wrap.
_PARALLEL_FLAG = re.compile(r"multi|mgpu|parallel|^dp$|_dp$|^dp_", re.IGNORECASE)


def _is_parallel_flag(test: cst.BaseExpression) -> bool:
    if type(test) is cst.Attribute:
        return bool(_PARALLEL_FLAG.search(test.attr.value))
    return type(test) is cst.Name and bool(_PARALLEL_FLAG.search(test.value))


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
    guard is left as it is: under DDP the loss is already a scalar, and its mean is itself. When the guard is
    a flag for several GPUs (``if args.mGPUs:``, not ``if args.cuda:``), the file's other tests of the same
    flag say "the model is wrapped" (the mean of the losses gathered from ``forward``, the ``model.module``
    saved) and are extended alike, unless their body needs the flag itself.
    """

    CODE = Rewrite("MGP121")
    PHASE = PROGRAM
    USES = ("values",)
    REVIEW_CODES = (WRAP_UNDER_OTHER_CONDITION, GUARD_NEEDS_CONDITION, SWITCHED_OFF)
    DESCRIPTION = "GPU guard around a wrap extended so that every process of a multi-process run wraps"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn

            USE_DATA_PARALLEL = False
            if USE_DATA_PARALLEL:
                model = nn.DataParallel(model)
            for x in loader:
                model(x).mean().backward()
            """,
            None,
            DDP,
            ("MGP256",),
        ),
        Example(
            """
            import torch
            if torch.cuda.device_count() > 1:
                model = torch.nn.DataParallel(model)
            """,
            """
            import torch
            import mgpu_runtime
            if torch.cuda.device_count() > 1 or mgpu_runtime.world_size() > 1:
                model = mgpu_runtime.DistributedDataParallel(model)
            """,
            DDP,
            ("MGP101", "MGP121"),
        ),
        Example(
            """
            import torch.nn as nn
            if args.multi_gpu:
                model = nn.DataParallel(model)
            """,
            """
            import mgpu_runtime
            if args.multi_gpu or mgpu_runtime.world_size() > 1:
                model = mgpu_runtime.DistributedDataParallel(model)
            """,
            DDP,
            ("MGP101", "MGP121"),
        ),
        Example(
            """
            import torch
            import torch.nn as nn
            if args.mGPUs:
                model = nn.DataParallel(model)
            torch.save(model.module.state_dict() if args.mGPUs else model.state_dict(), "model.pt")
            """,
            """
            import torch
            import mgpu_runtime
            if args.mGPUs or mgpu_runtime.world_size() > 1:
                model = mgpu_runtime.DistributedDataParallel(model)
            torch.save(model.module.state_dict() if args.mGPUs or mgpu_runtime.world_size() > 1 else model.state_dict(), "model.pt")
            """,
            DDP,
            ("MGP101", "MGP121", "MGP121"),
            name="every-test-of-the-flag",
        ),
        Example(
            """
            import torch.nn as nn
            if args.resume:
                model = nn.DataParallel(model)
            """,
            """
            import mgpu_runtime
            if args.resume:
                model = mgpu_runtime.DistributedDataParallel(model)
            """,
            DDP,
            ("MGP101", "MGP233"),
        ),
        Example(
            """
            import torch.nn as nn


            def init_net(net, gpu_ids):
                if len(gpu_ids) > 0:
                    net.to(gpu_ids[0])
                    net = nn.DataParallel(net)
                return net
            """,
            """
            import mgpu_runtime


            def init_net(net, gpu_ids):
                if len(gpu_ids) > 0:
                    net.to(gpu_ids[0])
                    net = mgpu_runtime.DistributedDataParallel(net)
                return net
            """,
            DDP,
            ("MGP101", "MGP254"),
        ),
    )

    def apply(self) -> None:
        program = self.program
        if not program.migrates:
            return
        seen: set[cst.CSTNode] = set()
        dropped = self._dropped_by_rewrite(program.wraps)
        # The set-up relaunches only under this test (its else stays one process, MGP120): every process holds it.
        alone = program.one_process
        for wrap in program.wraps:
            conditions: list[str] = []  # those it runs under that are not a GPU count, innermost first
            otherwise: str | None = None  # the wrap's name, when the else of its one condition sets it another way
            for guard, in_else in gpu_guards(self.analysis, wrap):
                if guard in seen or mentions(guard.test, "world_size"):
                    continue
                if self._wraps_either_way(guard, program.wraps):
                    continue  # `if vgg: model.features = DataParallel(...)` `else: model = DataParallel(model)`
                if guard is alone and not in_else:
                    continue
                if self._fallback_of_own_path(guard, in_else):
                    continue  # `if args.nodes > 1: DDP(...)` `else: DataParallel(...)`: the runtime's processes take it
                is_elif = type(self.analysis.tree.parent(guard)) is cst.If
                condition = self.analysis.code_of(guard.test)
                if in_else or is_elif or not is_gpu_condition(guard.test):
                    branch = "the else branch of" if in_else else "the elif" if is_elif else "the condition"
                    conditions.append(f"{branch} `{shorten(condition)}`")
                    if not conditions[1:] and not in_else:
                        otherwise = self._set_otherwise(guard, wrap)
                    continue
                switched_off = self._switched_off(guard.test, wrap)
                if switched_off is not None:
                    self.left(
                        wrap,
                        SWITCHED_OFF,
                        f"the wrap never runs: `{shorten(condition)}` is False (line {switched_off}); the file is left "
                        "as it is",
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
                self.rewrote(guard.test, f"`{shorten(condition)}` extended: every process of a multi-process run wraps{also}")
                if _is_parallel_flag(guard.test):
                    self._extend_the_flag(guard, condition, seen, dropped)
            if conditions:
                # One line for the site, however deep the nesting (95 nested ifs printed 95 lines).
                more = f" and {len(conditions) - 1} more around it" if len(conditions) > 1 else ""
                if not more and otherwise is not None:
                    # InsightFace-v2's `if checkpoint is None: ... model = DataParallel(model)` `else: model =
                    # checkpoint['model']`: a resumed run takes the model another way, which `or world_size() > 1` drops
                    said = f"the wrap runs only under {conditions[0]}, and its else sets `{otherwise}` another way: make sure every process takes the same branch"
                    if len(said) > 160:
                        said = f"the wrap runs only under {conditions[0]}, its else sets `{otherwise}`: every process must take the same branch"
                else:
                    said = (
                        f"the wrap runs only under {conditions[0]}{more}: make sure {'they hold' if more else 'it holds'} on "
                        f"every process (e.g. `... or {MANY_PROCESSES}`)"
                    )
                self.left(wrap, WRAP_UNDER_OTHER_CONDITION, said)

    def _set_otherwise(self, guard: cst.If, wrap: cst.Call) -> str | None:
        """The name the wrap is assigned to, when the ``else`` of ``guard`` assigns it too (another way to the
        model: a checkpoint's), else None."""
        assign = self.analysis.tree.parent(wrap)
        if type(assign) is not cst.Assign or len(assign.targets) != 1 or type(guard.orelse) is not cst.Else:
            return None
        target = self.analysis.code_of(assign.targets[0].target)
        for node in contains(guard.orelse, lambda n: type(n) is cst.Assign):
            if any(self.analysis.code_of(t.target) == target for t in node.targets):
                return shorten(target, 20)
        return None

    def _fallback_of_own_path(self, guard: cst.If, in_else: bool) -> bool:
        """The wrap is in the ``else`` of ``guard``, which tests the condition under which the file starts or joins
        its own distributed path (``Program.beside``), or in the body of its negation (``if not args.distributed:``):
        the runtime's processes, set up where that path does not run, always take the wrap."""
        beside = self.program.beside
        if beside is None:
            return False
        condition = self.analysis.code_of(beside.test)
        return self.analysis.code_of(guard.test) == (condition if in_else else f"not {condition}")

    def _wraps_either_way(self, guard: cst.If | cst.IfExp, wraps: tuple[cst.Call, ...]) -> bool:
        """Whether both branches of an ``if``/``else`` wrap: whichever the condition takes, the process wraps."""
        if type(guard) is not cst.If or type(guard.orelse) is not cst.Else:
            return False
        ancestors = [set(map(id, self.analysis.tree.ancestors(wrap))) for wrap in wraps]
        return all(any(id(branch) in found for found in ancestors) for branch in (guard.body, guard.orelse))

    def _extend_the_flag(self, guard: cst.If | cst.IfExp, condition: str, seen: set[cst.CSTNode], dropped: set[cst.CSTNode]) -> None:
        """The file's other tests of the flag a wrap's guard was (faster-rcnn's ``if args.mGPUs:`` around the mean of
        the gathered losses it prints, and ``model.module.state_dict() if args.mGPUs else ...`` where it saves): they
        said "the model is wrapped", which it now is on every process of a multi-process run, so they are extended
        alike. A test whose body needs the flag itself (a GPU it names) is not."""
        line = self.analysis.position(guard.test)[0]
        wraps = self.program.wraps
        for node in contains(self.analysis.module, lambda n: type(n) in (cst.If, cst.IfExp)):
            if node is guard or node in seen or type(node.test) is not type(guard.test):
                continue
            if self.analysis.code_of(node.test) != condition or not self.rewrite_allowed(node.test):
                continue
            if contains(node, lambda n: any(n is wrap for wrap in wraps)):
                continue  # a wrap of its own: extended (or not) as a wrap's guard
            seen.add(node)
            if guard_reliance(self.analysis, node, dropped) is not None:
                continue
            self.edits.replace(node.test, lambda test: either(test, MANY_PROCESSES))
            self.rewrote(
                node.test,
                f"`{shorten(condition)}` extended as at line {line}: it says the model is wrapped, as it now is on every "
                "process of a multi-process run",
            )

    def _switched_off(self, test: cst.BaseExpression, wrap: cst.Call) -> int | None:
        """The line of ``USE_DATA_PARALLEL = False`` when the guard is a name bound only to False there."""
        if type(test) is not cst.Name:
            return None
        values = self.analysis.values
        bound = values.of(test, values.scope_of(wrap))
        if bound and all(type(value) is cst.Name and value.value == "False" for value in bound):
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
        code = self.analysis.code_of
        statement = self.analysis.tree.statement(reliance.node)
        shown = statement if type(statement) is cst.SimpleStatementLine else reliance.node
        text = code(shown).strip().splitlines()[0]
        line, _ = self.analysis.position(reliance.node)
        self.left(
            guard.test,
            GUARD_NEEDS_CONDITION,
            f"`{shorten(condition, 30)}` not extended: `{shorten(text, 30)}` (line {line}) under it {reliance.reason}, "
            "so it needs the condition",
        )

    def _other_statements(self, guard: cst.If | cst.IfExp, wraps: tuple[cst.Call, ...]) -> int:
        """How many statements under ``guard`` hold no wrap: they too now run on every process."""
        tree = self.analysis.tree
        holding = {ancestor for wrap in wraps for ancestor in tree.ancestors(wrap)}
        body = guard.body.body if type(guard) is cst.If and type(guard.body) is cst.IndentedBlock else ()
        return sum(1 for statement in body if statement not in holding)
