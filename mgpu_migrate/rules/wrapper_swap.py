"""MGP101: replace the ``DataParallel`` wrapper with the runtime's wrapper for the target.

With its ``--style torch`` twin, ``TorchWrapperSwap`` (MGP160): the wrapper becomes torch's own
``DistributedDataParallel``.
"""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.tree import is_zero
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import BALANCED, DDP, RUNTIME_STYLE, TORCH_STYLE, WRAPS, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, keep_arguments, parse, runtime_attr, with_keyword
from mgpu_migrate.rules.torch_style import TORCH_OPTIONS

# nn.DataParallel(module, device_ids=None, output_device=None, dim=0): positions of each parameter.
_PARAMETERS = ("module", "device_ids", "output_device", "dim")
# Arguments with no meaning under DistributedDataParallel: each process owns exactly one device.
_DROPPED_UNDER_DDP = {"device_ids", "output_device"}


def _parameter_name(args: list[cst.Arg], index: int) -> str | None:
    arg = args[index]
    if arg.keyword is not None:
        return arg.keyword.value
    if arg.star:
        return None
    return _PARAMETERS[index] if index < len(_PARAMETERS) else None


# The last names of the spellings of torch's DataParallel (class and function), and the import that binds each
# leftmost name the way the tool reads it.
_DATA_PARALLEL_NAMES = frozenset({"DataParallel", "data_parallel"})
_EXPLICIT_IMPORTS = {
    "nn": "import torch.nn as nn",
    "torch": "import torch",
    "DataParallel": "from torch.nn import DataParallel",
    "data_parallel": "from torch.nn.parallel import data_parallel",
}


DIM_NOT_ZERO = Review(
    "MGP201",
    name="dim-not-zero",
    summary="DataParallel with dim != 0 has no DistributedDataParallel equivalent",
    why=(
        "`DistributedDataParallel` splits the data by giving each process its own batches; it has no `dim` to "
        "scatter one batch along. A `dim != 0` wrap means the batch is not along the first dimension."
    ),
    todo=(
        "Keep DataParallel for this model, or make the batch dimension the first one and drop `dim`. With one "
        "device per process `dim` does not matter to the model; what matters is that each process gets its rows "
        "of every batch, and `distribute_loader` cuts the first dimension. For a sequence-first model "
        "(`nn.GRU(...)` without `batch_first`, batches `(time, batch, ...)`) the exact manual migration is: let "
        "the loader yield batch-first tensors (drop the `collate_fn` that stacks along dim 1, or stack along "
        "dim 0), wrap it in `mgpu_runtime.distribute_loader(...)`, wrap the model in "
        "`mgpu_runtime.DistributedDataParallel(model)` without `dim`, and turn each batch sequence-first in the "
        "loop (`source, target = source.transpose(0, 1), target.transpose(0, 1)`). Each rank then holds the "
        "columns DataParallel's GPU of that index held, and every value the loop computes from them (a token-mean "
        "loss) is the global batch's. Splitting a whole batch by hand (`source.chunk(world_size(), dim=1)[rank()]`) "
        "gives each process a piece the runtime does not know: what the loop computes from it is the process's own."
    ),
    kept_when_left=True,
)
AMBIGUOUS_DATA_PARALLEL_NAME = Review(
    "MGP202",
    name="ambiguous-data-parallel-name",
    summary="the name is bound both to torch's DataParallel and to something else in this file",
    why=(
        "The same name is bound to torch's DataParallel and to something else in this file (a second import, "
        "an assignment, a function of the same name), so the call may not be torch's."
    ),
    todo="Bind the name once (`from torch.nn import DataParallel` and nothing else under that name).",
    kept_when_left=True,
)
STARRED_WRAP_ARGUMENTS = Review(
    "MGP214",
    name="starred-wrap-arguments",
    summary="DataParallel arguments passed with * or **: device_ids, output_device or dim may be among them",
    why=(
        "Arguments passed with `*` or `**` may hold `device_ids`, `output_device` or `dim`, which mean nothing, "
        "or something else, under DistributedDataParallel."
    ),
    todo="Pass the arguments by name, then run the tool again.",
    kept_when_left=True,
)
PARTIAL_MODEL_WRAP = Review(
    "MGP250",
    name="partial-model-wrap",
    summary="--style torch: only part of a model is wrapped, or its parts each on their own",
    why=(
        "Under `--style torch`, a wrap of part of a model (`model.features = DataParallel(model.features)`, or "
        "MuZero's networks each in a DataParallel): torch's DistributedDataParallel would average that part's "
        "gradients only, and each process would train its own copy of the rest. The wrap stays DataParallel, so "
        "the file is not made a distributed program. (The default style migrates it: the runtime runs the rest "
        "on the gathered output and sums its gradients at each optimizer step.)"
    ),
    todo="Migrate it with the default style, or wrap the whole model, once, where it is trained.",
    kept_when_left=True,
)
WRAP_OF_NON_MODEL = Review(
    "MGP252",
    name="wrap-of-non-model",
    summary="DataParallel wraps something that is not a model (an optimizer, a scheduler, a tensor, a literal)",
    why=(
        "DataParallel wraps something that is not a model (an optimizer, a scheduler, a tensor, a literal): it "
        "parallelizes nothing, and the runtime's wrappers would fail on it. Its `.module` still gives the "
        "wrapped object, and it does not keep the file from being migrated."
    ),
    todo="Drop the wrap (and the `.module` that unwraps it) when you next touch the code.",
    kept_when_left=True,
)
STAR_IMPORT_WRAP = Review(
    "MGP253",
    name="star-import-wrap",
    summary="a DataParallel-like name may come from a star import; what it is cannot be told",
    why=(
        "A DataParallel-like name is bound nowhere in this file but may come from a `from module import *`: "
        "what it is cannot be told without importing that module."
    ),
    todo="Import the name explicitly (e.g. `import torch.nn as nn`), then run the tool again.",
    kept_when_left=True,
)
WRAPPER_DROPPED_AGAIN = Review(
    "MGP255",
    name="wrapper-dropped-again",
    summary=(
        "the wrapper is taken off again (`model = model.module`): it only loads a checkpoint, the bare model trains"
    ),
    why=(
        "The wrapper is taken off again (`model = model.module`) before training: it only serves to load a "
        "checkpoint saved from a wrapped model, and the bare model trains. A DDP wrapper dropped that way would "
        "leave the processes training unsynchronized copies, so the file is left as it is."
    ),
    todo="Load the checkpoint into the bare model (strip the `module.` prefix), then wrap the model that trains.",
    kept_when_left=True,
)


class WrapperSwap(Rule):
    """
    ## What it does
    Replaces ``nn.DataParallel(model, ...)`` (every import spelling and alias: ``torch.nn.DataParallel``,
    ``torch.nn.parallel.DataParallel``, ``from torch.nn import DataParallel as DP`` ...) with the runtime's
    wrapper: ``mgpu_runtime.DataParallelModel`` for ``--to balanced``, ``mgpu_runtime.DistributedDataParallel``
    for ``--to ddp``.

    ## Why is this bad?
    ``nn.DataParallel`` gathers every output on the first device, which runs out of memory first, and
    replays the whole module to every device on every step.

    ## Example
    ```python
    model = nn.DataParallel(model, device_ids=[0, 1])
    ```

    ## Use instead
    ```python
    model = mgpu_runtime.DataParallelModel(model, device_ids=[0, 1])   # --to balanced
    model = mgpu_runtime.DistributedDataParallel(model)                # --to ddp
    ```

    ## Fix safety
    Balanced: always safe; the wrapper takes the same arguments and its outputs are the gathered output's
    values, held on each device, so the loop (its losses, counts, ``if n_gpu > 1: loss = loss.mean()``) stays
    as it is. DDP: ``device_ids`` and ``output_device`` are dropped (each process owns one device); a
    ``dim`` other than 0 has no DDP equivalent, so such a site is left with MGP201. A wrap of part of a model
    (``model.features = DataParallel(model.features)``, pytorch/examples' ImageNet idiom) is migrated, as
    DataParallel ran it: the part's forward on each process's rows, the rest of the model once on the
    gathered values (on every process alike, as it ran on the first GPU), and the rest's gradients summed over
    the processes at each optimizer step (the runtime's contract); so are several parts of one model each
    wrapped on their own (MuZero's networks, unrolled several times a step). ``--style torch`` leaves them
    (MGP250).

    A ``DataParallel`` that wraps something certainly not a model (an optimizer, a learning-rate scheduler, a
    tensor, a literal, or a name this file binds only to one) parallelizes nothing and the runtime's wrappers
    would fail on it: it is left as it is with MGP252, and is no wrap site for the other rules (under
    ``--to ddp`` it does not keep the file from becoming a distributed program; each process holds it as the
    original process did). A call such as ``nn.DataParallel(model)`` whose ``nn`` is bound nowhere in the
    file but may come from a ``from module import *`` is left with MGP253: what it is cannot be told without
    importing that module.
    """

    CODE = Rewrite("MGP101")
    PHASE = WRAPS
    USES = ("loaders", "models")
    STYLES = (RUNTIME_STYLE,)
    # Whether a wrap of one part of a model is left (PARTIAL_MODEL_WRAP): torch's DDP alone would not sum the
    # rest's gradients; the runtime does.
    LEAVES_PARTS = False
    REVIEW_CODES = (
        DIM_NOT_ZERO,
        AMBIGUOUS_DATA_PARALLEL_NAME,
        STARRED_WRAP_ARGUMENTS,
        PARTIAL_MODEL_WRAP,
        WRAP_OF_NON_MODEL,
        STAR_IMPORT_WRAP,
        WRAPPER_DROPPED_AGAIN,
    )
    DESCRIPTION = "DataParallel wrapper replaced with the runtime's wrapper"
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model, device_ids=[0, 1])
            """,
            """
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model, device_ids=[0, 1])
            """,
            BALANCED,
            ("MGP101",),
        ),
        Example(
            """
            from torch.nn import DataParallel as DP
            net = DP(net, [0, 1], 0)
            """,
            """
            import mgpu_runtime
            net = mgpu_runtime.DistributedDataParallel(net)
            """,
            DDP,
            ("MGP101",),
        ),
        Example(
            """
            import torch
            model = torch.nn.DataParallel(model, dim=1)
            """,
            None,
            DDP,
            ("MGP201",),
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model, **options)
            """,
            None,
            DDP,
            ("MGP214",),
        ),
        Example(
            """
            from torch.nn import *
            model = DataParallel(model)
            """,
            """
            from torch.nn import *
            import mgpu_runtime
            model = mgpu_runtime.DataParallelModel(model)
            """,
            BALANCED,
            ("MGP101",),
        ),
        Example(
            """
            import torch
            import torch.nn as nn
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            optimizer = nn.DataParallel(optimizer)
            optimizer.module.step()
            """,
            None,
            DDP,
            ("MGP252",),
        ),
        Example(
            """
            from mytools import *
            model = nn.DataParallel(model)
            """,
            None,
            BALANCED,
            ("MGP253",),
        ),
        Example(
            """
            class DataParallel:
                pass
            model = DataParallel(model)
            """,
            None,
            BALANCED,
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)  # noqa: MGP101
            """,
            None,
            DDP,
        ),
    )

    def apply(self) -> None:
        self._parts: dict[cst.Call, str] = {}
        """The migrated wraps of one part of a model (``model.features``), by call: what they wrap."""
        not_modules = self.analysis.models.not_modules
        calls = list(self.analysis.calls_to(names.DATA_PARALLEL))
        if self.target == DDP and self.options.style == RUNTIME_STYLE:
            # The Synchronized-BatchNorm package's DataParallelWithCallback: its layers are linked over the
            # processes (replication_callbacks=True, MGP109). Under balanced its class is rebased (MGP106).
            calls += self.analysis.calls_to(names.CALLBACK_DATA_PARALLEL)
        for call in calls:
            if not self.rewrite_allowed(call):
                continue
            if call in not_modules:
                self.left(
                    call,
                    WRAP_OF_NON_MODEL,
                    f"DataParallel wraps {not_modules[call]}, not a model: nothing to parallelize; left as it is",
                )
                continue
            if self.target == BALANCED:
                self.edits.replace(call.func, lambda _: runtime_attr("DataParallelModel"))
            elif not self._swap_for_ddp(call):
                continue
            self._announce(call)
        for call in self.analysis.ambiguous_calls(names.DATA_PARALLEL):
            self.left(call, AMBIGUOUS_DATA_PARALLEL_NAME, "this name is bound to torch's DataParallel and to something else; not rewritten")
        for call, sources in self.analysis.unknown_star_calls(_DATA_PARALLEL_NAMES):
            head = names.head_name(call.func)
            explicit = _EXPLICIT_IMPORTS.get(head, f"an import of `{head}`")
            self.left(
                call,
                STAR_IMPORT_WRAP,
                f"`{shorten(self.analysis.code_of(call.func))}` may come from "
                f"`{shorten(', '.join(sources))}`: not rewritten (add `{explicit}` to migrate it)",
            )

    def _unwrapped_later(self, site) -> cst.Assign | None:
        """``model = DataParallel(model); model.load_state_dict(...); model = model.module``: the assignment
        that takes the wrapper off again, in the same function."""
        tree = self.analysis.tree
        function = tree.function(site.call)
        unwrapping = [
            assign
            for assign in tree.nodes(cst.Assign)
            if type(assign.value) is cst.Attribute and assign.value.attr.value == "module"
        ]
        for target, _ in self.analysis.models.assigned_to(site) if unwrapping else ():
            if type(target) is not cst.Name:
                continue
            for assign in unwrapping:
                unwrapped = assign.value.value
                if (
                    tree.function(assign) is function
                    and type(unwrapped) is cst.Name
                    and unwrapped.value == target.value
                    and any(type(t.target) is cst.Name and t.target.value == target.value for t in assign.targets)
                    and not self._trains_between(site.call, assign)
                ):
                    return assign
        return None

    def _trains_between(self, start: cst.CSTNode, end: cst.CSTNode) -> bool:
        """Whether a backward pass or a training loop lies between two nodes (taken off after training, the
        wrapper did train)."""
        first, last = self.analysis.position(start)[0], self.analysis.position(end)[0]
        loaders = self.analysis.loaders
        trainers = [*loaders.training_loops, *(call for call in self.analysis.calls if loaders.is_backward(call))]
        return any(first <= self.analysis.position(node)[0] <= last for node in trainers)

    def _announce(self, call: cst.Call) -> None:
        self.edits.need_import(RUNTIME)
        wrapper = "DataParallelModel" if self.target == BALANCED else "DistributedDataParallel"
        replaced = "DataParallelWithCallback" if self.analysis.resolve(call.func) == names.CALLBACK_DATA_PARALLEL else "DataParallel"
        part = self._parts.get(call)
        said = f" (`{shorten(part)}` only: the rest of the model takes its gathered output, as on GPU 0)" if part else ""
        self.rewrote(call, f"{replaced} replaced with {RUNTIME}.{wrapper}{said}")

    def _ddp_wrapper(self, call: cst.Call, args: list[cst.Arg]) -> cst.Call:
        """The DDP wrap that replaces ``call`` (the DataParallel call, its kept ``args``)."""
        return call.with_changes(func=runtime_attr("DistributedDataParallel"), args=args)

    def _dim_message(self, call: cst.Call, dim: cst.BaseExpression) -> str:
        """MGP201's message: a literal dim is not 0; a name (CenterNet's wrapper function passing on its ``dim``
        parameter, 0 by default) may or may not be."""
        if type(dim) in (cst.Integer, cst.UnaryOperation):
            return "DataParallel with dim != 0 has no DistributedDataParallel equivalent; not rewritten"
        function = self.analysis.tree.function(call)
        params = function.params.params if function is not None else ()
        default = next((param.default for param in params if param.name.value == self.analysis.code_of(dim)), None)
        given = f"a parameter of `{function.name.value}()`" if function is not None and default is not None else "not known here"
        zero = " (0 by default)" if default is not None and is_zero(default) else ""
        return (
            f"DataParallel's dim is `{shorten(self.analysis.code_of(dim), 24)}`, {given}{zero}: DDP has no dim to scatter "
            "along, so not rewritten; pass no dim if it is always 0"
        )

    def _swap_for_ddp(self, call: cst.Call) -> bool:
        site = self.analysis.models.site_of(call)
        part = self.analysis.models.is_submodule(site) if site is not None else None
        if part is not None:
            if self.LEAVES_PARTS:
                alone = self.analysis.models.parts_wrapped_alone(site)
                said = (
                    f"only part of a model is wrapped (`{shorten(part)}`)"
                    if not alone
                    else f"each part of `{shorten(alone[0])}` is wrapped alone ({alone[1]} networks, nothing else in it)"
                    if alone[2]
                    else f"{alone[1]} parts of `{shorten(alone[0])}` are each wrapped on their own"
                )
                self.left(call, PARTIAL_MODEL_WRAP, f"{said}: left as DataParallel, and so is the file")
                return False
            self._parts[call] = part
        unwrapped = self._unwrapped_later(site) if site is not None else None
        if unwrapped is not None:
            self.left(
                call,
                WRAPPER_DROPPED_AGAIN,
                f"the wrapper is dropped again at line {self.analysis.position(unwrapped)[0]} (`.module`) and the bare "
                "model trains: left as it is, and so is the file",
            )
            return False
        args = list(call.args)
        if any(arg.star for arg in args):
            self.left(
                call,
                STARRED_WRAP_ARGUMENTS,
                "DataParallel arguments passed with * or **: device_ids or dim may be among them; not rewritten",
            )
            return False
        kept = []
        for index, arg in enumerate(args):
            parameter = _parameter_name(args, index)
            if parameter in _DROPPED_UNDER_DDP:
                continue
            if parameter == "dim":
                if not is_zero(arg.value):
                    self.left(call, DIM_NOT_ZERO, self._dim_message(call, arg.value))
                    return False
                continue
            kept.append(index)

        def swap(updated: cst.Call) -> cst.Call:
            return self._ddp_wrapper(updated, keep_arguments(updated, kept))

        self.edits.replace(call, swap)
        return True


# The process's own GPU once the set-up bound it (`torch.cuda.set_device`), whatever scope the wrap is in.
_DEVICE_IDS = "[torch.cuda.current_device()] if torch.cuda.is_available() else None"


class TorchWrapperSwap(WrapperSwap):
    """
    ## What it does
    Under ``--to ddp --style torch``, replaces ``nn.DataParallel(model, ...)`` with
    ``torch.nn.parallel.DistributedDataParallel(model, device_ids=...)``: the process's own GPU on CUDA
    (the one the set-up bound with ``torch.cuda.set_device(local_rank)``), none on CPU. The sites the default
    style leaves (``dim != 0``, part of a model, ``*args`` ...) are left the same way.

    ## Why is this bad?
    ``nn.DataParallel`` gathers every output on the first device and replays the module to every device on
    every step; one process per GPU with torch's ``DistributedDataParallel`` does neither, and needs no
    dependency beyond PyTorch.

    ## Example
    ```python
    model = nn.DataParallel(model, device_ids=[0, 1])
    ```

    ## Use instead
    ```python
    model = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None
    )
    ```

    ## Fix safety
    The wrap is the textbook one: gradients are averaged over the processes, which equals the original
    gradient only for a mean loss over the rows of equal shares of each batch (see MGP297, MGP299). What the
    model computes inside its ``forward`` (BatchNorm statistics, dropout masks, a loss over its rows) is each
    process's own, as it was each GPU's under DataParallel. ``device_ids`` and
    ``output_device`` of the original are dropped: each process owns one device. The model must be on that
    device before the wrap, as DataParallel needed it on the first one (``.cuda()`` goes there once the
    set-up ran).
    """

    CODE = Rewrite("MGP160")
    STYLES = (TORCH_STYLE,)
    TARGETS = (DDP,)
    REVIEW_CODES = ()
    LEAVES_PARTS = True
    DESCRIPTION = "DataParallel wrapper replaced with torch's DistributedDataParallel (--style torch)"
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model, device_ids=[0, 1])
            """,
            """
            import torch
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None)
            """,
            DDP,
            ("MGP160",),
            TORCH_OPTIONS,
        ),
    )

    def _announce(self, call: cst.Call) -> None:
        self.edits.need_import("torch")
        self.rewrote(call, "torch's DistributedDataParallel: gradients averaged over processes, the original's for a mean over rows only")

    def _ddp_wrapper(self, call: cst.Call, args: list[cst.Arg]) -> cst.Call:
        wrapped = call.with_changes(func=parse("torch.nn.parallel.DistributedDataParallel"), args=args)
        return with_keyword(wrapped, "device_ids", parse(_DEVICE_IDS))
