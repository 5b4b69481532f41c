"""MGP340: a model whose ``forward`` returns a dict of scalar losses never ran under DataParallel on several GPUs."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.models import MODULE_METHODS_RETURNING_SELF, TORCH, WrapSite
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.rules.base import BALANCED, DDP, WRAPS, Example, Review, Rule

LOSSES_FROM_FORWARD = Review(
    "MGP340",
    name="scalar-losses-from-forward",
    summary=(
        "forward returns a dict of scalar losses that the loop never averages: under DataParallel on several GPUs "
        "the original cannot train"
    ),
    why=(
        "The wrapped model's `forward` returns a dict of scalar losses (torchvision's detection models do), and the "
        "loop adds them up and calls `backward()` without taking their mean. DataParallel on several GPUs gathers "
        "each scalar into a vector of the devices' losses, and `backward()` of a vector fails (so does `.item()`): "
        "the original only ever trained on one device, so there is no training on several devices to keep. "
        "`--to ddp` leaves the file as it is; `--to balanced` keeps the wrap, which fails on several devices as "
        "DataParallel did."
    ),
    todo=(
        "Average the gathered losses where the loop reads them, as scripts written for DataParallel do "
        "(`loss_dict = {name: loss.mean() for name, loss in model(images, targets).items()}`), then migrate: the "
        "migration trains as that script does on W GPUs."
    ),
    veto=True,
)


class ForwardLosses(Rule):
    """
    ## What it does
    Reports a DataParallel wrap of a model whose class (defined in this file) returns from ``forward`` a dict
    literal of losses, keyed by names holding ``loss`` (``{"loss_classifier": ..., "loss_box_reg": ...}``),
    when nothing in the file takes the ``mean()`` of what the model returns. ``--to ddp`` then leaves the file
    as it is.

    ## Why is this bad?
    DataParallel runs ``forward`` on every GPU and gathers the outputs: a 0-dim loss becomes a vector of the
    devices' losses. ``sum(loss_dict.values())`` is then a vector too, and ``backward()`` refuses it: the
    original cannot train on several GPUs, so it only ever trained on one. Its migration would train
    something no run of the original trained (a sum of the processes' losses under DDP), with no error.

    ## Example
    ```python
    class Detector(nn.Module):
        def forward(self, images, targets):
            ...
            return {"loss_classifier": loss_classifier, "loss_box_reg": loss_box_reg}

    loss_dict = model(images, targets)            # model = nn.DataParallel(Detector())
    losses = sum(loss for loss in loss_dict.values())
    losses.backward()
    ```

    ## Use instead
    ```python
    loss_dict = {name: loss.mean() for name, loss in model(images, targets).items()}
    ```

    ## Fix safety
    Nothing is rewritten: which mean the script should take (of the devices' losses, or weighted by their
    rows) is the author's to decide.
    """

    CODE = LOSSES_FROM_FORWARD
    PHASE = WRAPS
    USES = ("models", "values")
    REVIEW_CODES = (LOSSES_FROM_FORWARD,)
    DESCRIPTION = "a model whose forward returns a dict of scalar losses, never averaged: the original ran on one device"
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn

            class Detector(nn.Module):
                def forward(self, images, labels):
                    return {"loss_classifier": self.cls(images, labels), "loss_box_reg": self.box(images, labels)}

            model = nn.DataParallel(Detector())
            for images, labels in loader:
                losses = sum(loss for loss in model(images, labels).values())
                losses.backward()
            """,
            None,
            DDP,
            (LOSSES_FROM_FORWARD,),
            message="`Detector.forward` returns a dict of scalar losses (line 5)",
            line=7,
        ),
        Example(
            """
            import torch.nn as nn

            class Detector(nn.Module):
                def forward(self, images, labels):
                    return {"loss_classifier": self.cls(images, labels), "loss_box_reg": self.box(images, labels)}

            model = Detector().cuda()
            model = nn.DataParallel(model)
            for images, labels in loader:
                loss_dict = model(images, labels)
                losses = sum(loss.mean() for loss in loss_dict.values())
                losses.backward()
            """,
            """
            import torch.nn as nn
            import mgpu_runtime

            class Detector(nn.Module):
                def forward(self, images, labels):
                    return {"loss_classifier": self.cls(images, labels), "loss_box_reg": self.box(images, labels)}

            model = Detector().cuda()
            model = mgpu_runtime.DataParallelModel(model)
            for images, labels in loader:
                loss_dict = model(images, labels)
                losses = sum(loss.mean() for loss in loss_dict.values())
                losses.backward()
            """,
            BALANCED,
            ("MGP101",),
            name="losses-averaged-where-the-loop-reads-them",
        ),
    )

    def apply(self) -> None:
        classes = {node.name.value: node for node in self.analysis.module.body if type(node) is cst.ClassDef}
        if not classes:
            return
        for site in self.analysis.models.sites:
            cls = self._module_class(site, classes) if site.kind == TORCH else None
            if cls is None:
                continue
            returned = _returned_losses(self.analysis, cls)
            if returned is None or self._averaged(site):
                continue
            line = self.analysis.position(returned)[0]
            left = "; file left" if self.target == DDP else ""
            self.left(
                site.call,
                LOSSES_FROM_FORWARD,
                f"`{cls.name.value}.forward` returns a dict of scalar losses (line {line}): on several GPUs backward() "
                f"refuses their gathered vectors; the original ran on one{left}",
            )

    def _module_class(self, site: WrapSite, classes: dict[str, cst.ClassDef]) -> cst.ClassDef | None:
        """The class of this file the wrapped module is an instance of (``Detector()``, ``model`` bound to one)."""
        module = site.module
        values = self.analysis.values
        candidates = values.of(module, values.scope_of(site.call)) if type(module) is cst.Name else [module]
        for value in candidates:
            while type(value) is cst.Call and type(value.func) is cst.Attribute and value.func.attr.value in MODULE_METHODS_RETURNING_SELF:
                value = value.func.value  # `Detector().cuda()`
            if type(value) is cst.Call and type(value.func) is cst.Name and value.func.value in classes:
                return classes[value.func.value]
        return None

    def _averaged(self, site: WrapSite) -> bool:
        """Whether the file takes the ``mean()`` of something computed from the model's outputs, also of each
        value a comprehension draws from them (``{name: loss.mean() for name, loss in losses.items()}``)."""
        values, models = self.analysis.values, self.analysis.models
        for call in self.analysis.calls:
            if type(call.func) is not cst.Attribute or call.func.attr.value != "mean":
                continue
            scope, receiver = values.scope_of(call), call.func.value
            averaged = [receiver]
            if type(receiver) is cst.Name:
                averaged += _drawn_from(self.analysis.tree.ancestors(call), receiver.value)
            if any(site in models.derived_sites(value, scope) for value in averaged):
                return True
        return False


_COMPREHENSIONS = (cst.GeneratorExp, cst.ListComp, cst.SetComp, cst.DictComp)


def _drawn_from(ancestors, name: str) -> list[cst.BaseExpression]:
    """What the comprehensions around a node iterate to bind ``name``."""
    found = []
    for node in ancestors:
        loop = node.for_in if type(node) in _COMPREHENSIONS else None
        while loop is not None:
            if contains(loop.target, lambda n: type(n) is cst.Name and n.value == name):
                found.append(loop.iter)
            loop = loop.inner_for_in
    return found


def _returned_losses(analysis, cls: cst.ClassDef) -> cst.Dict | None:
    """The dict literal of losses that the class's ``forward`` returns (its keys name losses), if it returns one."""
    forward = next(
        (node for node in cls.body.body if type(node) is cst.FunctionDef and node.name.value == "forward"), None
    )
    if forward is None:
        return None
    for node in contains(forward.body, lambda n: type(n) is cst.Return):
        value = node.value
        if analysis.tree.function(node) is forward and type(value) is cst.Dict and value.elements and all(
            type(element) is cst.DictElement
            and type(element.key) is cst.SimpleString
            and "loss" in element.key.evaluated_value.lower()
            for element in value.elements
        ):
            return value
    return None
