"""MGP285: the model is trained in another module of the project, whose data the tool cannot split from here."""

from __future__ import annotations

import builtins
import os
import re
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.held import held_training
from mgpu_migrate.analysis.old_loader import old_loader
from mgpu_migrate.analysis.own_path import launches_own_path
from mgpu_migrate.analysis.project import importers, project_of
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.rules.base import CHECKS, DDP, RUNTIME_STYLE, Example, Review, Rule

TRAINED_ELSEWHERE = Review(
    "MGP285",
    name="trained-elsewhere",
    summary="the model is trained in another module of the project, in a way the tool cannot follow: file left as it is",
    why=(
        "The model wrapped here is trained in another module of the project (a `Trainer` class that calls "
        "`backward`, a `train_epoch(loader, model, ...)` function). The tool follows such code: when the training "
        "loop there iterates a loader this file hands it (a parameter, or an attribute `__init__` sets from one), "
        "it splits that loader here and migrates the file, since under the runtime the loop's values are the "
        "global batch's wherever the loop is. Here it could not: the loop's data is not a parameter it can trace "
        "back to a loader of this file (an attribute of another object, a dict of loaders, `next(it)` each "
        "step), no method this file calls runs the loop, or `--style torch` is asked, whose plain DDP computes "
        "each process's own values in a loop the tool does not check. A migration of the wrap alone would give "
        "every process whole batches. The file is left as it is."
    ),
    todo=(
        "Hand the training code its loader as an argument (or split it yourself with "
        "`mgpu_runtime.distribute_loader` where it is built) and migrate again with the default style; or use "
        "`--to balanced`, which keeps one process."
    ),
    veto=True,
)
TRAINING_CODE_NEEDS_CHANGES = Review(
    "MGP323",
    name="training-code-needs-changes",
    summary="the project's training code that gets the model does something every process would do: file left",
    why=(
        "The model wrapped here is trained in another module of the project, which the tool follows: its "
        "loop's data is split here, and its values are the global batch's under the runtime. But a site there "
        "needs a change that a migration of this file cannot make, since the tool rewrites a module only when it "
        "migrates that module: it writes a file or makes a directory (every process would; a training module "
        "that migrates in the same run, as one the scripts hand the model to does when the tool can rewrite it, "
        "has its writes made once instead), runs distributed "
        "calls of its own, names torch's DataParallel (an `isinstance` check that would turn false), picks a GPU "
        "by its number (every process would use it), or catches an error around the step (each process would "
        "decide alone whether to take it). The diagnostic names the site, `module:line`. The file is left as it is."
    ),
    todo=(
        "Change that site (save under `if mgpu_runtime.is_main_process():`, use `mgpu_runtime.device()`, let the "
        "error stop the run) and migrate again; or use `--to balanced`, which keeps one process."
    ),
    veto=True,
)
EVALUATED_ELSEWHERE = Review(
    "MGP286",
    name="evaluated-elsewhere",
    summary="the model is only evaluated, here and in the project's code it goes to: file left as it is",
    why=(
        "The model wrapped here only goes to evaluation code of the project (no backward pass, no optimizer). "
        "DataParallel serves evaluation better than one process per GPU, which would each evaluate the whole "
        "data set. The file is left as it is."
    ),
    todo="Nothing, unless the project trains the model elsewhere: then migrate that module.",
    veto=True,
)
TRAINED_BY_IMPORTER = Review(
    "MGP320",
    name="trained-by-importer",
    summary="the model goes to the modules that import this one, which train it: file left as it is",
    why=(
        "The wrap is in a function that returns the model (`load_model()`, `build_model()`) or in a class that "
        "keeps it (`self.model = nn.DataParallel(self.model)` in a wrapper module), and nothing in this file "
        "trains it: the modules that import this one do (the diagnostic names the first one found, preferring one "
        "that uses the function or class). Those modules hold the training loop, its loader and its loss, and "
        "they have no DataParallel of their own, so the tool does not rewrite them: migrating the wrap alone "
        "would give a program whose every process trains on whole batches. One shape is followed: a class that "
        "keeps the model on `self` and whose subclasses in the importing modules train it (st-gcn's `IO`, "
        "`Processor`, `REC_Processor`). Then this file migrates together with them (each subclass's module gets "
        "its loaders split and its side effects made once, the script importing it the set-up, or this class "
        "where it chooses the GPUs: MGP150) when every "
        "subclass trains in its own module and migrates; else the message names the subclass that keeps them "
        "all as they are (`module:line`, with the code its module reports: MGP326), a class in between, or one "
        "that does not train (a demo would run on every process), unless the class gives the set-up the GPUs it "
        "chooses and the demo reads of the model what DataParallel lacks (st-gcn's `self.model.extract_feature`): "
        "the original ran it on one GPU alone, and one GPU chosen is one process."
    ),
    todo=(
        "Migrate the module that trains: split its loader with `mgpu_runtime.distribute_loader`, make its loss "
        "exact, and wrap the model there (or migrate this wrap by hand together with it); or use "
        "`--to balanced`, which keeps one process. When that module sets up distributed training itself "
        "(`init_process_group`, which the diagnostic then names), launch its own distributed path instead."
    ),
    veto=True,
)
LOADER_ON_OLD_TORCH = Review(
    "MGP341",
    name="loader-on-old-torch",
    summary="the program that trains the model builds its loader on torch 0.4's DataLoader iterator: it cannot run; file left",
    why=(
        "The wrap is in a function or class that hands the model to the modules importing this one (as for MGP320), "
        "and the program that trains it imports `torch.utils.data.dataloader._DataLoaderIter`, the iterator of "
        "torch 0.4's DataLoader, in a module it always imports (RCAN's and EDSR's `MSDataLoader` derive their own "
        "multi-process iterator from it). torch 1.2 replaced that class and the worker helpers such loaders "
        "import with them, so the program stops at that import on every release since, and on torch 2.13, the "
        "runtime's lowest: there is no run of the original, on one GPU or several, for a migration to keep or for "
        "`mgpu-migrate verify` to compare with. A migration would need that loader rewritten first, which is no "
        "change the tool makes. The file is left as it is; the diagnostic names the importer and the import."
    ),
    todo=(
        "Port the loader to the current DataLoader (a plain `DataLoader` with a `collate_fn`, or a "
        "`worker_init_fn` that picks the scale), then migrate again; the training module's loop over it is then "
        "what MGP320 names."
    ),
    veto=True,
)
PROGRESS_BAR_IN_TRAINING_CODE = Review(
    "MGP324",
    name="progress-bar-in-training-code",
    summary="the project's training code that gets the model draws a progress bar: every process draws it",
    why=(
        "The file is migrated: the model it wraps is trained in another module of the project, whose loop the tool "
        "follows and whose data it splits here. That code draws a `tqdm` progress bar, which every process draws "
        "over the others' on its stderr (the runtime hands on the main process's stdout alone, every process's "
        "stderr). Training, saves and printed lines are the original's; the bar is drawn once per process. The "
        "tool rewrites a module only when it migrates that module (a module of training code migrates with the "
        "scripts that hand it the model, and draws its bars on the main process, MGP125, unless something keeps it "
        "as it is), so it does not add the main-process test there."
    ),
    todo="Add `disable=not mgpu_runtime.is_main_process()` to that `tqdm(...)` (or ignore the extra bars).",
)
NO_PROJECT_ROOT = Review(
    "MGP321",
    name="handed-out-without-project",
    summary="the model is handed to the code importing this file, and no project root shows that code: file left",
    why=(
        "The wrap is in a function that returns the model (`build_model()`) or in a class that keeps it on `self`, "
        "and nothing in this file trains it: the code that imports this file does. Inside a project (a directory "
        "above holding `pyproject.toml`, `setup.py`, `setup.cfg` or `.git`) the tool reads that code and says "
        "where it is (MGP320); here it finds no project root (a lone file in a scratch folder) and no importer "
        "beside the file, so it cannot see who trains the model. Migrating the wrap alone would give a program whose every "
        "process trains on whole batches. The file is left as it is."
    ),
    todo="Run the tool in the project's checkout, over the training script together with this file.",
    veto=True,
)
HELD_DATA_NOT_SPLIT = Review(
    "MGP326",
    name="held-model-data-not-split",
    summary="this module trains the model a project class holds, and its training data cannot be split here: file left",
    why=(
        "A class of this module derives from a project class that keeps the DataParallel wrap on `self` (st-gcn's "
        "`IO`: `self.model = nn.DataParallel(self.model)`), and this module trains that model. The tool migrates "
        "the two together: the wrap becomes the runtime's, and this module's training loaders are split "
        "(`mgpu_runtime.distribute_loader`) and its side effects made once. Here a training loop draws its data from "
        "something the tool cannot follow to a DataLoader built in this module (a loader built in another module, a "
        "dict of loaders, `next(it)` each step), or the backward pass runs in no loop over such data: every process "
        "would load each whole batch. This module is left as it is, and so is the module holding the wrap (its "
        "MGP320 names this site)."
    ),
    todo=(
        "Build the training loader in this module, where the loop iterates it (or split it yourself with "
        "`mgpu_runtime.distribute_loader` where it is built), and migrate again; or use `--to balanced`."
    ),
    veto=True,
)
_BUILTINS = frozenset(dir(builtins))


# Containers of modules without a forward of their own: a DataParallel of one is never called.
_CONTAINERS = frozenset({"torch.nn.ModuleList", "torch.nn.ModuleDict", "torch.nn.modules.container.ModuleList", "torch.nn.modules.container.ModuleDict"})

class ProjectTraining(Rule):
    """
    ## What it does
    When a file wraps a model but runs no backward pass itself, follows the model into the project's own
    modules: a call here that hands it to a function or class of another module (``Trainer(model,
    criterion)`` from ``reid/trainers.py``, ``scan_train(loader, model, ...)`` from ``utils/train_utils.py``)
    whose code, or a project class it derives from, runs the backward pass (``analysis/handed.py``). When the
    training loop there iterates a loader this file hands it (a parameter of the function or of the method
    called here, ``trainer.train(epoch, train_loader, optimizer)``, or an attribute ``__init__`` sets from
    one), the file migrates: that loader is split here (MGP122), and the set-up and saves are this file's.
    The loop may sit one method call deeper than the method called here (Conv-TasNet's ``Solver.train()``
    calls ``self._run_one_epoch()``, which runs the backward pass). A training module that writes files or logs
    migrates in the same run as this file (its writes made once) instead of leaving it. Any other
    site of that training code that a migration of this file cannot make right leaves the file, named as
    ``module:line`` (MGP323): a file written there by a module that stays, a distributed call of its own, torch's
    DataParallel named, a GPU picked by number, an error caught around the step. Training whose data the
    reading cannot follow back here, or any under ``--style torch``, leaves the file too, naming the
    definition that trains (MGP285). A progress bar that code draws is said (MGP324). When the model only
    goes to project code that runs no backward pass (``fill_memory_bank(loader, model, bank)``) or to this
    file's functions, and no optimizer is made here, the file evaluates: it is left as DataParallel (MGP286).
    When the wrap is in a function that returns the model (``load_model()``) or in a class that holds it
    (``self.model = DataParallel(...)`` in a wrapper ``nn.Module``), the model goes to the modules that import
    this one, which a bounded byte search of the project finds: the file is left, and the diagnostic names the
    importer that uses the function or class (MGP320), or, when that importer's program builds its loader on torch
    0.4's ``_DataLoaderIter`` (RCAN's ``MSDataLoader``, which no torch since 1.2 can import), says that the original
    cannot run (MGP341); a function whose every importer that trains its model
    launches a distributed path of its own from a plain start (MGP139 there: DialoGPT's ``load_model``, whose
    DataParallel branch that path never takes) leaves this file as it is with nothing to say. When that class's subclasses in the importing modules
    train the model (st-gcn's ``IO`` held the wrap, ``REC_Processor(Processor)`` trains), the file migrates
    with them: each such module, which has no DataParallel of its own, gets its training loaders split and its
    side effects made once, and the script that imports it the set-up (``engine.held_programs``,
    ``analysis/held.py``). So does a class that keeps its own wrap and that no class derives from, when every
    module building it (``model = MyAlexNetCMC(...)``, CMC) trains it and migrates: each is then such a program,
    with its own set-up; one that builds it and does not train it leaves the file (MGP320 names it). A loop
    there whose data cannot be split there leaves that module (MGP326) and this
    file, whose MGP320 names the site; so does a subclass that does not train, or a class in between. A subclass
    that does not train is no obstacle when the class gives the set-up the GPUs it chooses (``self.gpus``,
    MGP150) and that subclass's module reads of the wrapped model what a DataParallel wrap does not have
    (st-gcn's demos: ``self.model.extract_feature(...)``): the original could run it on one GPU only, unwrapped,
    and with one GPU chosen the migration runs it as one process, unwrapped. Such a file with no project root above it and no
    importer beside it (a lone file in a scratch folder) is left too, since nothing shows who trains the model
    (MGP321).

    ## Why is this bad?
    Under the runtime's contract the training loop's values outside the model's ``forward`` are the global
    batch's wherever the loop is, so a loop in another module trains as the original did once its data is
    split and the program set up, which this file does. What that module does on its own (writing a file, a
    GPU by number, a decision from a caught error) every process would do, and the tool rewrites a module only
    when it migrates it. Data it cannot follow would reach every process whole; plain DDP (``--style
    torch``) computes each process's own values in a loop the tool does not check there.

    ## Example
    ```python
    from reid.trainers import Trainer   # Trainer.train(epoch, data_loader, ...) loops over data_loader
    train_loader = DataLoader(train_set, batch_size=256, shuffle=True)
    model = nn.DataParallel(model).cuda()
    trainer = Trainer(model, criterion)
    trainer.train(epoch, train_loader, optimizer)
    ```

    ## Use instead
    ```python
    train_loader = mgpu_runtime.distribute_loader(DataLoader(train_set, batch_size=256, shuffle=True))
    model = mgpu_runtime.DistributedDataParallel(model).cuda()
    ```

    ## Fix safety
    The training module is read, never rewritten: a file migrates only when that module needs no change. A
    file left is left whole: ``--to ddp`` migrates a file entirely or not at all.
    """

    CODE = TRAINED_ELSEWHERE
    PHASE = CHECKS
    USES = ("bindings", "entry_point", "handed", "loaders", "models", "values")
    REVIEW_CODES = (
        TRAINED_BY_IMPORTER,
        LOADER_ON_OLD_TORCH,
        HELD_DATA_NOT_SPLIT,
        TRAINED_ELSEWHERE,
        TRAINING_CODE_NEEDS_CHANGES,
        PROGRESS_BAR_IN_TRAINING_CODE,
        EVALUATED_ELSEWHERE,
        NO_PROJECT_ROOT,
    )
    DESCRIPTION = "models handed to the project's training code in other modules: followed there, or the file is left"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model)
            for x in loader:
                model(x).sum().backward()
            """,
            """
            import mgpu_runtime

            mgpu_runtime.setup()

            model = mgpu_runtime.DistributedDataParallel(model)
            for x in loader:
                model(x).sum().backward()
            """,
            DDP,
            ("MGP101", "MGP120", "MGP235"),
        ),
    )

    def apply(self) -> None:
        program = self.program
        if program.holds and program.runs_distributed and not program.wraps:
            self._check_held(program.holds[0])
            return
        if not program.migrates or any(self.analysis.loaders.is_backward(call) for call in self.analysis.calls):
            return
        project = project_of(self.analysis.path)
        if project is None:  # text that is no file (stdin): nothing to read
            return
        evaluated = []  # the project's functions that get the model and do not train it
        unknown = False  # a call out of sight (a library's) gets the model
        passed = False
        followed = False  # the model is trained in the project's code, which a migration here makes right
        for call in self.analysis.calls:
            if not self._passes_model(call):
                continue
            qualified = self.analysis.resolve(call.func)
            found = project.find(qualified) if qualified else None
            trainer = project.trains(found) if found is not None else None
            if trainer is None:
                if found is not None:
                    evaluated.append(found)
                elif not self._stays_here(call, qualified):
                    unknown = True
                # The model goes somewhere: the project's code or this file's functions (not torch's, a builtin's).
                passed = passed or found is not None or qualified is None
                continue
            handover = self.analysis.handed.of(call)
            if handover is not None and handover.migrates and self.options.style == RUNTIME_STYLE:
                followed = True
                for where in handover.progress_bars:
                    self.left(
                        call,
                        PROGRESS_BAR_IN_TRAINING_CODE,
                        f"`{handover.name}` trains the model here and draws a progress bar ({where}): every process draws it",
                    )
                continue
            self._leave_trained_elsewhere(program, call, found.name, trainer, handover)
            return
        if followed:
            return
        if self._handed_to_importers(program):
            return
        if project.root is None and self._left_without_project(program):
            return  # importers were searched for in the file's own folder only
        # The model runs (in this file, or in the project's code it goes to), and nothing can train it; an
        # evaluation script already left as one needs no second word.
        runs = bool(evaluated) or bool(self.analysis.models.model_calls())
        if any(code.only_evaluates for code in self.reported):
            return
        if passed and runs and not unknown and not self._trains_anywhere(program.wraps):
            where = (
                f"`{evaluated[0].name}` ({evaluated[0].where}) of the project" if evaluated else "this file's functions"
            )
            self.left(
                program.wraps[0],
                EVALUATED_ELSEWHERE,
                f"the model is only evaluated (it goes to {where}, no backward pass, no optimizer): file left as it is",
            )

    def _leave_trained_elsewhere(self, program, call: cst.Call, name: str, trainer, handover) -> None:
        """MGP323 when a site of the training code needs a change there, else MGP285 with what was not followed;
        each wrap the file keeps is named at its own line."""
        line = self.analysis.position(call)[0]
        project = project_of(self.analysis.path)
        backward = f"{trainer.where.rpartition(':')[0]}:{project.backward_line(trainer)}" if project else trainer.where
        blocker = handover.blocker if handover is not None else None
        code = TRAINED_ELSEWHERE
        if self.options.style != RUNTIME_STYLE:
            message = (
                f"the model is trained in `{name}` (line {line}; backward at {backward}), whose values plain DDP keeps "
                "each process's own (--style torch): file left as it is"
            )
        elif blocker is not None:
            code = TRAINING_CODE_NEEDS_CHANGES if blocker.in_code else TRAINED_ELSEWHERE
            message = f"`{name}` (line {line}) trains the model: {blocker.what} ({blocker.where}); file left as it is"
        else:
            message = f"the model is trained in `{name}` (line {line}; backward at {backward}) of another module: file left as it is"
        self.left(program.wraps[0], code, message)
        for wrap in program.wraps[1:]:
            self.left(wrap, code, f"kept as DataParallel: the model of line {line} is trained in `{name}` ({backward})")

    def _check_held(self, holder: str) -> None:
        """MGP326 when a loop of this module that trains the held model draws data that is not split here."""
        loaders = self.analysis.loaders
        here = os.path.dirname(os.path.abspath(self.analysis.path))
        held = os.path.relpath(holder, here)
        for loop in loaders.training_loops:
            traces = [trace for trace in loaders.traces if trace.loop is loop]
            if not any(any(step in self.rewritten for step in trace.path) for trace in traces):
                self.left(
                    loop,
                    HELD_DATA_NOT_SPLIT,
                    f"this loop trains the model held in {held}, and its data is not split here: file left as it is "
                    f"(and {held} too)",
                )
        if not loaders.training_loops:
            backward = next((call for call in self.analysis.calls if loaders.is_backward(call)), None)
            if backward is not None:
                self.left(
                    backward,
                    HELD_DATA_NOT_SPLIT,
                    f"this backward pass trains the model held in {held} in no loop over a loader of this module: file "
                    f"left as it is (and {held} too)",
                )

    def _left_without_project(self, program) -> bool:
        """MGP321 when the wrap is held by a function or class whose users no project shows."""
        holder = self._holder(program.wraps[0])
        if holder is not None:
            self.left(
                program.wraps[0],
                NO_PROJECT_ROOT,
                f"no training here: the {_kind(holder)} `{holder.name.value}` hands the model to the code importing "
                "this file, and no project root above it shows that code: file left as it is",
            )
        return holder is not None

    def _handed_to_importers(self, program) -> bool:
        """Report MGP320 when the wrap is held by a function or class that modules of the project import."""
        holder = self._holder(program.wraps[0])
        found = importers(self.analysis.path, holder.name.value) if holder is not None else []
        if not found:
            return False
        if type(holder) is cst.ClassDef and self.options.style == RUNTIME_STYLE:
            # Subclasses in the importing modules that train the model: migrated with this file, or it is left.
            entry = self.analysis.entry_point
            chosen_here = entry is not None and entry.devices is not None
            attribute = _held_attribute(program.wraps[0], self.analysis) if chosen_here else None
            held = held_training(self.analysis.path, holder.name.value, self.options, attribute)
            if held is not None and held.how == "built":
                self._leave_unless_built(program, holder, held)
                return True
            if held is not None:
                if not held.migrates:
                    self.left(
                        program.wraps[0],
                        TRAINED_BY_IMPORTER,
                        f"`{holder.name.value}` hands the model to its subclasses: {held.why}; file left as it is",
                    )
                return True
        if type(holder) is cst.FunctionDef and self._fallback_of_own_paths(holder.name.value, found):
            # Every script that trains the model this builder returns launches its own distributed path, which
            # never takes this DataParallel branch (MGP139 there, DialoGPT's LSP_train.py): it stays as it is.
            self.edits.leave_as_fallback()
            return True
        importer = found[0]
        here = os.path.dirname(os.path.abspath(self.analysis.path))
        where = importer.where(here)
        old = old_loader(importer.path)
        if old is not None:
            self.left(
                program.wraps[0],
                LOADER_ON_OLD_TORCH,
                f"`{holder.name.value}` goes to {where}, whose loader imports torch 0.4's `_DataLoaderIter` "
                f"({old.where(here)}), gone since 1.2: the original cannot run; file left",
            )
            return True
        for wrap in program.wraps:  # every wrap left is named at its own line (MuZero's networks, in two classes)
            own = self._holder(wrap) or holder
            if importer.trains and importer.own_process_group:
                # Its own distributed path (DialoGPT's LSP_train.py): that is what runs this model on several GPUs.
                said = (
                    f"`{own.name.value}` hands the model to {where}, which has its own distributed path "
                    f"(init_process_group, line {importer.own_process_group}): launch that path; file left as it is"
                )
            else:
                said = (
                    f"no training here: the {_kind(own)} `{own.name.value}` hands {self._handed(wrap)} to the modules "
                    f"importing this one ({where}{', which trains' if importer.trains else ''}): migrate there; file left as it is"
                )
            self.left(wrap, TRAINED_BY_IMPORTER, said)
        return True

    def _handed(self, wrap: cst.Call) -> str:
        """What a wrap hands on: the model, or a container of modules that has no forward, so no call runs through
        the wrap (EDSR's ``nn.DataParallel(self.loss_module, ...)``, a ``ModuleList`` of losses that ``Loss.forward``
        calls one by one)."""
        module = wrap.args[0].value if wrap.args and wrap.args[0].keyword is None and not wrap.args[0].star else None
        values = self.analysis.values
        made = values.of(module, values.scope_of(wrap)) if module is not None else []
        kinds = {self.analysis.resolve(value.func) for value in made if type(value) is cst.Call and value is not wrap}
        if made and kinds and kinds <= _CONTAINERS:
            return f"a `{min(kinds).rpartition('.')[2]}` (no forward to run)"
        return "the model"

    def _leave_unless_built(self, program, first: cst.ClassDef, held) -> None:
        """For model classes that keep their own wraps and that the importing modules build (CMC's
        ``MyAlexNetCMC``): the file migrates when every class holding a wrap here migrates with the modules
        building it (``analysis.held``); else each wrap is named at its own line, with its class's reason or with
        the class that keeps the file as it is."""
        verdicts = {first.name.value: held}
        for wrap in program.wraps:
            own = self._holder(wrap)
            if type(own) is cst.ClassDef and own.name.value not in verdicts:
                verdicts[own.name.value] = held_training(self.analysis.path, own.name.value, self.options)
        blocking = next(((name, v) for name, v in verdicts.items() if v is None or not v.migrates), None)
        if blocking is None and all(type(self._holder(wrap)) is cst.ClassDef for wrap in program.wraps):
            return
        for wrap in program.wraps:
            own = self._holder(wrap)
            name = own.name.value if own is not None else first.name.value
            verdict = verdicts.get(name)
            if verdict is not None and not verdict.migrates:
                said = f"`{name}` hands the model to the modules building it: {verdict.why}; file left as it is"
            elif blocking is not None and verdict is not None:
                said = f"`{name}` is built by modules that train it, but `{blocking[0]}` keeps this file as it is"
            else:
                said = (
                    f"no training here: the {_kind(own or first)} `{name}` hands the model to the modules importing this "
                    "one: migrate there; file left as it is"
                )
            self.left(wrap, TRAINED_BY_IMPORTER, said)

    def _fallback_of_own_paths(self, builder: str, found: list) -> bool:
        """Whether the modules importing this one that name ``builder`` and train (a backward pass) all have a
        distributed path of their own that ``--to ddp`` launches from a plain start, with the model ``builder``
        returns as their DataParallel fallback (``analysis.own_path.launches_own_path``)."""
        if self.options.style != RUNTIME_STYLE:
            return False
        trainers = [
            importer
            for importer in found
            if importer.trains and os.path.basename(importer.path)[: -len(".py")].isidentifier() and _names(importer.path, builder)
        ]  # not a copy beside a module (`train.ddp.py`), which no import names
        return bool(trainers) and all(
            importer.own_process_group and launches_own_path(importer.path, self.analysis.path, builder)
            for importer in trainers
        )

    def _holder(self, wrap: cst.Call) -> Optional[cst.FunctionDef | cst.ClassDef]:
        """The function that returns the wrapped model to its callers, or the class whose method keeps it on
        ``self``: what the modules importing this one use to get the model."""
        tree = self.analysis.tree
        function = tree.function(wrap)
        if function is None:
            return None
        cls = next((node for node in tree.ancestors(function) if type(node) is cst.ClassDef), None)
        statement = next((node for node in tree.ancestors(wrap) if type(node) is cst.Assign), None)
        if (
            cls is not None
            and statement is not None
            and any(type(t.target) is cst.Attribute and _is_self_attribute(t.target) for t in statement.targets)
        ):
            return cls
        models = self.analysis.models
        scope = self.analysis.values.scope_of(wrap)
        for returned in contains(function, lambda n: type(n) is cst.Return):
            if returned.value is not None and models.model_sites(returned.value, scope):
                return function
        return None

    def _stays_here(self, call: cst.Call, qualified) -> bool:
        """A call that cannot train the model out of sight: a function of this file (which runs no backward
        pass), torch's, or a builtin."""
        if qualified is None:
            bindings = self.analysis.bindings
            name = call.func.value if type(call.func) is cst.Name else None
            return name in bindings.local or (name in _BUILTINS and name not in bindings.imported)
        return qualified.startswith(("torch.", "builtins.")) or "." not in qualified

    def _trains_anywhere(self, wraps) -> bool:
        """An optimizer made here, or a wrap inside a function that hands the model to its caller."""
        if any((self.analysis.resolve(call.func) or "").startswith("torch.optim.") for call in self.analysis.calls):
            return True
        models = self.analysis.models
        for wrap in wraps:
            function = self.analysis.tree.function(wrap)
            if function is None:
                continue
            scope = self.analysis.values.scope_of(wrap)
            for returned in contains(function, lambda n: type(n) is cst.Return):
                if returned.value is not None and models.model_sites(returned.value, scope):
                    return True
        return False

    def _passes_model(self, call: cst.Call) -> bool:
        scope = self.analysis.values.scope_of(call)
        models = self.analysis.models
        return any(models.model_sites(arg.value, scope) for arg in call.args)


def _held_attribute(wrap: cst.Call, analysis) -> Optional[str]:
    """``model`` of ``self.model = nn.DataParallel(...)``: the attribute a class keeps the wrapped model in."""
    statement = next((node for node in analysis.tree.ancestors(wrap) if type(node) is cst.Assign), None)
    targets = [t.target for t in statement.targets] if statement is not None else []
    named = [t.attr.value for t in targets if type(t) is cst.Attribute and _is_self_attribute(t)]
    return named[0] if len(named) == 1 else None


def _kind(holder: cst.FunctionDef | cst.ClassDef) -> str:
    return "class" if type(holder) is cst.ClassDef else "function"


def _is_self_attribute(target: cst.Attribute) -> bool:
    return type(target.value) is cst.Name and target.value.value == "self"


def _names(path: str, name: str) -> bool:
    """Whether the file at ``path`` names ``name`` (a word of its bytes)."""
    try:
        with open(path, "rb") as handle:
            return re.search(rb"\b" + re.escape(name.encode()) + rb"\b", handle.read(1 << 20)) is not None
    except OSError:
        return False
