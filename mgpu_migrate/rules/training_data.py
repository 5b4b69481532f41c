"""MGP122: the loaders that feed training go through ``mgpu_runtime.distribute_loader`` (``--to ddp``).

With its ``--style torch`` twin, ``TorchTrainingData`` (MGP162): a training loader reads its process's share
through a ``DistributedSampler``.
"""

from __future__ import annotations

import os
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.rebased import rebased_machinery
from mgpu_migrate.analysis.batch import is_row_count
from mgpu_migrate.analysis.draws import applied_draw, builder_draw, drawing_transform, per_sample_draw
from mgpu_migrate.analysis.held import stored_by_a_base
from mgpu_migrate.analysis.loaders import BUILT, LOADER, LoaderTrace
from mgpu_migrate.analysis.project import NOT_BOUND, project_of
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, TORCH_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.counting import GLOBAL_COUNT, sample_counters
from mgpu_migrate.rules.syntax import RUNTIME, argument, has_star_args, parse, runtime_call, with_keyword
from mgpu_migrate.rules.torch_style import DATA_ORDER, GLOBAL_BATCH, NO_TORCH_FORM, TORCH_OPTIONS, statement

# torch's own samplers draw from the generator the runtime keeps in step; others may not.
_TORCH_SAMPLERS = {
    f"torch.utils.data{module}.{name}"
    for module in ("", ".sampler")
    for name in ("RandomSampler", "SequentialSampler", "SubsetRandomSampler", "WeightedRandomSampler", "BatchSampler")
}
_DISTRIBUTED_SAMPLERS = {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}
_ITERABLE_DATASETS = {"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"}
# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)
_SAMPLER_POSITIONS = {"sampler": 3, "batch_sampler": 4}
# Where a builder of augmentations is no project's: the libraries' own are known by their classes' names
# (``analysis.draws.drawing_transform``).
_LIBRARIES = ("torch", "torchvision", "albumentations", "numpy", "builtins", "kornia", "imgaug", "monai")
# What leaving a training loop's data whole means, in the messages that say so.
# How many calls deep a loss handed to a function of this file is followed back.
_ARGUMENT_DEPTH = 3


def _is_name(node: cst.BaseExpression, name: str) -> bool:
    return type(node) is cst.Name and node.value == name


EVALUATION_LOADER_WHOLE = Review(
    "MGP234",
    name="evaluation-loader-whole",
    summary="an evaluation loader left whole: every process evaluates all of it",
    why=(
        "An evaluation loader is left whole: every process evaluates all of it, so the metrics are the "
        "original's, without a speed-up."
    ),
    todo=(
        "To split it, pass it through `mgpu_runtime.distribute_loader(...)`: the metrics the loop computes from its "
        "batches and outputs are still the whole batch's, as for training data."
    ),
)
TRAINING_DATA_NOT_FOLLOWED = Review(
    "MGP235",
    name="training-data-not-followed",
    summary="training data the tool cannot follow to a DataLoader, or cannot tell is trained on: not split",
    why=(
        "The tool cannot follow this training loop's data to a DataLoader, or cannot tell whether the loop "
        "trains, so the data is not split: every process loads each whole batch. With the runtime the wrapped "
        "model still runs each process's chunk of it, as DataParallel ran each GPU's, so the training is the "
        "original's as long as every process draws the same batches (the runtime keeps their generators in step, "
        "and stops the first step when the batches differ); only the loading is repeated on every process. "
        "Under `--style torch` every process trains on the whole batch, which DDP's average makes the original's "
        "only for a mean loss over batches drawn alike."
    ),
    todo="Pass the loader through `mgpu_runtime.distribute_loader(...)` where it is built, to load each batch once.",
    whole_under_the_runtime=True,
)
SUMMED_LOSS = Review(
    "MGP236",
    name="summed-loss",
    summary="--style torch: a loss summed by hand, which DDP's gradient average cannot weight: that loop's data is not split",
    why=(
        "Under `--style torch` DDP averages the processes' gradients, which is the original's gradient only for a "
        "mean over rows with equal shares. The loss is summed by hand, so this loop's data is not split (each "
        "process trains on whole batches, as for MGP235)."
    ),
    todo="Use a mean and migrate again, or use the default style, whose runtime computes the sum over the global batch.",
    accounts_for_data=True,
)
CUSTOM_SAMPLER = Review(
    "MGP237",
    name="custom-sampler",
    summary="a custom sampler: it runs on the main process only and each of its batches is split",
    why="`distribute_loader` runs a custom sampler on the main process only and splits each batch it makes.",
    todo="If the sampler already splits the data across processes (like `DistributedSampler`), drop that part.",
)
ITERABLE_DATASET = Review(
    "MGP238",
    name="iterable-dataset",
    summary="an iterable dataset: the main process reads every batch and sends each process its rows",
    why=(
        "With an iterable dataset the main process reads every batch and sends each process its rows: correct, "
        "but the loading is not divided among the processes."
    ),
    todo="Nothing, unless loading is the bottleneck: then shard the dataset by `mgpu_runtime.rank()` yourself.",
)


class TrainingData(Rule):
    """
    ## What it does
    Wraps each ``DataLoader`` that feeds a training loop (the innermost ``for`` loop around
    ``.backward()``, directly or through this file's functions) in ``mgpu_runtime.distribute_loader(...)``,
    at the point closest to its construction that feeds training only. A function that trains only when a
    parameter says so (``def run_epoch(loader, train)`` with ``if train: loss.backward()``) trains on the
    loaders of the calls whose literal says so (``run_epoch(train_loader, True)``). Evaluation loaders are
    left whole. A loader this file hands to a training loop of the project's code in another module
    (``trainer.train(epoch, train_loader, optimizer)``: ``analysis/handed.py``) is distributed here too, at
    its ``DataLoader(...)``, or at the result of a builder out of sight (``get_train_dataloader(p, dataset)``),
    which that loop draws its batches from. A loader that a function of another module builds and returns
    (WaveRNN's ``train_set, test_set = get_vocoder_datasets(...)``, read there: ``analysis/loaders.py``) is
    distributed where this file reads its result, in whole batches when what it runs for each batch (its
    ``collate_fn``, its dataset's class, a transform of its module such as ``RandomResizedCrop``) draws random
    numbers. A dict of loaders such a function returns (pytorch_classifiers' ``dataloaders, sizes, names =
    generate_data(...)``, each entry a ``DataLoader``), handed to a loop of another module that reads
    ``dataloaders[phase]``, is split loader by loader where it is handed over
    (``mgpu_runtime.distribute_loaders(dataloaders)``).

    ## Why is this bad?
    Under DDP each process should load only its part of every batch, or every process loads the whole batch
    for the one chunk its model runs. ``distribute_loader`` gives each process its slice of each of the
    original's global batches, in the original order and with the original sampler's randomness, while the
    loop sees the global batch (its ``len``, ``shape`` and every value computed from it are the original's), so
    the run trains on exactly the original batches. Each process loads only its rows of each batch, unless the
    file builds transforms that draw per sample (``RandomCrop``, ``ColorJitter``, albumentations), or calls a
    project builder of augmentations or transforms whose objects draw (pytorch-semseg's
    ``get_composed_augmentations(cfg)``, composing classes that draw from Python's ``random``): then the
    call is ``distribute_loader(..., whole_batches=True)``, and every process loads the whole batch, so that its
    random draws are the original's numbers (the original loaded the whole batch in its one process too).

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
    ```

    ## Use instead
    ```python
    loader = mgpu_runtime.distribute_loader(DataLoader(dataset, batch_size=32, shuffle=True))
    ```

    ## Fix safety
    Safe whatever the loss (a mean, a sum, a loss computed inside the model): the loop's values are the global
    batch's. Data the analysis cannot follow to a ``DataLoader`` is left whole (MGP235), and so is data that
    reaches a loop training only for some callers (``if train: loss.backward()``) through a call whose
    ``train`` the tool cannot read. Data left whole gives every process whole batches, of which the wrapped
    model runs each process's chunk: still the original's training when every process draws the same batches
    (the runtime keeps their generators in step and stops the first optimizer step when the batches differ),
    only the loading is repeated. Loops that only count (``for epoch in range(epochs)``) are not data loops. An
    evaluation loader is left whole (MGP234): every process evaluates all of it, so metrics are the original's.
    A custom sampler (MGP237) or an iterable dataset (MGP238) is distributed, with a note on what to check.
    """

    CODE = Rewrite("MGP122", accounts_for_data=True)
    PHASE = PROGRAM
    USES: tuple[str, ...] = ("bindings", "handed", "loaders", "models", "values")
    STYLES = (RUNTIME_STYLE,)
    REVIEW_CODES: tuple[Review, ...] = (EVALUATION_LOADER_WHOLE, TRAINING_DATA_NOT_FOLLOWED, CUSTOM_SAMPLER, ITERABLE_DATASET)
    DESCRIPTION = "training loaders distributed with mgpu_runtime.distribute_loader"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            from torch.utils.data import DataLoader

            model = nn.DataParallel(model)
            loader = DataLoader(data, batch_size=8, shuffle=True)
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
            """,
            """
            from torch.utils.data import DataLoader
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            loader = mgpu_runtime.distribute_loader(DataLoader(data, batch_size=8, shuffle=True))
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
            """,
            DDP,
            ("MGP101", "MGP122"),
        ),
        Example(
            """
            import torch.nn as nn
            from torch.utils.data import DataLoader

            model = nn.DataParallel(model)
            loader = DataLoader(data, batch_size=8)
            for x, y in loader:
                loss = (model(x) - y).pow(2).sum()
                loss.backward()
            """,
            """
            from torch.utils.data import DataLoader
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            loader = mgpu_runtime.distribute_loader(DataLoader(data, batch_size=8))
            for x, y in loader:
                loss = (model(x) - y).pow(2).sum()
                loss.backward()
            """,
            DDP,
            ("MGP101", "MGP122"),
            name="a-summed-loss-is-split",
        ),
    )

    def apply(self) -> None:
        program = self.program
        # A module that trains the model a project class holds (``Program.holds``) splits its loaders too.
        if not program.migrates and not (program.holds and program.runs_distributed):
            return
        flow = self.analysis.loaders
        self._drawing = self._random_transform()
        summed = {loop: self._summed_loss(loop) for loop in flow.training_loops}
        wrapped: set[cst.CSTNode] = set()
        reported: set[cst.CSTNode] = set()
        code = self.analysis.code_of
        for trace in flow.traces:
            if trace.unsure is not None:
                self._report_once(reported, trace.loop, TRAINING_DATA_NOT_FOLLOWED, self._unsure_message(trace))
            if not trace.training:
                continue
            if summed[trace.loop] is not None:
                self._report_once(reported, trace.loop, SUMMED_LOSS, self._summed_message(summed[trace.loop]))
            elif trace.origin is None:
                if any(other.loop is trace.loop and other.origin is not None for other in flow.traces):
                    continue  # the loop draws its batches from a loader the analysis followed
                inherited = self._inherited(trace) if program.holds else None
                if inherited is not None:
                    if inherited not in wrapped and self.rewrite_allowed(inherited):
                        wrapped.add(inherited)
                        self._distribute_at(
                            inherited,
                            f"training data split across processes with {RUNTIME}.distribute_loader "
                            f"(`{shorten(code(inherited), 40)}`, built by a class this one derives from)",
                        )
                    continue
                data = self._drawn_data(trace)
                if data is not None:
                    self._report_once(
                        reported,
                        trace.loop,
                        TRAINING_DATA_NOT_FOLLOWED,
                        f"this training loop's data (`{shorten(code(data))}`) is not followed to a DataLoader: not "
                        "split, every process loads each whole batch",
                    )
            elif trace.kind in (LOADER, BUILT):
                point = self._wrap_point(trace, summed)
                if point not in wrapped and self.rewrite_allowed(point):
                    wrapped.add(point)
                    self._distribute(point, trace.origin, trace)
        self._split_handed(wrapped)
        split = dict.fromkeys(trace.loop for trace in flow.traces if any(step in wrapped for step in trace.path))
        respelled: set[cst.Call] = set()
        for draw, path in flow.old_draws:
            if draw not in respelled and any(step in wrapped for step in path) and self.rewrite_allowed(draw):
                respelled.add(draw)
                self.edits.replace(draw, lambda call: cst.Call(cst.Name("next"), [cst.Arg(call.func.value)]))
                self.rewrote(
                    draw,
                    f"`{shorten(code(draw), 30)}` drawn with `next()`: the distributed loader's iterator, like torch's "
                    "since 1.0, has no Python 2 `.next()`",
                )
        self._count_samples(list(dict.fromkeys(counter for loop in split for counter in sample_counters(self.analysis, loop))))
        for trace in flow.traces:
            if not trace.training and trace.kind == LOADER and flow.feeds(trace.origin) == {False}:
                self._report_once(
                    reported,
                    trace.origin,
                    EVALUATION_LOADER_WHOLE,
                    "evaluation loader left whole: every process evaluates all of it",
                )
        if program.holds:
            self._other_entries(wrapped, reported)

    def _other_entries(self, wrapped: set[cst.CSTNode], reported: set[cst.CSTNode]) -> None:
        """The other entries of a dict of loaders whose training entry a base class builds and this file splits
        (st-gcn's ``self.data_loader['test']`` beside ``['train']``): left whole, every process evaluates them."""
        split = {
            (point.value.attr.value, self.analysis.code_of(point.slice[0].slice))
            for point in wrapped
            if type(point) is cst.Subscript and type(point.value) is cst.Attribute
        }
        for read in self.analysis.tree.nodes(cst.Subscript):
            owner = read.value
            if (
                read in wrapped
                or type(owner) is not cst.Attribute
                or not _is_name(owner.value, "self")
                or len(read.slice) != 1
                or type(read.slice[0].slice) is not cst.Index
            ):
                continue
            key = self.analysis.code_of(read.slice[0].slice)
            if any(name == owner.attr.value and other != key for name, other in split):
                self._report_once(
                    reported,
                    read,
                    EVALUATION_LOADER_WHOLE,
                    f"`{shorten(self.analysis.code_of(read), 40)}` left whole: every process evaluates all of it",
                )

    def _inherited(self, trace: LoaderTrace) -> Optional[cst.BaseExpression]:
        """Where a loop of a module that trains a held model (``Program.holds``) reads data that a class it derives
        from keeps on ``self`` (st-gcn's ``loader = self.data_loader['train']``, built in ``Processor.load_data()``):
        ``self.<name>`` or one entry of it (``self.<name>[<literal>]``), when nothing in this file stores it."""
        if not trace.path:
            return None
        step = trace.path[-1]
        read = step.value if type(step) is cst.Subscript else step
        if type(step) is cst.Subscript and not all(
            type(element.slice) is cst.Index and type(element.slice.value) in (cst.SimpleString, cst.Integer)
            for element in step.slice
        ):
            return None
        if type(read) is not cst.Attribute or not _is_name(read.value, "self"):
            return None
        name = read.attr.value
        if not stored_by_a_base(self.analysis.path, self.analysis.source, name):
            return None
        for node in self.analysis.tree.nodes(cst.Attribute):
            if node is read or not _is_name(node.value, "self") or node.attr.value != name:
                continue
            parent = self.analysis.tree.parent(node)
            if type(parent) is cst.Subscript and parent.value is node:
                node, parent = parent, self.analysis.tree.parent(parent)
            if type(parent) in (cst.AssignTarget, cst.AugAssign, cst.AnnAssign) and parent.target is node:
                return None  # stored here: the analysis follows what this file builds
        return step

    def _split_handed(self, wrapped: set[cst.CSTNode]) -> None:
        """The data this file hands to a training loop of the project's code (``analysis.handed``): distributed
        where it is built here, or where a builder out of sight returns it (the loop draws its batches from it)."""
        for handover in self.analysis.handed.migrating:
            for point, origin in handover.split:
                if point in wrapped or not self.rewrite_allowed(point):
                    continue
                wrapped.add(point)
                built = self.analysis.loaders.built.get(origin) if origin is not None else None
                if built is not None and built.entries:
                    # pytorch_classifiers' `generate_data`: each loader of the dict it returns, in whole batches when
                    # what the loaders run for each batch draws
                    message = (
                        f"training data split loader by loader (`{shorten(self.analysis.code_of(point), 20)}` of "
                        f"`{shorten(self.analysis.code_of(origin.func), 24)}`, {built.where})"
                    )
                    whole = f": whole batches, {built.draw[0]} draws per sample" if built.draw is not None else ""
                    self._distribute_at(point, message + whole, whole=bool(whole), entries=True)
                    continue
                self._distribute_at(
                    point,
                    f"training data split across processes with {RUNTIME}.distribute_loader (its loop: `{handover.name}`, "
                    f"{handover.loop})",
                )
                if origin is not None:
                    self._check_origin(origin)

    def _drawn_data(self, trace: LoaderTrace) -> Optional[cst.BaseExpression]:
        """Where a training loop the analysis could not follow gets its data: what it iterates, or, for a loop
        that only counts, the ``next(...)`` it draws batches with (None when it draws none)."""
        if not self.analysis.loaders.counts(trace.loop):
            return trace.path[-1] if trace.path else trace.loop.iter
        drawn = contains(trace.loop.body, lambda n: type(n) is cst.Call and _is_name(n.func, "next"))
        if drawn:
            return drawn[0]
        # A batch fetched each step by a call of the script's own (`x, y = train_set.next_batch()`, a chainer-style
        # `batch = convert(train_iter.next())`): the first such value the loop's body stores in names it then
        # passes to a call.
        passed = {
            name.value
            for call in contains(trace.loop.body, lambda n: type(n) is cst.Call)
            for arg in call.args
            for name in contains(arg.value, lambda n: type(n) is cst.Name)
        }
        for assign in contains(trace.loop.body, lambda n: type(n) is cst.Assign):
            value = assign.value
            if type(value) is not cst.Call or (self.analysis.resolve(value.func) or "").startswith("torch."):
                continue
            stored = {name.value for target in assign.targets for name in contains(target.target, lambda n: type(n) is cst.Name)}
            if stored & passed:
                return value
        return None

    def _unsure_message(self, trace: LoaderTrace) -> str:
        line = self.analysis.position
        traces = self.analysis.loaders.traces
        lines = sorted({line(other.path[-1])[0] for other in traces if other.loop is trace.loop and other.unsure})
        data = ("line " if len(lines) == 1 else "lines ") + ", ".join(map(str, lines))
        return (
            f"this loop trains only when `{shorten(self.analysis.code_of(trace.unsure), 30)}` holds "
            f"(line {line(trace.unsure)[0]}), unknown for the data from {data}: not split"
        )

    def _wrap_point(self, trace: LoaderTrace, summed: dict) -> cst.BaseExpression:
        """The step closest to the loader's origin that feeds only training loops whose data may be split (the
        loop's own iterable at the latest)."""
        traces = self.analysis.loaders.traces

        def splittable(other: LoaderTrace) -> bool:
            return other.training and other.kind in (LOADER, BUILT) and summed[other.loop] is None

        for step in reversed(trace.path):
            if all(splittable(other) for other in traces if any(s is step for s in other.path)):
                return step
        return trace.path[0]

    def _distribute(self, point: cst.BaseExpression, origin: cst.Call, trace: LoaderTrace) -> None:
        if trace.kind == BUILT:
            self._distribute_built(point, origin, trace)
            return
        drawn, followed = self._dataset_draw(origin) if self._drawing is None else (None, True)
        if drawn is not None and not followed:
            # The class is picked by a project factory at run time: any of them may draw per sample, as the
            # original did for the whole batch, in order; loading it whole keeps those numbers (slower, never wrong).
            message = (
                f"training data split with {RUNTIME}.distribute_loader: whole batches: the dataset class "
                f"`{drawn}` gives (not followed) may draw per sample"
            )
            self._distribute_at(point, message, whole=True)
        elif drawn is not None:
            # The project's dataset draws for each sample it reads (faster-rcnn's roibatchLoader: numpy's crops and
            # box shuffles): the original drew them for the whole batch, in order, so every process loads it whole.
            message = f"training data split with {RUNTIME}.distribute_loader: whole batches, its dataset draws per sample ({drawn})"
            self._distribute_at(point, message, whole=True)
        else:
            self._distribute_at(point, f"training data split across processes with {RUNTIME}.distribute_loader")
        self._check_origin(origin)

    def _dataset_draw(self, loader: cst.Call) -> tuple[Optional[str], bool]:
        """``name, path:line`` of the first random draw in the project class whose object is the loader's dataset
        (built in the call, in a name the loader is given, or an entry of a dict of datasets; a class of this file
        or of the project), or in a function or class of them handed to that dataset (a transform the script
        defines), else None; and whether the dataset's class was followed (False: a project factory picks it at run
        time, whose text is given in place of a draw: ``get_dataset(name)``, ``datasets.__dict__[name]``)."""
        given = argument(loader, "dataset", 0)
        if given is None:
            return None, True
        scope = self.analysis.values.scope_of(loader)
        project = None
        for call in self._possible(given.value, scope):
            if type(call) is not cst.Call:
                continue
            project = project or project_of(self.analysis.path)
            if project is None:
                return None, True
            found = self._definition(project, call.func)
            place = per_sample_draw(found, project) if found is not None else None
            if place is not None:
                return f"`{found.name}`, {place}", True
            if found is None:
                factory = self._project_factory(project, call.func)
                if factory is not None:
                    return factory, False
            handed = [arg.value for arg in call.args] + [
                element.value for arg in call.args if type(arg.value) in (cst.List, cst.Tuple) for element in arg.value.elements
            ]
            for value in (inner for arg in handed for inner in self._possible(arg, scope)):
                if type(value) is cst.Call and type(value.func) is cst.Name:
                    value = value.func  # an object of a class of this file: its `__call__`
                found = self._definition(project, value) if type(value) is cst.Name else None
                place = applied_draw(found) if found is not None else None
                if place is not None:
                    return f"`{found.name}`, {place}", True
        return None, True

    def _project_factory(self, project, func: cst.BaseExpression) -> Optional[str]:
        """The text of a project factory the dataset's class comes from, which the tool does not follow to a class:
        a project function's result (deeplab-pytorch's ``get_dataset(name)(...)``, a dict of classes picked by
        name) or an entry of a project module's names (pytorch-pose's ``datasets.__dict__[args.dataset](...)``)."""
        if type(func) is cst.Call and self._definition(project, func.func) is not None:
            return shorten(self.analysis.code_of(func), 26)
        if type(func) is cst.Subscript and type(func.value) is cst.Attribute and func.value.attr.value == "__dict__":
            origins = self.analysis.origins(func.value.value)
            if any(not origin.startswith(_LIBRARIES) and project.module(origin) is not None for origin in origins):
                return shorten(self.analysis.code_of(func), 26)
        return None

    def _possible(self, expr: cst.BaseExpression, scope, depth: int = 3) -> list[cst.BaseExpression]:
        """What ``expr`` may be: the values stored in a name, the entries of a dict or list it picks from."""
        values = self.analysis.values
        if type(expr) is cst.Subscript and depth:
            entries = values.entries(expr, scope) or []
            return [found for entry, entry_scope in entries for found in self._possible(entry, entry_scope, depth - 1)]
        if type(expr) in (cst.Name, cst.Attribute) and depth:
            stored = values.of(expr, scope)
            if stored != [expr]:
                return [found for value in stored for found in self._possible(value, scope, depth - 1)]
        return [expr]

    def _definition(self, project, func: cst.BaseExpression):
        """The project definition (of another module, or of this file) that ``func`` names, else None."""
        qualified = self.analysis.resolve(func)
        if qualified is not None and qualified.startswith(_LIBRARIES):
            return None
        found = project.find(qualified) if qualified else None
        if found is None and type(func) is cst.Name and func.value in self.analysis.bindings.local:
            found = project.own(func.value, self.analysis.source)
        return found

    def _distribute_built(self, point: cst.BaseExpression, origin: cst.Call, trace: LoaderTrace) -> None:
        """A loader a builder of another module returns (``train_set, test_set = get_datasets(...)``): split where the
        loop's data is read here, in whole batches when what the loader runs for each batch draws random numbers
        (its ``collate_fn``, its dataset), which the original drew for the whole batch."""
        built = self.analysis.loaders.built[origin]
        name = shorten(self.analysis.code_of(origin.func), 24)
        if built.sampler is not None:
            self.left(
                origin,
                CUSTOM_SAMPLER,
                f"custom sampler (`{built.sampler}=`, {built.where}): distribute_loader runs it on the main process only "
                "and splits each batch it makes",
            )
        message = f"training data split across processes with {RUNTIME}.distribute_loader (`{name}`, {built.where})"
        if built.draw is not None:
            message = f"training data split with {RUNTIME}.distribute_loader (`{name}`, {built.where})"
            whole = f": whole batches, {built.draw[0]} draws per sample"
            if len(message + whole) > 160:  # a deep path: its file's name says enough
                whole = f": whole batches, {os.path.basename(built.draw[0])} draws per sample"
            self._distribute_at(point, message + whole, whole=True)
            return
        self._distribute_at(point, message)

    def _distribute_at(self, point: cst.BaseExpression, message: str, whole: bool = False, entries: bool = False) -> None:
        """``distribute_loader(point)`` (``distribute_loaders`` for a dict of loaders, ``entries``); with
        ``whole_batches=True`` in a file that builds random transforms, or when ``whole`` says so (the message then
        says why)."""
        function = "distribute_loaders" if entries else "distribute_loader"
        drawing = self._drawing
        cutter = self._own_scatter()
        if cutter is not None and not whole:
            # A rebased DataParallel subclass cuts each batch itself: every process needs the whole batch for it.
            message += f": whole batches, the wrapper's own scatter ({cutter}) cuts each one"
            whole = True
        if drawing is None and not whole:
            self.edits.replace(point, lambda expr: runtime_call(function, expr))
        else:
            whole_batches = cst.Arg(cst.Name("True"), keyword=cst.Name("whole_batches"))
            self.edits.replace(
                point, lambda expr: runtime_call(function, expr).with_changes(
                    args=[cst.Arg(expr), whole_batches.with_changes(
                        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
                    )]
                )
            )
            # Every process loads each whole batch, so that the transform's draws are the original's numbers.
            if drawing is not None and not whole and self._drawn_at is not None:
                line = self.analysis.position(drawing)[0]
                whole = f"; whole batches (line {line} builds what draws per sample, {self._drawn_at})"
                if len(message + whole) > 160:  # a deep path: its file's name says enough
                    whole = f"; whole batches (line {line} builds what draws per sample, {os.path.basename(self._drawn_at)})"
                message += whole
            elif drawing is not None and not whole:
                message += f"; whole batches (line {self.analysis.position(drawing)[0]} draws per sample)"
        self.edits.need_import(RUNTIME)
        self.rewrote(point, message)

    def _own_scatter(self) -> Optional[str]:
        """Where the ``scatter`` of a DataParallel subclass rebased on the runtime's wrapper (MGP106) is, if the file
        has one (``line 20``) or calls one of another module of the project (``utils/utils.py:194``)."""
        methods = [method for method in rebased_machinery(self.analysis, self.rewritten) if method.name.value == "scatter"]
        if methods:
            return f"line {self.analysis.position(min(methods, key=self.analysis.position))[0]}"
        models = self.analysis.models
        for site in models.sites:
            facts = models.project_subclasses.get(site.call)
            if facts is not None and facts.scatter_line is not None and site.call in self.rewritten:
                return facts.scatter_place
        return None

    def _random_transform(self) -> Optional[cst.Call]:
        """The first call of the file that builds a transform drawing random numbers per sample
        (torchvision's ``RandomCrop``, ``ColorJitter``, a project's ``transforms.RandomSizedRectCrop``, any
        albumentations transform), also one a star import of transforms binds, else None. Failing that, the first
        call of a project builder or class of augmentations or transforms whose objects draw (pytorch-semseg's
        ``get_composed_augmentations(cfg)``, speech-commands' ``ChangeAmplitude()``), its draw's place kept in
        ``self._drawn_at``."""
        self._drawn_at: Optional[str] = None
        builders = []
        for call in self.analysis.calls:
            qualified = self.analysis.resolve(call.func) or self._star_transform(call.func) or ""
            if drawing_transform(qualified):
                return call
            if not qualified and type(call.func) is cst.Name and call.func.value in self.analysis.bindings.local:
                qualified = call.func.value  # a class or function of this file (erfnet's `MyCoTransform(...)`)
            if ("aug" in qualified.lower() or "transform" in qualified.lower()) and not qualified.startswith(_LIBRARIES):
                builders.append((call, qualified))
        project = project_of(self.analysis.path) if builders else None
        for call, qualified in builders:
            found = None
            if project is not None:
                found = project.find(qualified) if "." in qualified else project.own(qualified, self.analysis.source)
            self._drawn_at = builder_draw(project, found) if project is not None and found is not None else None
            if self._drawn_at is not None:
                return call
        return None

    def _star_transform(self, func: cst.BaseExpression) -> Optional[str]:
        """A name that only a star import of a module of transforms binds (speech-commands' ``from transforms import
        *`` beside ``from torchvision.transforms import *``): what the project's module binds it to, else
        torchvision's (``RandomCrop``); None for any other name."""
        if type(func) is not cst.Name or not self.analysis.bindings.star_sources(func.value):
            return None
        modules = sorted(module for module in self.analysis.bindings.star_modules if "transform" in module.lower())
        project = project_of(self.analysis.path) if modules else None
        for module in modules:
            bound = project.star_binding(module, func.value) if project is not None else None
            if bound is not None and bound != NOT_BOUND:
                return bound
        return f"torchvision.transforms.{func.value}" if "torchvision.transforms" in modules else None

    def _check_origin(self, origin: cst.Call) -> None:
        """What to say of a DataLoader distributed: its own sampler, an iterable dataset."""
        sampler = self._custom_sampler(origin)
        if sampler is not None:
            self.left(
                sampler,
                CUSTOM_SAMPLER,
                "custom sampler: distribute_loader runs it on the main process only and splits each batch it makes",
            )
        dataset = self._iterable_dataset(origin)
        if dataset is not None:
            self.left(
                dataset,
                ITERABLE_DATASET,
                "iterable dataset: the main process reads every batch and sends each process its rows",
            )

    def _report_once(self, reported: set, node: cst.CSTNode, code: Review, message: str) -> None:
        if node not in reported:
            reported.add(node)
            self.left(node, code, message)

    def _summed_loss(self, loop: cst.For) -> Optional[cst.CSTNode]:
        """A loss summed by hand that keeps this loop's data whole (the torch style's twin finds them). None: the
        runtime's batches are the global batch's, and so is a loss on them, whatever its reduction."""
        return None

    def _count_samples(self, counters: list[cst.AugAssign]) -> None:
        """What becomes of the sample counters of the loops split (the torch style's twin sums them). Nothing: a
        count of the runtime's batches (``x.shape[0]``, ``mask.sum()``) is the global batch's already."""

    # -- what to check on a distributed loader ------------------------------------------------------
    def _custom_sampler(self, loader: cst.Call) -> Optional[cst.BaseExpression]:
        """A sampler that is not one of torch's, given to the loader directly or inside a ``BatchSampler``."""
        scope = self.analysis.values.scope_of(loader)
        for name, position in _SAMPLER_POSITIONS.items():
            arg = argument(loader, name, position)
            if arg is None:
                continue
            for value in self.analysis.values.of(arg.value, scope):
                if type(value) is cst.Name and value.value == "None":
                    continue
                if type(value) is cst.Call and self._own_paths(value):
                    continue
                if type(value) is not cst.Call or self.analysis.resolve(value.func) not in _TORCH_SAMPLERS:
                    return arg.value
                inner = argument(value, "sampler", 0) if name == "batch_sampler" else None
                if inner is not None and self._custom_sampler_values(inner.value, scope):
                    return arg.value
        return None

    def _own_paths(self, sampler: cst.Call) -> bool:
        """A ``DistributedSampler`` of the own distributed path that the file starts itself beside its migrated
        fallback (``Program.beside``): the runtime's processes never build it."""
        return self.program.beside is not None and self.analysis.resolve(sampler.func) in _DISTRIBUTED_SAMPLERS

    def _custom_sampler_values(self, expr: cst.BaseExpression, scope) -> bool:
        return any(
            type(value) is not cst.Call or self.analysis.resolve(value.func) not in _TORCH_SAMPLERS
            for value in self.analysis.values.of(expr, scope)
        )

    def _iterable_dataset(self, loader: cst.Call) -> Optional[cst.BaseExpression]:
        """The loader's dataset when it is built from a class of this file deriving from ``IterableDataset``."""
        arg = argument(loader, "dataset", 0)
        if arg is None:
            return None
        classes = {s.name.value: s for s in self.analysis.module.body if type(s) is cst.ClassDef}
        for value in self.analysis.values.of(arg.value, self.analysis.values.scope_of(loader)):
            if (
                type(value) is cst.Call
                and type(value.func) is cst.Name
                and value.func.value in classes
                and any(self.analysis.resolve(base.value) in _ITERABLE_DATASETS for base in classes[value.func.value].bases)
            ):
                return arg.value
        return None


# -- schedules counted in samples -------------------------------------------------------------------
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
    USES = ("bindings", "flow", "handed", "loaders", "models", "values")
    STYLES = (TORCH_STYLE,)
    REVIEW_CODES = (SUMMED_LOSS, DATA_ORDER, GLOBAL_BATCH)
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

    def _split_handed(self, wrapped: set[cst.CSTNode]) -> None:
        """Nothing: under plain DDP the project's training loop computes each process's own values, which the
        tool cannot check there; such a file is left (MGP285)."""

    # -- sum-reduced losses ------------------------------------------------------------------------
    def _summed_loss(self, loop: cst.For) -> Optional[cst.CSTNode]:
        """A value summed by hand that a backward pass of this training loop is called on, if any (the pass
        in the loop's body, or in a function of this file the loop calls)."""
        for call in self.analysis.loaders.backward_calls(loop):
            receiver = (
                call.func.value if type(call.func) is cst.Attribute else (call.args[0].value if call.args else None)
            )
            region = self._region(call, loop)
            for value in self._values_of(receiver, region, loop, _ARGUMENT_DEPTH):
                if self._is_summed(value):
                    return value
            accumulated = self._accumulated_over_rows(receiver, region)
            if accumulated is not None:
                return accumulated
        return None

    def _accumulated_over_rows(self, receiver, region: cst.CSTNode) -> Optional[cst.CSTNode]:
        """``loss += f(out[b], y[b])`` in ``for b in range(out.shape[0])``: one term per row, a sum."""
        if type(receiver) is not cst.Name:
            return None
        for node in contains(region, lambda n: type(n) is cst.AugAssign and type(n.operator) is cst.AddAssign):
            if type(node.target) is not cst.Name or node.target.value != receiver.value:
                continue
            for loop in self.analysis.tree.ancestors(node):
                if loop is region:
                    break
                if (
                    type(loop) is cst.For
                    and type(loop.iter) is cst.Call
                    and type(loop.iter.func) is cst.Name
                    and loop.iter.func.value == "range"
                    and len(loop.iter.args) == 1
                    and is_row_count(self.analysis, loop.iter.args[0].value)
                ):
                    return node
        return None

    def _region(self, node: cst.CSTNode, loop: cst.For) -> cst.CSTNode:
        """Where the names ``node`` reads are assigned: the loop's body when ``node`` is in it, otherwise the
        body of the function that holds ``node`` (the module at top level)."""
        tree = self.analysis.tree
        if loop in tree.ancestors(node) and tree.function(node) is tree.function(loop):
            return loop.body
        function = tree.function(node)
        return function.body if function is not None else self.analysis.module

    def _values_of(self, receiver, region: cst.CSTNode, loop: cst.For, depth: int) -> list[cst.BaseExpression]:
        """What ``receiver`` may hold: what ``region`` assigns to it, or what this file's calls pass to it
        when it is a parameter of the function whose body ``region`` is."""
        # `scaler.scale(loss).backward()`: the scaled value.
        while (
            type(receiver) is cst.Call
            and type(receiver.func) is cst.Attribute
            and receiver.func.attr.value == "scale"
            and receiver.args
        ):
            receiver = receiver.args[0].value
        if type(receiver) is not cst.Name:
            return [receiver] if receiver is not None else []
        assigned = [
            node.value
            for node in contains(region, lambda n: type(n) in (cst.Assign, cst.AugAssign))
            for target in ([t.target for t in node.targets] if type(node) is cst.Assign else [node.target])
            if type(target) is cst.Name and target.value == receiver.value
        ]
        if assigned:
            return assigned
        index = self.analysis.flow
        function = self.analysis.tree.parent(region)
        if depth == 0 or type(function) is not cst.FunctionDef or receiver.value not in index.parameters(function):
            return []
        place = (index.scopes[function], receiver.value)
        return [
            value
            for call, _, implicit in index.call_sites(function)
            for position, arg in enumerate(call.args)
            if index.parameter_place(function, call, position, implicit) == place
            for value in self._values_of(arg.value, self._region(call, loop), loop, depth - 1)
        ]

    def _is_summed(self, value: cst.BaseExpression) -> bool:
        if type(value) is cst.BinaryOperation:
            if type(value.operator) is cst.Divide and is_row_count(self.analysis, value.right):
                return False  # a sum over the rows divided by their count: a mean
            if type(value.operator) is cst.Multiply and (
                is_row_count(self.analysis, value.left) or is_row_count(self.analysis, value.right)
            ):
                return True  # a mean times the row count: a sum
            return self._is_summed(value.left) or self._is_summed(value.right)
        if type(value) is not cst.Call:
            return False
        if type(value.func) is cst.Attribute and value.func.attr.value == "sum":
            return True
        if self.analysis.resolve(value.func) == "torch.sum":
            return True
        if value in self.rewritten:
            return False  # a loss FunctionalLoss hands to the runtime, which leaves the file (MGP295)
        for arg in value.args:
            if arg.keyword is not None and arg.keyword.value == "reduction":
                return type(arg.value) is cst.SimpleString and arg.value.evaluated_value == "sum"
            if arg.keyword is not None and arg.keyword.value == "size_average":
                return type(arg.value) is cst.Name and arg.value.value == "False"
        return False

    def _summed_message(self, value: cst.CSTNode) -> str:
        line, _ = self.analysis.position(value)
        return (
            f"the loss is summed by hand (line {line}), which DDP's gradient average cannot weight: this loop's "
            "data is not split"
        )

    def _count_samples(self, counters: list[cst.AugAssign]) -> None:
        """``used_sample += x.shape[0]`` counts this process's share: the global batch's count is the runtime's
        ``reduce_sum`` of it, which has no plain form, so the file is left as it is (MGP295)."""
        for counter in counters:
            if self.rewrite_allowed(counter.value):
                self.edits.replace(counter.value, lambda expr: runtime_call("reduce_sum", expr))
                self.edits.need_import(RUNTIME)
                self.rewrote(
                    counter,
                    f"`{shorten(self.analysis.code_of(counter.target), 30)}` counts this process's samples: the global "
                    "batch's count needs the runtime",
                    GLOBAL_COUNT,
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
