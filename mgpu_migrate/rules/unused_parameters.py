"""MGP130: a model whose forward may skip some of its layers is wrapped with ``find_unused_parameters=True``."""

from __future__ import annotations

import os
import re
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.models import model_class, wrapped_classes
from mgpu_migrate.analysis.project import project_of
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.rules.base import DDP, PROGRAM, TORCH_STYLE, Example, Rewrite, Rule
from mgpu_migrate.rules.syntax import keyword, with_keyword

# torch.nn layers without parameters: skipping them leaves no gradient missing.
_PARAMETER_FREE = re.compile(
    r"torch\.nn\.(\w*(ReLU|LU|Dropout|Pool\w*|Softmax|Softmin|Sigmoid|Tanh|Shrink|Softplus|Softsign|Mish|Swish)"
    r"|Identity|Flatten|Unflatten|Upsample\w*|Threshold|\w*Pad\dd|PixelShuffle|PixelUnshuffle|ChannelShuffle|Hardtanh)$"
)
# Statements and expressions under which code may not run on every forward.
_CONDITIONAL = (cst.If, cst.IfExp, cst.While, cst.ExceptHandler, cst.BooleanOperation, cst.Match)


class UnusedParameters(Rule):
    """
    ## What it does
    Adds ``find_unused_parameters=True`` to the wrapper of a model (a class of this file) whose ``forward``
    may run without some of its layers: a layer built in ``__init__`` that ``forward`` (or a method it calls)
    never uses, uses only under a condition, or uses only after an early ``return``. Also to the wrapper of a
    model (of this file, or built by a project factory of another module: pytorch-retinanet's
    ``model.resnet50(...)``) whose ``forward`` may give a constant in place of a loss under a condition, itself
    or through what it calls and the loss modules it keeps on ``self`` (retinanet's ``FocalLoss``: a
    ``torch.tensor(0)`` for an image without a positive anchor; found by project reading). Under ``--style torch``,
    also to the wrapper of a model whose parameters are frozen after the wrap: ``requires_grad`` set (or
    ``requires_grad_()`` called) after the wrap in this file, or in a method of the model's class that is
    called through the wrapper (``model.module.freeze_backbone(epoch == 0)``). The runtime's wrapper needs
    no option for that: it follows the parameters that require gradients at each training step, wherever
    the script freezes them (a ``train()`` override, a helper of another module).

    ## Why is this bad?
    DDP reduces each parameter's gradient when it is ready, and by default waits for all of them: a step
    in which a layer got no gradient fails ("Expected to have finished reduction in the prior iteration")
    or hangs. DataParallel did not care. A parameter frozen after the wrap is one torch's DDP still waits
    for: its message blames the ``forward`` for not using it, when the script froze it. A constant loss is
    worse: DataParallel's replicas summed whatever reached them, but a process whose rows all take the
    constant's branch gives some layers no gradient, and the others wait for it until the time limit.

    ## Example
    ```python
    class Net(nn.Module):
        def forward(self, x, aux=False):
            h = self.body(x)
            return self.aux_head(h) if aux else self.head(h)

    model = nn.DataParallel(Net())
    ```

    ## Use instead
    ```python
    model = mgpu_runtime.DistributedDataParallel(Net(), find_unused_parameters=True)
    ```

    ## Fix safety
    Safe: the option only makes DDP look for parameters without a gradient after each backward pass, which
    costs a little time; the gradients are the same. Models from other modules are inspected only for a constant
    loss.
    """

    CODE = Rewrite("MGP130")
    PHASE = PROGRAM
    USES = ("models", "values")
    DESCRIPTION = "find_unused_parameters=True for a model whose forward may skip layers or give a constant loss"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.head = nn.Linear(4, 2)
                    self.aux = nn.Linear(4, 2)

                def forward(self, x, aux=False):
                    if aux:
                        return self.aux(x)
                    return self.head(x)


            model = nn.DataParallel(Net())
            """,
            """
            import torch.nn as nn
            import mgpu_runtime


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.head = nn.Linear(4, 2)
                    self.aux = nn.Linear(4, 2)

                def forward(self, x, aux=False):
                    if aux:
                        return self.aux(x)
                    return self.head(x)


            model = mgpu_runtime.DistributedDataParallel(Net(), find_unused_parameters=True)
            """,
            DDP,
            ("MGP101", "MGP130"),
        ),
        Example(
            """
            import torch.nn as nn


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.head = nn.Linear(4, 2)
                    self.drop = nn.Dropout(0.1)

                def forward(self, x):
                    if self.training:
                        x = self.drop(x)
                    return self.head(x)


            model = nn.DataParallel(Net())
            """,
            """
            import torch.nn as nn
            import mgpu_runtime


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.head = nn.Linear(4, 2)
                    self.drop = nn.Dropout(0.1)

                def forward(self, x):
                    if self.training:
                        x = self.drop(x)
                    return self.head(x)


            model = mgpu_runtime.DistributedDataParallel(Net())
            """,
            DDP,
            ("MGP101",),
        ),
    )

    def apply(self) -> None:
        program = self.program
        if not program.migrates:
            return
        classes = {s.name.value: s for s in self.analysis.module.body if type(s) is cst.ClassDef}
        for wrap in program.wraps:
            if keyword(wrap, "find_unused_parameters") is not None or not self.rewrite_allowed(wrap):
                continue
            model = model_class(self.analysis, wrap, classes)
            skipped = _maybe_skipped_layers(self.analysis, model, classes) if model is not None else []
            if skipped:
                layers = ", ".join(f"self.{name}" for name in skipped)
                why = f"{model.name.value}.forward may run without {layers}"
            else:
                why = self._constant_loss(wrap, model)
                if why is None and self.options.style == TORCH_STYLE:
                    why = self._frozen_after(wrap, model)
                if why is None:
                    continue
            self.edits.replace(wrap, lambda call: with_keyword(call, "find_unused_parameters", cst.Name("True")))
            self.rewrote(wrap, f"find_unused_parameters=True: {why}")

    def _frozen_after(self, wrap: cst.Call, model: Optional[cst.ClassDef]) -> Optional[str]:
        """What freezes parameters after ``wrap`` wrapped them: a method of the model's class that sets
        ``requires_grad``, called through a wrapped model; or such a statement after the wrap in this file."""
        analysis = self.analysis
        models = analysis.models
        site = models.site_of(wrap)
        freezing = {}
        if model is not None:
            freezing = {name: method for name, method in _methods(model).items() if _freezes(method) and name != "__init__"}
        for call in analysis.calls:
            func = call.func
            if type(func) is not cst.Attribute or func.attr.value not in freezing:
                continue
            owner = func.value
            if type(owner) is cst.Attribute and owner.attr.value == "module":
                owner = owner.value
            if site in models.model_sites(owner, analysis.values.scope_of(call)):
                line = analysis.position(call)[0]
                return f"`{model.name.value}.{func.attr.value}` freezes parameters after the wrap (line {line})"
        wrapped_at = analysis.position(wrap)
        for node in _freezes(analysis.module):
            in_class = any(type(ancestor) is cst.ClassDef for ancestor in analysis.tree.ancestors(node))
            if not in_class and analysis.position(node) > wrapped_at:
                return f"line {analysis.position(node)[0]} freezes parameters after the wrap"
        helpers = {
            s.name.value: s for s in analysis.module.body if type(s) is cst.FunctionDef and _freezes(s)
        }  # pix2pix's set_requires_grad(net, False), defined before the wrap and called after it
        for call in analysis.calls:
            if type(call.func) is not cst.Name or call.func.value not in helpers or analysis.position(call) <= wrapped_at:
                continue
            scope = analysis.values.scope_of(call)
            if any(site in models.model_sites(given.value, scope) for given in call.args):
                return f"`{call.func.value}` freezes parameters after the wrap (line {analysis.position(call)[0]})"
        return None

    def _constant_loss(self, wrap: cst.Call, model: Optional[cst.ClassDef]) -> Optional[str]:
        """Why the wrapped model's ``forward`` may give a loss with no path to some of its parameters: it, or the
        loss module it keeps (pytorch-retinanet's ``FocalLoss``), makes a constant in place of a loss under a
        condition (an image without a positive anchor), found by project reading of the model's class (of this
        file, or built by a project factory: ``model.resnet50(...)``)."""
        project = project_of(self.analysis.path)
        if project is None:
            return None
        for cls in wrapped_classes(self.analysis, wrap, project):
            made = project.constant_loss(cls)
            if made is not None:
                where = f"{os.path.relpath(made.path, os.path.dirname(self.analysis.path))}:{made.line}"
                return f"{shorten(cls.name, 24)}.forward may give a constant loss ({where} `{made.call}`), no gradient to some layers"
        return None

def _freezes(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``x.requires_grad = ...`` and ``x.requires_grad_(...)`` inside ``node``."""
    return contains(
        node,
        lambda n: (
            type(n) is cst.Assign
            and any(type(t.target) is cst.Attribute and t.target.attr.value == "requires_grad" for t in n.targets)
        )
        or (type(n) is cst.Call and type(n.func) is cst.Attribute and n.func.attr.value == "requires_grad_"),
        into_functions=True,
    )


def _methods(cls: cst.ClassDef) -> dict[str, cst.FunctionDef]:
    return {s.name.value: s for s in cls.body.body if type(s) is cst.FunctionDef}


def _self_name(method: cst.FunctionDef) -> Optional[str]:
    params = [*method.params.posonly_params, *method.params.params]
    return params[0].name.value if params else None


def _self_attribute(node: cst.CSTNode, self_name: str) -> Optional[str]:
    if type(node) is cst.Attribute and type(node.value) is cst.Name and node.value.value == self_name:
        return node.attr.value
    return None


def _layers(analysis, init: cst.FunctionDef, classes: dict[str, cst.ClassDef]) -> list[str]:
    """Attributes ``__init__`` sets to a layer that may hold parameters: torch's, or a class of this file."""
    self_name = _self_name(init)
    found = []
    for assign in contains(init, lambda node: type(node) is cst.Assign):
        if type(assign.value) is not cst.Call:
            continue
        func = assign.value.func
        qualified = analysis.resolve(func) or ""
        is_local_class = type(func) is cst.Name and func.value in classes
        if not is_local_class and (not qualified.startswith("torch.nn.") or _PARAMETER_FREE.match(qualified)):
            continue
        for target in assign.targets:
            name = _self_attribute(target.target, self_name)
            if name is not None and name not in found:
                found.append(name)
    return found


def _maybe_skipped_layers(analysis, cls: cst.ClassDef, classes: dict[str, cst.ClassDef]) -> list[str]:
    """The layers ``forward`` may run without: unused, used only under a condition or after an early return."""
    methods = _methods(cls)
    if "__init__" not in methods or "forward" not in methods:
        return []
    layers = _layers(analysis, methods["__init__"], classes)
    always = _always_used(analysis, methods, "forward", set())
    return [layer for layer in layers if layer not in always]


def _always_used(analysis, methods: dict[str, cst.FunctionDef], name: str, seen: set[str]) -> set[str]:
    """Attributes of ``self`` that method ``name`` reads on every call (through the methods it always calls)."""
    seen.add(name)
    method = methods[name]
    self_name = _self_name(method)
    tree = analysis.tree
    nodes = contains(method, lambda node: True)
    order = {node: index for index, node in enumerate(nodes)}
    early_returns = [
        order[node] for node in nodes if type(node) is cst.Return and _under_condition(tree, node, method)
    ]
    always: set[str] = set()
    for node in nodes:
        attribute = _self_attribute(node, self_name)
        if attribute is None or _under_condition(tree, node, method) or any(r < order[node] for r in early_returns):
            continue
        always.add(attribute)
        parent = tree.parent(node)
        if type(parent) is cst.Call and parent.func is node and attribute in methods and attribute not in seen:
            always |= _always_used(analysis, methods, attribute, seen)
    return always


def _under_condition(tree, node: cst.CSTNode, method: cst.FunctionDef) -> bool:
    child = node
    for ancestor in tree.ancestors(node):
        if ancestor is method:
            return False
        if isinstance(ancestor, _CONDITIONAL):
            # The test of an `if` (or the first operand of `and`/`or`) always runs.
            first = getattr(ancestor, "test", None) or getattr(ancestor, "left", None)
            if child is not first:
                return True
        child = ancestor
    return False
