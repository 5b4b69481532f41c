"""MGP131: a ``--local_rank`` argument defaults to the ``LOCAL_RANK`` that torchrun sets (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Rewrite, Rule
from mgpu_migrate.rules.syntax import keyword, mentions, parse

_OPTIONS = ("--local_rank", "--local-rank")


class LocalRankArgument(Rule):
    """
    ## What it does
    Changes the default of a ``--local_rank`` (or ``--local-rank``) command-line argument from a constant to
    the ``LOCAL_RANK`` environment variable: ``default=-1`` becomes
    ``default=int(os.environ.get("LOCAL_RANK", -1))``.

    ## Why is this bad?
    ``torch.distributed.launch`` passed ``--local_rank=N`` to every process; ``torchrun``, and the runtime when
    it relaunches a plainly started script on several GPUs, set ``LOCAL_RANK`` instead. A script that only
    reads the argument then believes it is not distributed, and every process takes its single-process path.

    ## Example
    ```python
    parser.add_argument("--local_rank", type=int, default=-1)
    ```

    ## Use instead
    ```python
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
    ```

    A file that sets up distributed training itself is otherwise left as it is (MGP231), its DataParallel
    fallback too; this rewrite stays, so that ``torchrun`` launches its own distributed path.

    ## Fix safety
    Safe: an explicit ``--local_rank=N`` still wins, and without a launcher the default is the old one.
    """

    # Kept when the file stays as it is because it runs distributed training of its own (MGP231).
    CODE = Rewrite("MGP131", kept_when_left=True)
    PHASE = PROGRAM
    USES = ("bindings",)
    DESCRIPTION = "--local_rank arguments default to the LOCAL_RANK variable torchrun sets"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import argparse
            import torch.nn as nn

            parser = argparse.ArgumentParser()
            parser.add_argument('--local_rank', type=int, default=-1)
            model = nn.DataParallel(model)
            """,
            """
            import argparse
            import mgpu_runtime
            import os

            parser = argparse.ArgumentParser()
            parser.add_argument('--local_rank', type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
            model = mgpu_runtime.DistributedDataParallel(model)
            """,
            DDP,
            ("MGP101", "MGP131"),
        ),
    )

    def apply(self) -> None:
        if not self.program.wraps and not self.program.own_path:
            return
        for call in self.analysis.calls:
            if not self._declares_local_rank(call):
                continue
            default = keyword(call, "default")
            if default is None or not _is_integer(default.value) or mentions(default.value, "environ"):
                continue
            if not self.rewrite_allowed(call):
                continue
            old = self.analysis.code_of(default.value)
            os_name = self._os_name()
            from_environment = parse(f'int({os_name}.environ.get("LOCAL_RANK", {old}))')
            self.edits.replace(default.value, lambda _, new=from_environment: new)
            if self.program.existing:
                # The file's own distributed path stays (MGP231): torchrun launches it once the rank is read.
                self.edits.keep_if_left(default.value, *(() if self._imports_os() else ("os",)))
            self.rewrote(
                call, "the local rank defaults to LOCAL_RANK, which torchrun sets instead of passing --local_rank"
            )

    def _declares_local_rank(self, call: cst.Call) -> bool:
        return (
            type(call.func) is cst.Attribute
            and call.func.attr.value == "add_argument"
            and any(
                type(arg.value) is cst.SimpleString and arg.value.evaluated_value in _OPTIONS
                for arg in call.args
                if arg.keyword is None
            )
        )

    def _os_name(self) -> str:
        bindings = self.analysis.bindings
        for name in sorted(bindings.imported):
            if bindings.qualified_name(name) == "os":
                return name
        self.edits.need_import("os")
        return "os"

    def _imports_os(self) -> bool:
        bindings = self.analysis.bindings
        return any(bindings.qualified_name(name) == "os" for name in bindings.imported)


def _is_integer(node: cst.BaseExpression) -> bool:
    if type(node) is cst.UnaryOperation and type(node.operator) is cst.Minus:
        node = node.expression
    return type(node) is cst.Integer
