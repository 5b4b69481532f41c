"""MGP105: the functional ``nn.parallel.data_parallel(module, inputs)`` becomes the runtime's."""

from __future__ import annotations

from mgpu_migrate.analysis import names
from mgpu_migrate.rules.base import BALANCED, DDP, WRAPS, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, runtime_attr


FUNCTIONAL_DATA_PARALLEL_UNDER_DDP = Review(
    "MGP209",
    name="functional-data-parallel-under-ddp",
    summary=(
        "the functional data_parallel has no per-call DistributedDataParallel equivalent; wrap the "
        "module once with mgpu_runtime.DistributedDataParallel and call it"
    ),
    why=(
        "The functional `data_parallel(module, input)` replicates the module on every call; under DDP the "
        "module is wrapped once and each process runs its own copy."
    ),
    todo="Wrap the module once with `mgpu_runtime.DistributedDataParallel` and call the wrapper.",
)


class FunctionalDataParallel(Rule):
    """
    ## What it does
    Replaces the functional ``torch.nn.parallel.data_parallel(module, inputs, device_ids, output_device,
    dim, module_kwargs)`` (every import spelling) with ``mgpu_runtime.data_parallel``, which takes the same
    arguments, for ``--to balanced``. For ``--to ddp`` the call is left with MGP209.

    ## Why is this bad?
    The functional form gathers the whole output on the first device after every call, like
    ``nn.DataParallel``.

    ## Example
    ```python
    out = nn.parallel.data_parallel(net, x, device_ids=[0, 1])
    loss = criterion(out, y)
    ```

    ## Use instead
    ```python
    out = mgpu_runtime.data_parallel(net, x, device_ids=[0, 1])
    loss = criterion(out, y)   # on the output's pieces, no gather
    ```

    ## Fix safety
    Balanced: safe; the same arguments, and the output is the gathered output's value wherever it is used,
    held per device. DDP: each call replicates the module anew over the devices of one process; there is no
    per-call DDP equivalent, so the call is left for a person (wrap the module once with
    ``mgpu_runtime.DistributedDataParallel`` and call it).
    """

    CODE = Rewrite("MGP105")
    PHASE = WRAPS
    REVIEW_CODES = (FUNCTIONAL_DATA_PARALLEL_UNDER_DDP,)
    DESCRIPTION = "functional data_parallel replaced with the runtime's"
    EXAMPLES = (
        Example(
            """
            import torch
            out = torch.nn.parallel.data_parallel(net, x, [0, 1])
            """,
            """
            import mgpu_runtime
            out = mgpu_runtime.data_parallel(net, x, [0, 1])
            """,
            BALANCED,
            ("MGP105",),
        ),
        Example(
            """
            from torch.nn.parallel import data_parallel
            out = data_parallel(net, x, dim=1)
            """,
            """
            import mgpu_runtime
            out = mgpu_runtime.data_parallel(net, x, dim=1)
            """,
            BALANCED,
            ("MGP105",),
        ),
        Example(
            """
            import torch.nn as nn
            out = nn.parallel.data_parallel(net, x)
            """,
            None,
            DDP,
            ("MGP209",),
        ),
        Example(
            """
            def data_parallel(net, x):
                return net(x)
            out = data_parallel(net, x)
            """,
            None,
            BALANCED,
        ),
    )

    def apply(self) -> None:
        for call in self.analysis.calls_to(names.DATA_PARALLEL_FUNCTION):
            if self.target == DDP:
                self.left(
                    call,
                    FUNCTIONAL_DATA_PARALLEL_UNDER_DDP,
                    f"functional data_parallel not rewritten: wrap the module once with {RUNTIME}.DistributedDataParallel",
                )
                continue
            if not self.rewrite_allowed(call):
                continue
            self.edits.replace(call.func, lambda _: runtime_attr("data_parallel"))
            self.edits.need_import(RUNTIME)
            self.rewrote(call, f"data_parallel replaced with {RUNTIME}.data_parallel")
