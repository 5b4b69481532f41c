"""MGP285: the model is trained in another module of the project, whose data the tool cannot split from here."""

from __future__ import annotations

import builtins
import os
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.project import importers, project_of
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.rules.base import CHECKS, DDP, Example, Review, Rule

TRAINED_ELSEWHERE = Review(
    "MGP285",
    name="trained-elsewhere",
    summary="the model is trained in another module of the project: file left as it is",
    why=(
        "The model wrapped here is trained in another module of the project (a `Trainer` class that calls "
        "`backward`). Its data, loss and saves are there, and a migration of the wrap alone would give every "
        "process whole batches and the same checkpoint files. The file is left as it is."
    ),
    todo=(
        "Migrate the module that trains the model together with this one, or use `--to balanced`, which keeps "
        "one process."
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
        "would give a program whose every process trains on whole batches."
    ),
    todo=(
        "Migrate the module that trains: split its loader with `mgpu_runtime.distribute_loader`, make its loss "
        "exact, and wrap the model there (or migrate this wrap by hand together with it); or use "
        "`--to balanced`, which keeps one process."
    ),
    veto=True,
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
_BUILTINS = frozenset(dir(builtins))


class ProjectTraining(Rule):
    """
    ## What it does
    When a file wraps a model but runs no backward pass itself, follows the model into the project's own
    modules: a call here that hands it to a function or class of another module (``Trainer(model,
    criterion)`` from ``reid/trainers.py``, ``scan_train(loader, model, ...)`` from ``utils/train_utils.py``)
    whose code, or a project class it derives from, runs the backward pass. The file is then left as it is,
    and the diagnostic names the definition that trains (MGP285). When the model only goes to project code
    that runs no backward pass (``fill_memory_bank(loader, model, bank)``) or to this file's functions, and
    no optimizer is made here, the file evaluates: it is left as DataParallel (MGP286). When the wrap is in
    a function that returns the model (``load_model()``) or in a class that holds it (``self.model =
    DataParallel(...)`` in a wrapper ``nn.Module``), the model goes to the modules that import this one, which
    a bounded byte search of the project finds: the file is left, and the diagnostic names the importer that
    uses the function or class (MGP320). Such a file with no project root above it and no importer beside it
    (a lone file in a scratch folder) is left too, since nothing shows who trains the model (MGP321).

    ## Why is this bad?
    The training step, its loss and the loop over the data are in that module: the tool cannot tell from
    here how the batches are drawn, whether the loss compares rows of the batch (batch-hard triplets, OHEM),
    or what is saved and logged there. Migrating the wrap alone gives a program whose every process trains
    on whole batches, which the runtime stops at its first step, or that trains differently.

    ## Example
    ```python
    from reid.trainers import Trainer   # Trainer.train(...) runs loss.backward()
    model = nn.DataParallel(model).cuda()
    trainer = Trainer(model, criterion)
    ```

    ## Use instead
    Migrate with ``--to balanced`` (one process, exact for every loss), or migrate the training module
    by hand: split its loader with ``mgpu_runtime.distribute_loader`` and make its loss exact.

    ## Fix safety
    Nothing is rewritten, in the whole file: ``--to ddp`` migrates a file entirely or not at all.
    """

    CODE = TRAINED_ELSEWHERE
    PHASE = CHECKS
    USES = ("bindings", "loaders", "models", "values")
    REVIEW_CODES = (TRAINED_BY_IMPORTER, TRAINED_ELSEWHERE, EVALUATED_ELSEWHERE, NO_PROJECT_ROOT)
    DESCRIPTION = "models handed to the project's training code in other modules keep the file off DDP"
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
        if not program.migrates or any(self.analysis.loaders.is_backward(call) for call in self.analysis.calls):
            return
        project = project_of(self.analysis.path)
        if project is None:  # text that is no file (stdin): nothing to read
            return
        evaluated = []  # the project's functions that get the model and do not train it
        unknown = False  # a call out of sight (a library's) gets the model
        passed = False
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
            where = f"{trainer.where.rpartition(':')[0]}:{project.backward_line(trainer)}"
            self.left(
                program.wraps[0],
                TRAINED_ELSEWHERE,
                f"the model is trained in `{found.name}` (line {self.analysis.position(call)[0]}; backward at {where}) "
                "of another module: file left as it is",
            )
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
        where = found[0].where(os.path.dirname(os.path.abspath(self.analysis.path)))
        self.left(
            program.wraps[0],
            TRAINED_BY_IMPORTER,
            f"no training here: the {_kind(holder)} `{holder.name.value}` hands the model to the modules importing this "
            f"one ({where}{', which trains' if found[0].trains else ''}): migrate there; file left as it is",
        )
        return True

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


def _kind(holder: cst.FunctionDef | cst.ClassDef) -> str:
    return "class" if type(holder) is cst.ClassDef else "function"


def _is_self_attribute(target: cst.Attribute) -> bool:
    return type(target.value) is cst.Name and target.value.value == "self"
