"""MGP105: the functional ``nn.parallel.data_parallel(module, inputs)`` becomes the runtime's."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis import names
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import BALANCED, DDP, RUNTIME_STYLE, WRAPS, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, runtime_attr


FUNCTIONAL_DATA_PARALLEL_UNDER_DDP = Review(
    "MGP209",
    name="functional-data-parallel-under-ddp",
    summary=(
        "the functional data_parallel chooses its GPUs or splits along another dimension: not split over the "
        "processes; wrap the module once with mgpu_runtime.DistributedDataParallel and call it"
    ),
    why=(
        "Under --to ddp the runtime's `data_parallel` runs DataParallel's forward over the processes, one device "
        "each, splitting the batch along dimension 0 over all of them. A call that chooses its `device_ids` or "
        "`output_device`, or splits along another dimension (`dim=1`, a sequence-first RNN), is not that."
    ),
    todo=(
        "Wrap the module once with `mgpu_runtime.DistributedDataParallel` and call the wrapper (choose the GPUs "
        "with `mgpu_runtime.setup(devices=...)`), or migrate with --to balanced."
    ),
)


class FunctionalDataParallel(Rule):
    """
    ## What it does
    Replaces the functional ``torch.nn.parallel.data_parallel(module, inputs, device_ids, output_device,
    dim, module_kwargs)`` (every import spelling) with ``mgpu_runtime.data_parallel``, which takes the same
    arguments. For ``--to ddp`` the call is the file's wrap (the program is set up, its training loaders split
    and its writes made once) when it splits along dimension 0 over every visible GPU (no ``device_ids``,
    ``output_device`` or ``dim`` other than their defaults); any other call is left with MGP209, and so is every
    call under ``--style torch``, whose DDP has no per-call form.

    ## Why is this bad?
    The functional form gathers the whole output on the first device after every call, like
    ``nn.DataParallel``; under ``--to ddp`` it would run the whole batch in every process.

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
    held per device. DDP: the runtime's ``data_parallel``, inside the job ``mgpu_runtime.setup()`` made, is
    DataParallel's forward over the processes: each process runs its chunk of the batch through the module (its
    BatchNorm statistics, its dropout stream), the loop gets the gathered output's values, and the module's
    gradients are summed over the processes by a ``DistributedDataParallel`` the job keeps for the module. The
    module itself stays unwrapped: called directly (an evaluation, ``model.generate``) it runs as it is.
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
            """
            import mgpu_runtime
            out = mgpu_runtime.data_parallel(net, x)
            """,
            DDP,
            ("MGP105",),
            message="DataParallel's forward over the processes",
            line=2,
        ),
        Example(
            """
            from torch.nn.parallel import data_parallel
            out = data_parallel(net, (x, m), None, None, 0, module_kwargs={"train": True})
            """,
            """
            import mgpu_runtime
            out = mgpu_runtime.data_parallel(net, (x, m), None, None, 0, module_kwargs={"train": True})
            """,
            DDP,
            ("MGP105",),
            name="MGP105-ddp-defaults-spelled-out",
        ),
        Example(
            """
            import torch.nn as nn
            out = nn.parallel.data_parallel(rnn, x, dim=1)
            """,
            None,
            DDP,
            ("MGP209",),
            message="`dim=1` chooses the GPUs or dimension",
            line=2,
        ),
        Example(
            """
            import torch.nn as nn
            out = nn.parallel.data_parallel(net, x, [0, 1])
            """,
            None,
            DDP,
            ("MGP209",),
            message="`[0, 1]` chooses the GPUs or dimension",
            line=2,
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
                self._over_processes(call)
                continue
            if not self.rewrite_allowed(call):
                continue
            self.edits.replace(call.func, lambda _: runtime_attr("data_parallel"))
            self.edits.need_import(RUNTIME)
            self.rewrote(call, f"data_parallel replaced with {RUNTIME}.data_parallel")

    def _over_processes(self, call: cst.Call) -> None:
        """``--to ddp``: the runtime's form, which runs DataParallel's forward over the ranks, where the call splits
        the batch along dimension 0 over every visible GPU; else left with the argument that keeps it."""
        if self.options.style != RUNTIME_STYLE:
            self.left(
                call,
                FUNCTIONAL_DATA_PARALLEL_UNDER_DDP,
                "functional data_parallel not rewritten: torch's DDP has no per-call form; wrap the module once with "
                "torch.nn.parallel.DistributedDataParallel",
            )
            return
        kept = _chosen(call)
        if kept is not None:
            self.left(
                call,
                FUNCTIONAL_DATA_PARALLEL_UNDER_DDP,
                f"data_parallel not rewritten: `{shorten(_spelled(self.analysis.code_of, kept), 30)}` "
                f"{'may choose' if kept.star else 'chooses'} the GPUs or dimension; wrap the module once in "
                f"{RUNTIME}.DistributedDataParallel",
            )
            return
        if not self.rewrite_allowed(call):
            return
        # The call itself is the edit's node: the program's verdict counts it as the file's wrap.
        self.edits.replace(call, lambda node: node.with_changes(func=runtime_attr("data_parallel")))
        self.edits.need_import(RUNTIME)
        self.rewrote(call, f"data_parallel replaced with {RUNTIME}.data_parallel: DataParallel's forward over the processes")


# data_parallel(module, inputs, device_ids, output_device, dim, module_kwargs): the positions of the arguments
# that must keep their defaults for the call to be DataParallel over every visible GPU along dimension 0.
_DEFAULTED = {"device_ids": 2, "output_device": 3, "dim": 4}


def _spelled(code_of, arg: cst.Arg) -> str:
    """An argument as written, without the comma after it: ``dim=1``, ``*kargs``, ``[0, 1]``."""
    keyword = f"{arg.keyword.value}=" if arg.keyword is not None else ""
    return f"{arg.star}{keyword}{code_of(arg.value)}"


def _chosen(call: cst.Call) -> cst.Arg | None:
    """The argument that makes ``call`` other than DataParallel over every GPU along dimension 0 (``dim=1``, chosen
    ``device_ids``, a ``*args``), None when there is none."""
    positional = 0
    for arg in call.args:
        if arg.star:
            return arg
        if arg.keyword is None:
            position, positional = positional, positional + 1
            name = next((key for key, at in _DEFAULTED.items() if at == position), None)
        else:
            name = arg.keyword.value if arg.keyword.value in _DEFAULTED else None
        if name is None:
            continue
        value = arg.value
        default = type(value) is cst.Integer and value.value == "0" if name == "dim" else type(value) is cst.Name and value.value == "None"
        if not default:
            return arg
    return None
