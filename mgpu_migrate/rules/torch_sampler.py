"""MGP162: ``--style torch``: a training DataLoader reads its process's share through a ``DistributedSampler``."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.loaders import LoaderTrace
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, TORCH_STYLE, Example, Rewrite
from mgpu_migrate.rules.syntax import argument, has_star_args, parse, with_keyword
from mgpu_migrate.rules.torch_style import (
    DATA_ORDER,
    GLOBAL_BATCH,
    NO_TORCH_FORM,
    TORCH_OPTIONS,
    statement,
)
from mgpu_migrate.rules.training_data import TrainingData

# DataLoader(dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, ...)
_SAMPLING = {"sampler": 3, "batch_sampler": 4}
# A per-process batch size that needs no parentheses before `// dist.get_world_size()`.
_ATOMS = (cst.Name, cst.Attribute, cst.Integer, cst.Call, cst.Subscript)


def _is_false(node: Optional[cst.Arg]) -> bool:
    return node is None or (type(node.value) is cst.Name and node.value.value == "False")


class TorchTrainingData(TrainingData):
    """
    ## What it does
    Under ``--to ddp --style torch``, rebuilds each ``DataLoader`` that feeds a training loop (the loaders the
    default style hands to ``mgpu_runtime.distribute_loader``) the textbook way: a
    ``torch.utils.data.DistributedSampler`` over its dataset takes the loader's ``shuffle``, the loader's
    ``batch_size`` becomes the per-process share of the original global batch
    (``batch_size // dist.get_world_size()``), and a shuffled sampler gets ``sampler.set_epoch(epoch)`` at the
    top of the epoch loop around the training loop.

    ## Why is this bad?
    Under DDP each process must train on its own part of the data, or every process computes the same
    gradient; with the original batch size in every process the global batch would grow with the number of
    processes.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    for epoch in range(10):
        for x, y in loader:
            ...
    ```

    ## Use instead
    ```python
    sampler = torch.utils.data.DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=32 // dist.get_world_size(), sampler=sampler)
    for epoch in range(10):
        sampler.set_epoch(epoch)
        for x, y in loader:
            ...
    ```

    ## Fix safety
    Not exact in general, and each difference is reported where it arises: a shuffled sampler draws its own
    order (MGP298); the global batch equals the original's only when the batch size divides by the number of
    processes, and an epoch only when the dataset's length does (``DistributedSampler`` repeats samples to
    even the shares: MGP299). Without shuffling, with both sizes divisible and a mean loss, each step sees the
    original batch and the training matches the original's. A loader it cannot rebuild (no batch size, its
    own sampler, one shared with evaluation, an epoch loop it cannot find for ``set_epoch``) leaves the file
    whole (MGP296).
    """

    CODE = Rewrite("MGP162", accounts_for_data=True)
    STYLES = (TORCH_STYLE,)
    REVIEW_CODES = (DATA_ORDER, GLOBAL_BATCH)
    DESCRIPTION = "training DataLoader given a DistributedSampler and the per-process batch size (--style torch)"
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            from torch.utils.data import DataLoader

            train_loader = DataLoader(data, batch_size=32, shuffle=True)
            model = nn.DataParallel(model)
            for epoch in range(3):
                for x in train_loader:
                    model(x).mean().backward()
            """,
            """
            from torch.utils.data import DataLoader
            import torch
            import torch.distributed as dist

            train_sampler = torch.utils.data.DistributedSampler(data, shuffle=True)
            train_loader = DataLoader(data, batch_size=32 // dist.get_world_size(), sampler=train_sampler)
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None)
            for epoch in range(3):
                train_sampler.set_epoch(epoch)
                for x in train_loader:
                    model(x).mean().backward()
            """,
            DDP,
            ("MGP160", "MGP162", "MGP298", "MGP299"),
            TORCH_OPTIONS,
        ),
        Example(
            """
            import torch.nn as nn
            from torch.utils.data import DataLoader

            loader = DataLoader(data, shuffle=True)
            model = nn.DataParallel(model)
            for x in loader:
                model(x).mean().backward()
            """,
            None,
            DDP,
            ("MGP296",),
            TORCH_OPTIONS,
        ),
    )

    def _distribute(self, point: cst.BaseExpression, origin: cst.Call, trace: LoaderTrace) -> None:
        reason = self._no_textbook_form(point, origin)
        if reason is not None:
            self.left(origin, NO_TORCH_FORM, f"{reason}: no DistributedSampler form; file left (the default style splits it)")
            return
        tree = self.analysis.tree
        assign = tree.statement(origin)
        loader_name = assign.body[0].targets[0].target.value
        sampler = f"{loader_name[:-len('loader')]}sampler" if loader_name.endswith("loader") else f"{loader_name}_sampler"
        dataset = argument(origin, "dataset", 0).value
        batch = argument(origin, "batch_size", 1)
        shuffle = argument(origin, "shuffle", 2)
        epoch_loop = None if _is_false(shuffle) else self._epoch_loop(trace, assign)
        if not _is_false(shuffle) and epoch_loop is None:
            self.left(origin, NO_TORCH_FORM, "shuffled, but no `for epoch in range(...)` around its training loop for set_epoch; file left")
            return
        if sampler in self.analysis.bindings.local or sampler in self.analysis.bindings.imported:
            self.left(origin, NO_TORCH_FORM, f"the name `{sampler}` for its sampler is taken; file left")
            return
        code = self.analysis.code_of
        shuffle_code = "False" if shuffle is None else code(shuffle.value)
        new = statement(f"{sampler} = torch.utils.data.DistributedSampler({code(dataset)}, shuffle={shuffle_code})\n")
        self.edits.insert_before(assign, new.with_changes(leading_lines=assign.leading_lines))
        self.edits.replace(assign, lambda updated: updated.with_changes(leading_lines=()))
        size = code(batch.value) if isinstance(batch.value, _ATOMS) else f"({code(batch.value)})"

        # A dataset built in the call (`TensorDataset(x, y)`) is built once, for the sampler; the loader reads it there.
        shared = dataset if type(dataset) in (cst.Name, cst.Attribute) else None
        dataset_arg = argument(origin, "dataset", 0)

        def rebuilt(updated: cst.Call) -> cst.Call:
            args = []
            for index, arg in enumerate(updated.args):
                if shared is None and arg is _find(updated, dataset_arg, index, origin):
                    arg = arg.with_changes(value=parse(f"{sampler}.dataset"))
                if arg is _find(updated, shuffle, index, origin):
                    continue
                if arg is _find(updated, batch, index, origin):
                    arg = arg.with_changes(value=parse(f"{size} // dist.get_world_size()"))
                args.append(arg)
            if args and isinstance(updated.args[-1].comma, cst.MaybeSentinel):
                args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return with_keyword(updated.with_changes(args=args), "sampler", cst.Name(sampler))

        self.edits.replace(origin, rebuilt)
        for module in ("torch", "torch.distributed as dist"):
            self.edits.need_import(module)
        if epoch_loop is not None:
            target = code(epoch_loop.target)
            first = epoch_loop.body.body[0]
            self.edits.insert_before(first, statement(f"{sampler}.set_epoch({target})\n"))
        self.rewrote(origin, f"`{loader_name}` reads this process's share through `{sampler}`, {shorten(code(batch.value), 20)} // world size rows a step")
        if not _is_false(shuffle):
            self.left(origin, DATA_ORDER, "DistributedSampler shuffles with its own generator (seed 0 + epoch): not the original's data order")
        self.left(
            origin,
            GLOBAL_BATCH,
            f"the global batch is {shorten(code(batch.value), 20)} and an epoch the original's only if it and len(dataset) divide by the "
            "world size (else padding repeats)",
        )

    def _no_textbook_form(self, point: cst.BaseExpression, origin: cst.Call) -> Optional[str]:
        statement_ = self.analysis.tree.statement(origin)
        single_name = (
            type(statement_) is cst.SimpleStatementLine
            and len(statement_.body) == 1
            and type(statement_.body[0]) is cst.Assign
            and len(statement_.body[0].targets) == 1
            and type(statement_.body[0].targets[0].target) is cst.Name
            and statement_.body[0].value is origin
        )
        if point is not origin or not single_name:
            return "this loader is not a plain `name = DataLoader(...)` feeding training only"
        if has_star_args(origin) or argument(origin, "dataset", 0) is None:
            return "the loader's arguments are passed with * or ** or without a dataset"
        if argument(origin, "batch_size", 1) is None:
            return "no batch_size (1 a step cannot be split)"
        if any(argument(origin, name, position) is not None for name, position in _SAMPLING.items()):
            return "the loader has a sampler of its own"
        if self._iterable_dataset(origin) is not None:
            return "an iterable dataset"
        return None

    def _epoch_loop(self, trace: LoaderTrace, assign: cst.CSTNode) -> Optional[cst.For]:
        """The ``for epoch in range(...)`` around the training loop, in the loader's scope and after it."""
        tree = self.analysis.tree
        for node in tree.ancestors(trace.loop):
            if type(node) is not cst.For:
                continue
            is_range = type(node.iter) is cst.Call and type(node.iter.func) is cst.Name and node.iter.func.value == "range"
            inside = any(ancestor is node for ancestor in tree.ancestors(assign))
            if (
                is_range
                and type(node.target) is cst.Name
                and not inside
                and tree.function(node) is tree.function(assign)
                and type(node.body) is cst.IndentedBlock
            ):
                return node
            return None
        return None


def _find(updated: cst.Call, original: Optional[cst.Arg], index: int, origin: cst.Call) -> Optional[cst.Arg]:
    """The argument of the rebuilt call at ``index`` when it stands where ``original`` stood in ``origin``."""
    if original is None:
        return None
    position = next(i for i, arg in enumerate(origin.args) if arg is original)
    return updated.args[index] if index == position else None
