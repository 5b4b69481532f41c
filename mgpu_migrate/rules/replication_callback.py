"""MGP109 and MGP266: the Synchronized-BatchNorm package's replication callbacks under DDP (``--to ddp``)."""

from __future__ import annotations

import functools
import os
from typing import Optional, Union

import libcst as cst

from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.project import project_of
from mgpu_migrate.analysis.tree import reads_names_only
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import keyword, with_keyword

# The file is left as it is when this is reported (rules.settle).
REPLICATION_CALLBACK = Review(
    "MGP266",
    name="replication-callback",
    summary="synchronized BatchNorm called back by DataParallel's replicate: DDP never calls it",
    why=(
        "The file uses replication callbacks (`patch_replication_callback`, `DataParallelWithCallback`, "
        "`__data_parallel_replicate__`): they synchronise BatchNorm statistics across the replicas DataParallel "
        "makes. DDP makes no replicas, so the callback would never run (BatchNorm per process) or fail an assertion "
        "at start-up. The runtime links the Synchronized-BatchNorm package's layers over the processes instead "
        "(MGP109), for `patch_replication_callback(model)` on a wrapped model and for the package's "
        "`DataParallelWithCallback`; this site is another shape (a `DataParallelWithCallback` not read as the package's, layers that meet their copies another way, a patch of a model not wrapped "
        "here, `--style torch`). The file is left as it is."
    ),
    todo=(
        "Use `--to balanced` (its replicate calls `__data_parallel_replicate__`), or replace the package's "
        "BatchNorm with `nn.BatchNorm2d` and migrate with `--to ddp --sync-bn`."
    ),
    veto=True,
)
_PATCH = "patch_replication_callback"
_CALLBACK_NAMES = frozenset({"DataParallelWithCallback"})
_CALLBACK_METHOD = "__data_parallel_replicate__"


# The examples' layer: the Synchronized-BatchNorm package's protocol, written in the file (the package cannot be read).
_LAYER = """
            import torch.nn as nn


            class SyncBN(nn.BatchNorm1d):
                def __data_parallel_replicate__(self, ctx, copy_id):
                    self._is_parallel, self._parallel_id = True, copy_id
                    if copy_id == 0:
                        ctx.sync_master = self._sync_master
                    else:
                        self._slave_pipe = ctx.sync_master.register_slave(copy_id)

                def _compute_mean_std(self, sum_, ssum, size):
                    return sum_ / size, ssum / size

"""
_LAYER_LINKED = _LAYER.replace("import torch.nn as nn\n", "import torch.nn as nn\n            import mgpu_runtime\n", 1)


class ReplicationCallback(Rule):
    """
    ## What it does
    Under ``--to ddp``, ``patch_replication_callback(model)`` on a model this file wraps in DataParallel (the
    Synchronized-BatchNorm package, vendored as ``sync_batchnorm/`` by many segmentation projects) goes, and the
    wrap gets ``replication_callbacks=True``: the runtime links the package's layers over the processes at each
    forward, as the callbacks linked DataParallel's replicas. So does the package's own ``DataParallelWithCallback(
    model, device_ids=...)`` (the tool reads the project's class: a DataParallel whose only method, ``replicate``,
    calls ``execute_replication_callbacks``), which becomes the runtime's DDP (MGP101) with
    ``replication_callbacks=True``. Any other replication callback (a class the tool does not read as the
    package's, a layer that meets its copies some other way, a patch of a model not wrapped here) is reported
    (MGP266) and the file left as it is.

    ## Why is this bad?
    Those layers synchronise their statistics across the replicas of one ``nn.DataParallel`` forward, which
    calls them back when it replicates the model: they normalise over the whole batch. Under DDP there are no
    replicas: ``patch_replication_callback`` fails its ``isinstance(model, DataParallel)`` assertion at start-up,
    and the layers, never called back, would normalise over each process's rows only.

    ## Example
    ```python
    model = nn.DataParallel(model)
    patch_replication_callback(model)
    ```

    ## Use instead
    ```python
    model = mgpu_runtime.DistributedDataParallel(model, replication_callbacks=True)
    ```
    A patch under a flag right after the wrap (``if use_sync_bn: patch_replication_callback(model)``) links under
    that flag (``replication_callbacks=use_sync_bn``), and the ``if`` goes. A patch under any other condition than
    its wrap's is left (MGP266): linking at the wrap would link when the original did not patch.

    ## Fix safety
    Exact for the package's layers (a master copy, pipes to it, ``_compute_mean_std``): each process's layer sums
    its statistics with the others' (one collective per layer and forward, whose backward sums the gradients of
    the statistics), and computes them with the layer's own ``_compute_mean_std`` on a replica of the layer, as
    DataParallel's first replica did. The tool reads the layers' classes (in this file, or in the package that
    defines ``patch_replication_callback``) and rewrites only when every one of them follows that protocol; the
    runtime checks them again at the wrap, and refuses one it does not know, before any process waits.
    """

    CODE = Rewrite("MGP109")
    PHASE = PROGRAM
    USES = ("bindings", "models", "values")
    REVIEW_CODES = (REPLICATION_CALLBACK,)
    DESCRIPTION = "the Synchronized-BatchNorm package's replication callbacks linked over the processes by the runtime"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            from sync_batchnorm import patch_replication_callback

            model = nn.DataParallel(model)
            patch_replication_callback(model)
            """,
            None,
            DDP,
            ("MGP266",),
            message="calls back layers not known to follow the Synchronized-BatchNorm package's protocol",
            name="text that is no file: the package's layers cannot be read",
        ),
        Example(
            _LAYER + """

            model = nn.DataParallel(model)
            patch_replication_callback(model)
            for x in loader:
                model(x).sum().backward()
            """,
            _LAYER_LINKED + """

            model = mgpu_runtime.DistributedDataParallel(model, replication_callbacks=True)
            for x in loader:
                model(x).sum().backward()
            """,
            DDP,
            ("MGP101", "MGP109"),
            name="layers-of-this-file-linked",
        ),
        Example(
            _LAYER + """

            model = nn.DataParallel(model)
            if use_sync_bn:
                patch_replication_callback(model)
            for x in loader:
                model(x).sum().backward()
            """,
            _LAYER_LINKED + """

            model = mgpu_runtime.DistributedDataParallel(model, replication_callbacks=use_sync_bn)
            for x in loader:
                model(x).sum().backward()
            """,
            DDP,
            ("MGP101", "MGP109"),
            message="links the layers over the processes (replication_callbacks=use_sync_bn)",
            name="a-patch-under-a-flag-right-after-the-wrap-links-under-the-flag",
        ),
        Example(
            _LAYER + """

            model = nn.DataParallel(model)
            model.cuda()
            if use_sync_bn:
                patch_replication_callback(model)
            for x in loader:
                model(x).sum().backward()
            """,
            None,
            DDP,
            ("MGP266",),
            message="is under a condition its wrap is not under",
            name="a-patch-under-a-flag-further-on-is-left",
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model)
            patched = DataParallelWithCallback(net)
            """,
            None,
            DDP,
            ("MGP266",),
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        left: list[tuple[cst.CSTNode, str]] = []
        patches: list[tuple[cst.Call, cst.SimpleStatementLine, list[cst.Call], cst.BaseExpression | None]] = []
        callbacks: list[cst.Call] = []
        for call in self.analysis.calls:
            name = _last_name(call.func)
            if name == _PATCH:
                found = self._patch(call)
                if isinstance(found, str):
                    left.append((call, f"`{name}(...)` {found}"))
                elif found is not None:
                    patches.append(found)
            elif name in _CALLBACK_NAMES:
                why = self._callback_wrap(call)
                if why is None:
                    callbacks.append(call)
                else:
                    left.append((call, f"`{name}(...)` {why}"))
        for layer in self._layer_classes():
            if not ((patches or callbacks) and _follows_protocol(self.analysis.code_of(layer))):
                method = next(s for s in layer.body.body if type(s) is cst.FunctionDef and s.name.value == _CALLBACK_METHOD)
                left.append((method.name, f"`{_CALLBACK_METHOD}` synchronises BatchNorm across DataParallel's replicas, which DDP never makes"))
        if left:
            for node, what in left:
                self.left(node, REPLICATION_CALLBACK, f"{what}: file left as it is")
            return
        for call, statement, wraps, condition in patches:
            if not self.rewrite_allowed(call):
                continue
            self.edits.replace(statement, lambda _: cst.RemovalSentinel.REMOVE)
            value = cst.Name("True") if condition is None else condition.with_changes(lpar=[], rpar=[])
            for wrap in wraps:
                if keyword(wrap, "replication_callbacks") is None:
                    self.edits.replace(wrap, functools.partial(_linking, value=value))
            line = self.analysis.position(wraps[0])[0]
            told = "True" if condition is None else shorten(self.analysis.code_of(condition), 24)
            self.rewrote(
                call,
                f"`{_PATCH}(...)` dropped: the wrap at line {line} links the layers over the processes "
                f"(replication_callbacks={told})",
            )
        for call in callbacks:
            if not self.rewrite_allowed(call):
                continue
            if keyword(call, "replication_callbacks") is None:
                self.edits.replace(call, _linking)
            self.rewrote(call, "the layers DataParallelWithCallback called back are linked over the processes (replication_callbacks=True)")

    def _callback_wrap(self, call: cst.Call) -> Optional[str]:
        """Why a call of ``DataParallelWithCallback`` cannot have its layers linked over the processes; None when
        it can: it is the Synchronized-BatchNorm package's class, made the runtime's DDP (MGP101), and the layers of
        that package follow its protocol."""
        if self.options.style != RUNTIME_STYLE:
            return "synchronises BatchNorm across DataParallel's replicas, which --style torch cannot link"
        if self.analysis.resolve(call.func) != names.CALLBACK_DATA_PARALLEL or call not in self.program.wraps:
            return "synchronises BatchNorm across DataParallel's replicas, which DDP never makes"
        if not self._layers_follow_protocol(call):
            return "calls back layers not known to follow the Synchronized-BatchNorm package's protocol"
        return None

    def _layer_classes(self) -> list[cst.ClassDef]:
        """The classes of this file that define ``__data_parallel_replicate__`` (the layers called back)."""
        return [
            node
            for node in self.analysis.tree.nodes(cst.ClassDef)
            if any(type(s) is cst.FunctionDef and s.name.value == _CALLBACK_METHOD for s in node.body.body)
        ]

    def _patch(
        self, call: cst.Call
    ) -> Optional[Union[str, tuple[cst.Call, cst.SimpleStatementLine, list[cst.Call], cst.BaseExpression | None]]]:
        """``(call, its statement, the wraps it patches)`` when the patch can go; else why not."""
        if self.options.style != RUNTIME_STYLE:
            return "synchronises BatchNorm across DataParallel's replicas, which --style torch cannot link"
        expression = self.analysis.tree.parent(call)
        statement = self.analysis.tree.parent(expression) if expression is not None else None
        if type(expression) is not cst.Expr or type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1:
            return "is not a statement of its own"
        if len(call.args) != 1 or call.args[0].keyword is not None:
            return "patches what the tool cannot follow"
        sites = self.analysis.models.model_sites(call.args[0].value, self.analysis.values.scope_of(call))
        wraps = sorted((site.call for site in sites if site.call in self.program.wraps), key=self.analysis.position)
        if not wraps:
            return "patches a model not wrapped in DataParallel in this file"
        if not self._layers_follow_protocol(call):
            return "calls back layers not known to follow the Synchronized-BatchNorm package's protocol"
        found = [self._condition(statement, wrap) for wrap in wraps]
        if any(not followed for followed, _ in found) or len({id(condition) for _, condition in found}) != 1:
            return "is under a condition its wrap is not under (or not right after it)"
        return call, statement, wraps, found[0][1]

    def _condition(self, statement: cst.SimpleStatementLine, wrap: cst.Call) -> tuple[bool, cst.BaseExpression | None]:
        """Whether ``statement`` (the patch) runs when the wrap ``wrap`` does, and under what: always (None, in the
        wrap's block), or under the plain condition of an ``if`` that holds the patch alone and comes right after
        the wrap (``if use_sync_bn: patch_replication_callback(model)``: the condition, read at the wrap as it would
        be read there)."""
        tree = self.analysis.tree
        wrap_statement = tree.statement(wrap)
        block = tree.parent(statement)
        wrap_block = tree.parent(wrap_statement) if wrap_statement is not None else None
        if block is wrap_block:
            return True, None
        branch = tree.parent(block) if type(block) is cst.IndentedBlock else None
        if type(block) is not cst.IndentedBlock or type(branch) is not cst.If or len(block.body) != 1:
            return False, None
        if branch.orelse is not None or not reads_names_only(branch.test):
            return False, None
        siblings = list(getattr(wrap_block, "body", ()))
        if tree.parent(branch) is not wrap_block or branch not in siblings or wrap_statement not in siblings:
            return False, None
        return siblings.index(branch) == siblings.index(wrap_statement) + 1, branch.test

    def _layers_follow_protocol(self, call: cst.Call) -> bool:
        """The layers the callbacks reach follow the package's protocol: every class of this file that defines
        ``__data_parallel_replicate__`` does, or, with none here, every module of the package that defines
        ``patch_replication_callback`` and mentions that method."""
        own = self._layer_classes()
        if own:
            return all(_follows_protocol(self.analysis.code_of(node)) for node in own)
        project = project_of(self.analysis.path)
        qualified = _imported_as(self.analysis.bindings, call.func)
        found = project.find(qualified) if project is not None and qualified else None
        if found is None:
            return False
        package = os.path.dirname(found.module.path)
        texts = []
        for name in sorted(os.listdir(package)):
            if name.endswith(".py"):
                with open(os.path.join(package, name), encoding="utf-8", errors="replace") as handle:
                    texts.append(handle.read())
        linked = [text for text in texts if _CALLBACK_METHOD in text and "def " + _CALLBACK_METHOD in text]
        return bool(linked) and all(_follows_protocol(text) for text in linked)


def _linking(wrap: cst.CSTNode, value: cst.BaseExpression | None = None) -> cst.CSTNode:
    assert type(wrap) is cst.Call
    return with_keyword(wrap, "replication_callbacks", value if value is not None else cst.Name("True"))


def _follows_protocol(text: str) -> bool:
    """Whether a layer's (or a module's) source holds the Synchronized-BatchNorm package's protocol: a pipe to the
    master copy and ``_compute_mean_std``, which the runtime's link calls."""
    return all(part in text for part in ("_slave_pipe", "_sync_master", "def _compute_mean_std", "_is_parallel", "_parallel_id"))


def _imported_as(bindings: names.Bindings, func: cst.BaseExpression) -> str | None:
    """The qualified name a callee is imported as, before any canonical spelling (the project's own module)."""
    head = names.head_name(func)
    base = bindings.qualified_name(head) if head is not None else None
    if base is None:
        return None
    rest: list[str] = []
    while type(func) is cst.Attribute:
        rest.insert(0, func.attr.value)
        func = func.value
    return ".".join([base, *rest])


def _last_name(func: cst.BaseExpression) -> str | None:
    if type(func) is cst.Name:
        return func.value
    if type(func) is cst.Attribute:
        return func.attr.value
    return None
