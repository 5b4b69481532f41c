"""MGP371: a layer that meets its copies across DataParallel's replica threads (queues, barriers) keeps the file off DDP."""

from __future__ import annotations

import ast
import os
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.models import MODULE_METHODS_RETURNING_SELF
from mgpu_migrate.analysis.project import ReplicaLink, project_of, replica_link, text_module
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import BALANCED, DDP, PROGRAM, Example, Review, Rule

THREAD_LINKED = Review(
    "MGP371",
    name="layers-linked-across-replica-threads",
    summary="a layer meets its copies across DataParallel's replica threads (queues, barriers): DDP's processes never meet",
    why=(
        "A layer of the model builds queues, barriers, conditions or events in its `__init__` (CCNet's and the "
        "first inplace_abn's `InPlaceABNSync`: the replica on the first GPU waits on a queue for the others' "
        "statistics). nn.DataParallel runs its replicas in threads of one process, which share those objects, so "
        "the copies meet. Under DDP each process holds one replica with queues of its own: the first would wait "
        "forever for copies that are in other processes (the runtime's `DistributedDataParallel` refuses such a "
        "model at the wrap). `--to ddp` leaves the file as it is."
    ),
    todo=(
        "Use `torch.nn.SyncBatchNorm` (or the layer package's own distributed version, such as inplace_abn's current "
        "`InPlaceABNSync`) in its place, then migrate with `--to ddp`; or migrate with `--to balanced`, whose "
        "replicas run in threads of one process as DataParallel's did, so the layer works as it is."
    ),
    veto=True,
)
# The longest message a diagnostic holds (CONTRIBUTING): a long path to the layer's module is cut to fit.
_MESSAGE_LIMIT = 160


class ThreadLinkedLayers(Rule):
    """
    ## What it does
    Under ``--to ddp``, reads the classes of each wrapped model, in this file and in the project's modules it
    imports (the classes and builder functions the model's construction names, the classes they derive from,
    what their methods build, module-level aliases such as ``BatchNorm2d = partial(InPlaceABNSync, ...)``),
    and reports the wrap when one of them is a layer (an ``nn.Module``) whose ``__init__`` builds a
    ``queue.Queue``, a ``threading.Barrier``, ``Condition``, ``Event`` or ``Semaphore``, or a multiprocessing
    queue or barrier. The file is then left as it is; the diagnostic names the layer and the line.

    ## Why is this bad?
    Such a layer meets its copies while DataParallel's replicas run, in threads of one process that share its
    queues (a synchronized BatchNorm: the first device's replica collects the others' statistics). Under DDP
    there is one replica a process, and its queues are its own: the first process would wait forever for the
    others. ``mgpu_runtime.DistributedDataParallel`` refuses such a model when it wraps it, so the migration
    could never train.

    ## Example
    ```python
    from libs import InPlaceABNSync          # its __init__: self.master_queue = Queue(len(self.worker_ids))
    model = nn.DataParallel(ResNet(norm_layer=InPlaceABNSync))
    ```

    ## Use instead
    ```python
    model = mgpu_runtime.DistributedDataParallel(ResNet(norm_layer=nn.SyncBatchNorm))
    ```
    Or migrate with ``--to balanced``: its replicas run in threads, as DataParallel's, and meet.

    ## Fix safety
    Nothing is rewritten, in the whole file: which synchronized layer replaces the project's is the author's to
    decide.
    """

    CODE = THREAD_LINKED
    PHASE = PROGRAM
    USES = ("models", "values")
    REVIEW_CODES = (THREAD_LINKED,)
    DESCRIPTION = "a layer meeting its copies across DataParallel's replica threads keeps the file off DDP"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import queue

            import torch.nn as nn


            class QueueSyncedNorm(nn.BatchNorm1d):
                def __init__(self, features, devices):
                    super().__init__(features)
                    self.master_queue = queue.Queue(len(devices) - 1)
                    self.worker_queues = [queue.Queue(1) for _ in devices[1:]]


            model = nn.Sequential(nn.Linear(6, 8), QueueSyncedNorm(8, [0, 1]))
            model = nn.DataParallel(model)
            """,
            None,
            DDP,
            (THREAD_LINKED,),
            message="`QueueSyncedNorm` meets its copies in DataParallel's threads (`Queue`, line 9): use nn.SyncBatchNorm",
            line=14,
        ),
        Example(
            """
            import functools
            import threading

            import torch.nn as nn


            class BarrierNorm(nn.Module):
                def __init__(self, replicas):
                    super().__init__()
                    self.barrier = threading.Barrier(replicas)


            Norm = functools.partial(BarrierNorm, 2)


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.norm = Norm()


            model = nn.DataParallel(Net().cuda())
            """,
            None,
            DDP,
            (THREAD_LINKED,),
            message="`BarrierNorm` meets its copies in DataParallel's threads (`Barrier`, line 10)",
            line=22,
            name="through-an-alias-in-the-model-class",
        ),
        Example(
            """
            import threading

            import torch.nn as nn


            class Prefetcher:
                def __init__(self):
                    self.ready = threading.Event()


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lock = threading.Lock()
                    self.prefetcher = Prefetcher()


            model = nn.DataParallel(Net())
            """,
            """
            import threading

            import torch.nn as nn
            import mgpu_runtime


            class Prefetcher:
                def __init__(self):
                    self.ready = threading.Event()


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lock = threading.Lock()
                    self.prefetcher = Prefetcher()


            model = mgpu_runtime.DistributedDataParallel(Net())
            """,
            DDP,
            ("MGP101",),
            name="no-layer-meets-its-copies",
        ),
        Example(
            """
            import queue

            import torch.nn as nn


            class QueueSyncedNorm(nn.BatchNorm1d):
                def __init__(self, features):
                    super().__init__(features)
                    self.master_queue = queue.Queue(1)


            model = nn.DataParallel(nn.Sequential(nn.Linear(6, 8), QueueSyncedNorm(8)))
            """,
            """
            import queue

            import torch.nn as nn
            import mgpu_runtime


            class QueueSyncedNorm(nn.BatchNorm1d):
                def __init__(self, features):
                    super().__init__(features)
                    self.master_queue = queue.Queue(1)


            model = mgpu_runtime.DataParallelModel(nn.Sequential(nn.Linear(6, 8), QueueSyncedNorm(8)))
            """,
            BALANCED,
            ("MGP101",),
            name="balanced-runs-the-replicas-in-threads",
        ),
    )

    def apply(self) -> None:
        if not self.program.migrates:
            return
        analysis = self.analysis
        module = text_module(analysis.path, analysis.source)
        if module is None:
            return
        project = project_of(analysis.path)
        seen_from = os.path.dirname(os.path.abspath(analysis.path))
        values = analysis.values
        for call in self.program.wraps:
            site = analysis.models.site_of(call)
            wrapped = site.module if site is not None else None
            if wrapped is None:
                continue
            link = None
            for value in values.of(wrapped, values.scope_of(call)):
                link = self._link(module, _constructed(value), project, seen_from)
                if link is not None:
                    break
            if link is None:
                continue
            layer = link.layer
            where = (
                f"line {link.line}"
                if os.path.abspath(layer.module.path) == os.path.abspath(analysis.path)
                else f"{os.path.relpath(layer.module.path, seen_from)}:{link.line}"
            )
            said = (
                f"`{shorten(layer.name, 24)}` meets its copies in DataParallel's threads (`{link.primitive.rpartition('.')[2]}`, "
                "{where}): use nn.SyncBatchNorm or --to balanced; file left as it is"
            )
            room = _MESSAGE_LIMIT - len(said) + len("{where}")
            self.left(call, THREAD_LINKED, said.replace("{where}", shorten(where, max(room, 16))))

    def _link(self, module, value: cst.BaseExpression, project, seen_from: str) -> Optional[ReplicaLink]:
        """The thread-linked layer the construction ``value`` builds, read with Python's parser."""
        try:
            expression = ast.parse(self.analysis.code_of(value).strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        return replica_link(module, expression, project, seen_from)


def _constructed(value: cst.BaseExpression) -> cst.BaseExpression:
    """``Net(...)`` in ``Net(...).cuda()`` and ``Net(...).to(device)``."""
    while type(value) is cst.Call and type(value.func) is cst.Attribute and value.func.attr.value in MODULE_METHODS_RETURNING_SELF:
        value = value.func.value
    return value
