"""MGP125: progress bars are drawn by the main process only (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, has_star_args, keyword, mentions, operand, parse, with_keyword

# tqdm(iterable, desc, total, leave, file, ncols, mininterval, maxinterval, miniters, ascii, disable, ...)
_DISABLE_POSITION = 10
_ON_OTHER_PROCESSES = f"not {RUNTIME}.is_main_process()"


def is_progress_bar(qualified: str | None) -> bool:
    """``tqdm.tqdm``, ``tqdm.auto.tqdm``, ``tqdm.notebook.trange`` ..."""
    parts = (qualified or "").split(".")
    return len(parts) > 1 and parts[0] == "tqdm" and parts[-1] in ("tqdm", "trange")


PROGRESS_BAR_ON_EVERY_PROCESS = Review(
    "MGP241",
    name="progress-bar-on-every-process",
    summary="a progress bar whose disable argument the tool cannot see: it is drawn by every process",
    why=(
        "The progress bar passes a `disable` argument the tool cannot see into, or the script reads a private "
        "attribute of the bar (flownet2's `progress._time()`), which a bar made with `disable=True` never sets: "
        "so it is drawn by every process."
    ),
    todo="Add `or not mgpu_runtime.is_main_process()` to its `disable` value.",
)


class ProgressBar(Rule):
    """
    ## What it does
    Adds ``disable=not mgpu_runtime.is_main_process()`` to ``tqdm(...)`` and ``trange(...)`` (any import of
    them); a ``disable=X`` already there becomes ``disable=X if mgpu_runtime.is_main_process() else True``.

    ## Why is this bad?
    Under DDP every process runs the loop, so every process would draw its own bar over the others' in the
    same terminal.

    ## Example
    ```python
    for batch in tqdm(loader, desc="train"):
    ```

    ## Use instead
    ```python
    for batch in tqdm(loader, desc="train", disable=not mgpu_runtime.is_main_process()):
    ```

    ## Fix safety
    Safe: a bar only displays; in a single process it is drawn exactly as before. A call that passes
    ``disable`` positionally or through ``**kwargs`` is left with MGP241. ``print`` and ``logging`` are left
    as they are on purpose: a line from each process is noise, not damage, and guarding every one would
    bury the migration's real changes in the diff.
    """

    CODE = Rewrite("MGP125")
    PHASE = PROGRAM
    REVIEW_CODES = (PROGRESS_BAR_ON_EVERY_PROCESS,)
    DESCRIPTION = "tqdm progress bars shown on the main process only"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            from tqdm import tqdm

            model = nn.DataParallel(model)
            for x in tqdm(batches, **options):
                model(x).mean().backward()
            """,
            """
            from tqdm import tqdm
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            for x in tqdm(batches, **options):
                model(x).mean().backward()
            """,
            DDP,
            ("MGP101", "MGP241"),
        ),
        Example(
            """
            import torch.nn as nn
            from tqdm import tqdm

            model = nn.DataParallel(model)
            for x in tqdm(batches, desc='train'):
                model(x).mean().backward()
            """,
            """
            from tqdm import tqdm
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            for x in tqdm(batches, desc='train', disable=not mgpu_runtime.is_main_process()):
                model(x).mean().backward()
            """,
            DDP,
            ("MGP101", "MGP125"),
        ),
        Example(
            """
            import torch.nn as nn
            from tqdm import tqdm

            model = nn.DataParallel(model)
            progress = tqdm(batches)
            last = progress._time()
            for x in progress:
                model(x).mean().backward()
            """,
            """
            from tqdm import tqdm
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            progress = tqdm(batches)
            last = progress._time()
            for x in progress:
                model(x).mean().backward()
            """,
            DDP,
            ("MGP101", "MGP241"),
            name="a private attribute read of the bar (flownet2's `progress._time()`): a disabled bar lacks it",
        ),
        Example(
            """
            import torch.nn as nn
            from tqdm import tqdm

            model = nn.DataParallel(model)
            bar = tqdm(total=10)  # noqa: MGP125
            """,
            """
            from tqdm import tqdm
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            bar = tqdm(total=10)  # noqa: MGP125
            """,
            DDP,
            ("MGP101",),
        ),
        Example(
            """
            import torch.nn as nn
            import tqdm

            model = nn.DataParallel(model)
            bar = tqdm.trange(10, disable=args.quiet)
            """,
            """
            import tqdm
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            bar = tqdm.trange(10, disable=args.quiet if mgpu_runtime.is_main_process() else True)
            """,
            DDP,
            ("MGP101", "MGP125"),
        ),
    )

    def apply(self) -> None:
        if not self.program.runs_distributed:
            return
        for call in self.analysis.calls:
            if not is_progress_bar(self.analysis.resolve(call.func)):
                continue
            disable = keyword(call, "disable")
            if disable is not None and (mentions(disable.value, "is_main_process") or _always(disable.value)):
                continue  # (`disable=True`: a bar drawn by no process)
            positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
            if has_star_args(call) or len(positional) > _DISABLE_POSITION:
                self.left(call, PROGRESS_BAR_ON_EVERY_PROCESS, f"progress bar drawn by every process: pass `disable={_ON_OTHER_PROCESSES}`")
                continue
            private = self._private_read(call)
            if private is not None:
                # flownet2's `progress._time()`: a disabled tqdm never sets its private attributes.
                self.left(call, PROGRESS_BAR_ON_EVERY_PROCESS, f"progress bar drawn by every process: the script reads its `{private}`, which a disabled bar lacks")
                continue
            if not self.rewrite_allowed(call):
                continue
            self.edits.replace(call, lambda updated: _disabled_elsewhere(updated))
            self.edits.need_import(RUNTIME)
            self.rewrote(call, "progress bar drawn by the main process only")


    def _private_read(self, call: cst.Call) -> str | None:
        """A private attribute the file reads of the bar ``call`` makes (``progress = tqdm(...)``, then
        ``progress._time()``), else None."""
        parent = self.analysis.tree.parent(call)
        if type(parent) is not cst.Assign or len(parent.targets) != 1 or type(parent.targets[0].target) is not cst.Name:
            return None
        name = parent.targets[0].target.value
        function = self.analysis.tree.function(call)
        scope = function if function is not None else self.analysis.module
        for node in contains(scope, lambda n: type(n) is cst.Attribute):
            if type(node.value) is cst.Name and node.value.value == name and node.attr.value.startswith("_"):
                return node.attr.value
        return None


def _always(value: cst.BaseExpression) -> bool:
    return type(value) is cst.Name and value.value == "True"


def _disabled_elsewhere(call: cst.Call) -> cst.Call:
    disable = keyword(call, "disable")
    if disable is None:
        return with_keyword(call, "disable", parse(_ON_OTHER_PROCESSES))
    condition = cst.IfExp(
        test=parse(f"{RUNTIME}.is_main_process()"), body=operand(disable.value), orelse=cst.Name("True")
    )
    return call.with_changes(args=[arg.with_changes(value=condition) if arg is disable else arg for arg in call.args])
