"""MGP124: checkpoints are loaded onto each process's own device with ``mgpu_runtime.load`` (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, argument, has_star_args, mentions, runtime_attr

TORCH_LOAD = "torch.load"


class CheckpointLoad(Rule):
    """
    ## What it does
    Replaces ``torch.load(path)`` of a checkpoint (what the file then gives to ``load_state_dict``) with
    ``mgpu_runtime.load(path)``, which maps the tensors to this process's device.

    ## Why is this bad?
    Without ``map_location``, ``torch.load`` puts each tensor back on the device it was saved from, usually
    ``cuda:0``: under DDP every process would fill the first GPU with its own copy of the checkpoint.

    ## Example
    ```python
    model.load_state_dict(torch.load("model.pt"))
    ```

    ## Use instead
    ```python
    model.load_state_dict(mgpu_runtime.load("model.pt"))
    ```

    ## Fix safety
    Safe: ``load_state_dict`` copies into the model's own tensors wherever they live, and in a single
    process the device is the first GPU (or the CPU), where the original loaded to. A ``torch.load`` with
    its own ``map_location`` is left as it is, and so is a load that is not given to ``load_state_dict``
    (data, say), whose tensors the script may expect on the CPU, but for a whole model pickled in it that the
    file wraps (``net = checkpoint['net']``, then ``nn.DataParallel(net)``): mapped too, it is built on the
    process's own GPU, not first on the one it was saved from.
    """

    CODE = Rewrite("MGP124")
    PHASE = PROGRAM
    USES = ("models",)
    DESCRIPTION = "torch.load of a checkpoint mapped to the process's device with mgpu_runtime.load"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch

            model = torch.nn.DataParallel(model)
            model.load_state_dict(torch.load('model.pt'))
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            model.load_state_dict(mgpu_runtime.load('model.pt'))
            """,
            DDP,
            ("MGP101", "MGP124"),
        ),
        Example(
            """
            import torch

            model = torch.nn.DataParallel(model)
            state = torch.load('model.pt', map_location='cpu')
            model.load_state_dict(state)
            """,
            """
            import torch
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            state = torch.load('model.pt', map_location='cpu')
            model.load_state_dict(state)
            """,
            DDP,
            ("MGP101",),
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        for call in self.analysis.calls_to(TORCH_LOAD):
            if argument(call, "map_location", 1) is not None or has_star_args(call) or not self._is_checkpoint(call):
                continue
            if not self.rewrite_allowed(call):
                continue
            self.edits.replace(call.func, lambda _: runtime_attr("load"))
            self.edits.need_import(RUNTIME)
            self.rewrote(call, f"{RUNTIME}.load: the checkpoint is mapped to this process's device")

    def _is_checkpoint(self, call: cst.Call) -> bool:
        """Whether what ``call`` loads reaches ``load_state_dict``, directly or through the name it is stored in."""
        tree = self.analysis.tree
        for ancestor in tree.ancestors(call):
            if type(ancestor) is cst.Call and _is_load_state_dict(ancestor):
                return True
            if isinstance(ancestor, cst.BaseStatement):
                break
        statement = tree.statement(call)
        stored = [
            target.target.value
            for small in getattr(statement, "body", ())
            if type(small) is cst.Assign
            for target in small.targets
            if type(target.target) is cst.Name
        ]
        if not stored:
            return False
        scope = tree.function(call) or self.analysis.module
        uses = contains(scope, lambda node: type(node) is cst.Call and _is_load_state_dict(node))
        if any(mentions(arg.value, name) for use in uses for arg in use.args for name in stored):
            return True
        return self._wrapped(scope, stored)

    def _wrapped(self, scope: cst.CSTNode, stored: list[str]) -> bool:
        """Whether a whole model pickled in the checkpoint is what a DataParallel of this scope wraps (wide-resnet's
        ``checkpoint = torch.load(path)``, ``net = checkpoint['net']``, ``nn.DataParallel(net, ...)``): every process
        would load its tensors onto the GPU they were saved from first."""
        names = set(stored)
        for node in contains(scope, lambda node: type(node) is cst.Assign):
            if any(mentions(node.value, name) for name in stored):
                names |= {target.target.value for target in node.targets if type(target.target) is cst.Name}
        for site in self.analysis.models.sites:
            wrapped = site.call.args[0].value if site.call.args and not site.call.args[0].keyword else None
            if wrapped is not None and any(mentions(wrapped, name) for name in names) and self._within(site.call, scope):
                return True
        return False

    def _within(self, node: cst.CSTNode, scope: cst.CSTNode) -> bool:
        return scope is self.analysis.module and self.analysis.tree.function(node) is None or any(
            ancestor is scope for ancestor in self.analysis.tree.ancestors(node)
        )


def _is_load_state_dict(call: cst.Call) -> bool:
    return type(call.func) is cst.Attribute and call.func.attr.value == "load_state_dict"
