"""MGP136: PyTorch's old ``async=`` keyword becomes ``non_blocking=`` in a file that is migrated."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate import old_keywords
from mgpu_migrate.rules.base import PROGRAM, Example, Rewrite, Rule


class LegacyAsyncKeyword(Rule):
    """
    ## What it does
    In a file the tool migrates, renames the keyword ``async=`` of a tensor's ``.cuda(...)``, ``.type(...)``,
    ``.copy_(...)`` or ``.to(...)`` to ``non_blocking=``, the name PyTorch 0.4 gave it. Only these keyword
    arguments are renamed, and only in a file that no Python from 3.7 on can parse for them alone.

    ## Why is this bad?
    ``async`` is a reserved word from Python 3.7: ``target.cuda(async=True)`` is a syntax error, so the whole
    file does not parse (scripts of 2017 and early 2018 wrote it). Nothing could be migrated, and the migrated
    program needs a PyTorch that has only ``non_blocking`` anyway.

    ## Example
    ```python
    model = torch.nn.DataParallel(model)
    target = target.cuda(async=True)
    ```

    ## Use instead
    ```python
    model = mgpu_runtime.DistributedDataParallel(model)
    target = target.cuda(non_blocking=True)
    ```

    ## Fix safety
    Safe: ``non_blocking`` is the same option under its new name (a host-to-device copy that does not wait,
    from pinned memory). A file left as it is keeps ``async``, and ``async`` anywhere else (not a keyword of those
    four methods) stays a syntax error the file is left for (MGP002).
    """

    CODE = Rewrite("MGP136")
    PHASE = PROGRAM
    DESCRIPTION = "PyTorch's old `async=` keyword renamed `non_blocking=`"
    EXAMPLES = (
        Example(
            """
            import torch

            model = torch.nn.DataParallel(model)
            for x, target in loader:
                target = target.cuda(async=True)
                loss = criterion(model(x), target)
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DataParallelModel(model)
            for x, target in loader:
                target = target.cuda(non_blocking=True)
                loss = criterion(model(x), target)
            """,
            "balanced",
            ("MGP101", "MGP136"),
            message="`async=True` renamed `non_blocking=True`",
            line=5,
        ),
        Example(
            """
            import torch

            model = torch.nn.DataParallel(model)
            target = torch.autograd.Variable(target.cuda(async=True), volatile=True)
            """,
            """
            import torch
            import mgpu_runtime

            model = mgpu_runtime.DataParallelModel(model)
            target = torch.autograd.Variable(target.cuda(non_blocking=True), volatile=True)
            """,
            "balanced",
            ("MGP101", "MGP136"),
        ),
        Example(
            """
            import torch

            model = torch.nn.DataParallel(model)
            x = x.cuda(non_blocking=True)
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DataParallelModel(model)
            x = x.cuda(non_blocking=True)
            """,
            "balanced",
            ("MGP101",),
            name="MGP136-non-blocking-already",
        ),
    )

    def apply(self) -> None:
        for call in self.analysis.calls:
            func = call.func
            if not (type(func) is cst.Attribute and func.attr.value in old_keywords.METHODS):
                continue
            for arg in call.args:
                if arg.keyword is None or arg.keyword.value != old_keywords.PLACEHOLDER:
                    continue
                if not self.rewrite_allowed(call):
                    continue
                self.edits.replace(arg.keyword, lambda _: cst.Name(old_keywords.RENAMED))
                value = self.analysis.code_of(arg.value)
                self.rewrote(
                    arg,
                    f"`{old_keywords.KEYWORD}={value}` renamed `{old_keywords.RENAMED}={value}`, its name since PyTorch "
                    f"0.4 (`{old_keywords.KEYWORD}` is a reserved word from Python 3.7)",
                )
