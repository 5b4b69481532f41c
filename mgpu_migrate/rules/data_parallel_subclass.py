"""MGP106: a subclass of ``DataParallel`` that only adds conveniences is rebased on the runtime's wrapper."""

from __future__ import annotations

import libcst as cst


from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.subclasses import KEEPS_OUTPUTS, callers_left, from_cst, rebased_in_its_module
from mgpu_migrate.rules.base import BALANCED, DDP, WRAPS, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, runtime_attr

DATA_PARALLEL_SUBCLASS_KEPT = Review(
    "MGP210",
    name="data-parallel-subclass-kept",
    summary="a subclass of DataParallel that overrides machinery the runtime's wrapper does not call; left as it is",
    why=(
        "The subclass overrides part of DataParallel's machinery that the runtime's wrapper does not use (`forward`, "
        "`parallel_apply`, a `scatter` that calls DataParallel's own through `super()`; under `--to ddp` also "
        "`replicate`, since each process holds one model and makes no replicas), or reads DataParallel's private "
        "state (under `--to ddp` also `device_ids` or `output_device`, which DistributedDataParallel holds for its "
        "one GPU); rebased, it would lose what it overrides. (`gather` and a `scatter` of its own are kept on both "
        "targets, `replicate` under `--to balanced`: the runtime's wrapper calls them as DataParallel did.) A "
        "`gather` that only returns the outputs as they are (PyTorch-Encoding's `DataParallelModel`) is left too: "
        "its callers get the runtime's own wrapper instead (MGP104)."
    ),
    todo="Port what the override does by hand, or keep the subclass.",
    veto=True,
)


class DataParallelSubclass(Rule):
    """
    ## What it does
    Rebases a class deriving from ``nn.DataParallel`` on ``mgpu_runtime.DataParallelModel`` for
    ``--to balanced`` (on ``mgpu_runtime.DistributedDataParallel`` for ``--to ddp``), when the class adds
    conveniences (an ``__init__`` that calls ``super()``, attribute forwarding, extra methods) or its own
    ``scatter`` and ``gather`` (a detection project's ``CustomDataParallel``). Its instances then behave like the
    runtime's wrapper: their outputs are the global batch's values, held per device or per process, and a call
    of the class, here or in another module of the project, is a wrap site like ``nn.DataParallel(...)``.

    ## Why is this bad?
    The subclass inherits ``nn.DataParallel``'s gather of every output on the first device.

    ## Example
    ```python
    class MyDataParallel(nn.DataParallel):
        def __getattr__(self, name):
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(self.module, name)
    ```

    ## Use instead
    ```python
    class MyDataParallel(mgpu_runtime.DataParallelModel):
        ...
    ```

    ## Fix safety
    Safe for the classes it rewrites: ``DataParallelModel`` is an ``nn.DataParallel`` with the same
    constructor, so ``super().__init__``, ``.module`` and ``isinstance`` checks hold. Its forward makes the
    replicas through ``self.replicate(module, device_ids)``, as DataParallel's does, so an override of that
    (the Synchronized-BatchNorm packages' ``DataParallelWithCallback``, which then calls each layer's
    ``__data_parallel_replicate__``) keeps working, and it cuts the batch through ``self.scatter(inputs, kwargs,
    device_ids)`` and gathers through ``self.gather(outputs, output_device)`` when a class overrides them (a
    detection project's ``CustomDataParallel``, which places each device's images itself and stacks each device's
    losses): each part runs on its replica, and the outputs are the parts' rows held on the replicas, or what the
    own gather returns. A class that overrides ``forward`` or ``parallel_apply`` (the runtime's wrapper does not
    call them), a ``scatter`` that calls ``super()`` (DataParallel's own, which the wrapper does not use), or reads
    ``nn.DataParallel``'s private state (``src_device_obj``, ``device_type``), is left with MGP210.

    Under ``--to ddp`` the runtime's ``DistributedDataParallel`` calls an own ``scatter`` on every process with the
    global batch and one device id per process, and each process runs its part (part r on rank r, as GPU r ran
    it; a move to another GPU inside it is skipped, one to this rank's GPU goes to the process's device); an own
    ``gather`` is given every part's outputs, gathered from the processes. The loader then gives every process
    the whole batch (MGP122, ``whole_batches=True``). A ``replicate`` override has no place there (no replicas):
    left with MGP210 (a Synchronized-BatchNorm package's ``DataParallelWithCallback`` is migrated at its call
    sites instead, MGP109), and so is a class that reads ``device_ids`` or ``output_device`` (DDP holds its one
    GPU there), or one that a module of the project calls where that module stays as it is (a DataParallel
    program there would run the class as one process on one GPU: MGP210 names the module). A call of the class
    in another module that migrates is a wrap site there, reported as MGP106 at the call.
    """

    CODE = Rewrite("MGP106", helper_body=True)
    PHASE = WRAPS
    USES = ("models",)
    # Under --to ddp a file defining a DataParallel subclass is DataParallel's machinery (a vendored sync-BN's
    # replication callback): its checks for a wrapper guard that machinery, and a DDP model passing them breaks it.
    REVIEW_CODES = (DATA_PARALLEL_SUBCLASS_KEPT,)
    DESCRIPTION = "DataParallel subclass rebased on the runtime's wrapper"
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            class MyDP(nn.DataParallel):
                def __getattr__(self, name):
                    try:
                        return super().__getattr__(name)
                    except AttributeError:
                        return getattr(self.module, name)
            net = MyDP(net, device_ids=[0, 1])
            """,
            """
            import mgpu_runtime
            class MyDP(mgpu_runtime.DataParallelModel):
                def __getattr__(self, name):
                    try:
                        return super().__getattr__(name)
                    except AttributeError:
                        return getattr(self.module, name)
            net = MyDP(net, device_ids=[0, 1])
            """,
            BALANCED,
            ("MGP106",),
        ),
        Example(
            """
            from torch.nn.parallel import DataParallel
            class CallbackDP(DataParallel):
                def replicate(self, module, device_ids):
                    modules = super().replicate(module, device_ids)
                    execute_replication_callbacks(modules)
                    return modules
            """,
            """
            import mgpu_runtime
            class CallbackDP(mgpu_runtime.DataParallelModel):
                def replicate(self, module, device_ids):
                    modules = super().replicate(module, device_ids)
                    execute_replication_callbacks(modules)
                    return modules
            """,
            BALANCED,
            ("MGP106",),
            name="MGP106-replication-callback",
        ),
        Example(
            """
            import torch.nn as nn
            class CustomDataParallel(nn.DataParallel):
                def scatter(self, inputs, kwargs, device_ids):
                    size = inputs[0].shape[0] // len(device_ids)
                    parts = [(inputs[0][size * i : size * (i + 1)].to(f"cuda:{d}"),) for i, d in enumerate(device_ids)]
                    return parts, [kwargs] * len(parts)
            """,
            """
            import mgpu_runtime
            class CustomDataParallel(mgpu_runtime.DataParallelModel):
                def scatter(self, inputs, kwargs, device_ids):
                    size = inputs[0].shape[0] // len(device_ids)
                    parts = [(inputs[0][size * i : size * (i + 1)].to(f"cuda:{d}"),) for i, d in enumerate(device_ids)]
                    return parts, [kwargs] * len(parts)
            """,
            BALANCED,
            ("MGP106",),
            name="MGP106-own-scatter",
        ),
        Example(
            """
            from torch.nn.parallel import DataParallel
            class ScatterDP(DataParallel):
                def scatter(self, inputs, kwargs, device_ids):
                    return super().scatter(inputs, kwargs, device_ids)
            """,
            None,
            BALANCED,
            ("MGP210",),
        ),
        Example(
            """
            import torch.nn as nn
            class MyDP(nn.DataParallel):
                pass
            """,
            """
            import mgpu_runtime
            class MyDP(mgpu_runtime.DistributedDataParallel):
                pass
            """,
            DDP,
            ("MGP106",),
        ),
        Example(
            """
            from torch.nn.parallel import DataParallel
            class CallbackDP(DataParallel):
                def replicate(self, module, device_ids):
                    modules = super().replicate(module, device_ids)
                    execute_replication_callbacks(modules)
                    return modules
            """,
            None,
            DDP,
            ("MGP210",),
            name="MGP210-ddp-replicate",
        ),
        Example(
            """
            import torch.nn as nn
            class ChunkedDataParallel(nn.DataParallel):
                def scatter(self, inputs, kwargs, device_ids):
                    size = inputs[0].shape[0] // len(self.device_ids)
                    parts = [(inputs[0][size * i : size * (i + 1)].to(d),) for i, d in enumerate(device_ids)]
                    return parts, [kwargs] * len(parts)
            """,
            None,
            DDP,
            ("MGP210",),
            message="`ChunkedDataParallel` reads `device_ids`, which mgpu_runtime.DistributedDataParallel holds for its one GPU: not rebased",
            name="MGP210-ddp-device-ids",
        ),
    )


    def apply(self) -> None:
        models = self.analysis.models
        for cls in sorted(models.subclasses, key=lambda node: self.analysis.position(node)):
            for base in cls.bases:
                if self.analysis.resolve(base.value) == names.DATA_PARALLEL:
                    self._rebase(cls, base)
        if self.target != DDP:
            return  # under balanced a rebased class is an nn.DataParallel still: its callers need nothing
        for site in models.sites:
            elsewhere = models.project_subclasses.get(site.call)
            if elsewhere is not None and elsewhere.kept(ddp=True) is None and rebased_in_its_module(self.analysis.path, elsewhere, self.options):
                # The call stays, and is a wrap of the runtime's (decide() counts the calls the wrap rules rewrote).
                self.edits.replace(site.call, lambda call: call)
                self.rewrote(
                    site.call,
                    f"`{elsewhere.name}` ({elsewhere.module}:{elsewhere.line}) is rebased on {RUNTIME}.DistributedDataParallel "
                    "in its module: a wrap site",
                )

    def _rebase(self, cls: cst.ClassDef, base: cst.Arg) -> None:
        wrapper = "DistributedDataParallel" if self.target == DDP else "DataParallelModel"
        kept = from_cst(cls, lambda node: self.analysis.position(node)[0]).kept(ddp=self.target == DDP)
        if kept == KEEPS_OUTPUTS:
            self.left(
                cls,
                DATA_PARALLEL_SUBCLASS_KEPT,
                f"`{cls.name.value}` gathers nothing, as PyTorch-Encoding's DataParallelModel (its callers get "
                f"{RUNTIME}'s wrapper): not rebased",
            )
            return
        if kept is not None:
            # DataParallel's device_ids and output_device name every GPU; DistributedDataParallel's, its process's.
            does = "holds for its one GPU" if kept in ("reads `device_ids`", "reads `output_device`") else "does not use"
            self.left(cls, DATA_PARALLEL_SUBCLASS_KEPT, f"`{cls.name.value}` {kept}, which {RUNTIME}.{wrapper} {does}: not rebased")
            return
        caller = callers_left(self.analysis.path, cls.name.value, self.options) if self.target == DDP else None
        if caller is not None:
            self.left(
                cls,
                DATA_PARALLEL_SUBCLASS_KEPT,
                f"`{cls.name.value}` is used by {caller}, which --to ddp leaves as it is (a DataParallel there): not rebased",
            )
            return
        if not self.rewrite_allowed(cls):
            return
        self.edits.replace(base.value, lambda _: runtime_attr(wrapper))
        self.edits.need_import(RUNTIME)
        self.rewrote(cls, f"`{cls.name.value}` rebased on {RUNTIME}.{wrapper}")
