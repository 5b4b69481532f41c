"""MGP262: a model wrapped here but trained in code this file does not show (``--to ddp``)."""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.held import held_training
from mgpu_migrate.analysis.project import project_of
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, Example, Review, Rule


INFERENCE_ONLY = Review(
    "MGP263",
    name="evaluation-script",
    summary="a script that does not train (no backward pass, no optimizer step): left as DataParallel",
    why=(
        "Nothing in the file trains (no backward pass, no optimizer step), and the model stays in it: the script "
        "evaluates it (runs it here, or hands it to a test function or an evaluator engine out of sight), or only "
        "loads and writes its weights (a checkpoint converter). One process per GPU would do all of that once per "
        "process, every process writing the same files, where DataParallel splits each batch over the GPUs. The "
        "file is left as it is."
    ),
    todo="Nothing; add `# noqa: MGP263` at the wrap to migrate it anyway.",
    veto=True,
    only_evaluates=True,
)


TRAINED_ELSEWHERE = Review(
    "MGP262",
    name="trained-elsewhere",
    summary="the model is trained in code this file does not show, or from data it cannot follow: its data loader is not distributed",
    why=(
        "This file has no training loop the tool can read: the wrapped model is trained in code it does not show "
        "(a caller, another module), or in a loop of this file whose data it cannot follow to a DataLoader (a "
        "`while True:` loop drawing `loader.get_batch('train')` from the project's own loader), so the tool does "
        "not distribute that data. Until it is, every process loads whole batches; the runtime's wrapper runs each "
        "process's rows of them, so the training is the original's, only the loading is repeated."
    ),
    todo="Pass the training DataLoader through `mgpu_runtime.distribute_loader(...)` where it is built.",
    accounts_for_data=True,
)


class RemoteTraining(Rule):
    """
    ## What it does
    Reports a wrap whose model is trained elsewhere: the file has no loop that calls ``.backward()``, and
    the wrapped model goes to code outside the file (returned by a builder such as ``build_model()``,
    handed to a trainer). It rewrites nothing beyond the wrap itself.

    ## Why is this bad?
    The migration splits each batch across the processes by passing the training ``DataLoader`` through
    ``mgpu_runtime.distribute_loader``, which it can only do where it sees the loop. The file that trains
    has no DataParallel in it, so the tool does not rewrite it: until someone does, every process trains
    on whole batches. That matches the original only if every process draws the same batches (the
    runtime stops the first optimizer step when they differ), and is never faster.

    ## Example
    ```python
    def build_model(cfg):
        return nn.DataParallel(Net(cfg))
    ```

    ## Use instead
    ```python
    def build_model(cfg):
        return mgpu_runtime.DistributedDataParallel(Net(cfg))

    # in the file with the training loop:
    loader = mgpu_runtime.distribute_loader(DataLoader(dataset, batch_size=256, shuffle=True))
    ```

    A script that does not train (no backward pass, no optimizer step) and keeps the model to itself, whether it
    runs the model (an evaluation, a demo), hands it to a function or engine out of sight (``test(model,
    loader)``, ``create_supervised_evaluator(model)``), or only loads and writes its weights (a checkpoint
    converter), is left as it is (MGP263): under DDP every process would do all the work and write the same
    files, while DataParallel splits each batch over the GPUs.

    ## Fix safety
    Only the wrap is rewritten (MGP101); the runtime's wrapper calls ``setup()`` when it is built.
    """

    CODE = TRAINED_ELSEWHERE
    PHASE = PROGRAM
    USES = ("entry_point", "handed", "loaders", "models", "values")
    REVIEW_CODES = (TRAINED_ELSEWHERE, INFERENCE_ONLY)
    DESCRIPTION = "wraps whose training loop is in another file reported"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch
            import torch.nn as nn

            model = nn.DataParallel(model)
            with torch.no_grad():
                for x in loader:
                    print(model(x).argmax(1))
            """,
            None,
            DDP,
            ("MGP263",),
        ),
        Example(
            """
            import sys

            import torch
            import torch.nn as nn

            model = nn.DataParallel(Net())
            model.load_state_dict(torch.load(sys.argv[1]))
            torch.save(model.module.state_dict(), sys.argv[2])
            """,
            None,
            DDP,
            ("MGP263",),
            message="does not train or run the model (it loads or saves its weights",
            line=6,
            name="a checkpoint converter",
        ),
        Example(
            """
            import torch

            if __name__ == "__main__":
                net = Net()
                net.load_pretrained_model(model_path="caffe/net.caffemodel")
                net.eval()
                net = torch.nn.DataParallel(net, device_ids=range(torch.cuda.device_count()))
                torch.save({"model_state": net.state_dict()}, "checkpoints/net.pth")
            """,
            None,
            DDP,
            ("MGP263",),
            message="does not train or run the model (it loads or saves its weights",
            line=7,
            name="a wrap only to save the keys prefixed module.",
        ),
        Example(
            """
            import torch
            import torch.nn as nn
            from ignite.engine import Engine


            def create_supervised_evaluator(model, metrics):
                if torch.cuda.device_count() > 1:
                    model = nn.DataParallel(model)

                def _inference(engine, batch):
                    with torch.no_grad():
                        data, pids = batch
                        return model(data), pids

                engine = Engine(_inference)
                for name, metric in metrics.items():
                    metric.attach(engine, name)
                return engine
            """,
            None,
            DDP,
            ("MGP263",),
            message="this file only evaluates (no backward pass, no optimizer step)",
            line=8,
            name="an evaluator engine's step handed to the engine here",
        ),
        Example(
            """
            import torch
            import eval_utils

            dp_model = torch.nn.DataParallel(model)
            dp_lw_model = torch.nn.DataParallel(lw_model)
            while True:
                data = loader.get_batch("train")
                loss = dp_lw_model(data["fc_feats"], data["labels"]).mean()
                loss.backward()
                optimizer.step()
                if iteration % 100 == 0:
                    val_loss = eval_utils.eval_split(dp_model, loader)
            """,
            """
            import eval_utils
            import mgpu_runtime

            dp_model = mgpu_runtime.DistributedDataParallel(model)
            dp_lw_model = mgpu_runtime.DistributedDataParallel(lw_model)
            while True:
                data = loader.get_batch("train")
                loss = dp_lw_model(data["fc_feats"], data["labels"]).mean()
                loss.backward()
                optimizer.step()
                if iteration % 100 == 0:
                    val_loss = eval_utils.eval_split(dp_model, loader)
            """,
            DDP,
            ("MGP101", TRAINED_ELSEWHERE),
            message="the training here (`loss.backward()`, line 9) draws data the tool does not follow to a DataLoader",
            line=4,  # the first wrap's line
            name="a while loop that trains from data not followed, beside a model only evaluated",
        ),
        Example(
            """
            import torch.nn as nn
            from evaluation_kit import test

            model = nn.DataParallel(Net()).cuda()
            print(test(model, test_loader))
            """,
            None,
            DDP,
            ("MGP263",),
            message="the model goes to `test(...)`): left as DataParallel, one process",
            line=4,
            name="a test function out of sight",
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(Net())
            trainer.fit(model)
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(Net())
            trainer.fit(model)
            """,
            DDP,
            ("MGP101", "MGP262"),
            message="no training loop here: the model goes to `trainer.fit(...)`",
            line=3,
            name="a trainer out of sight trains it",
        ),
        Example(
            """
            import torch.nn as nn


            def build_model(cfg):
                return nn.DataParallel(Net(cfg))
            """,
            """
            import mgpu_runtime


            def build_model(cfg):
                return mgpu_runtime.DistributedDataParallel(Net(cfg))
            """,
            DDP,
            ("MGP101", "MGP262"),
        ),
    )

    def apply(self) -> None:
        program = self.program
        if not program.migrates or self.analysis.loaders.training_loops or self.analysis.handed.migrating:
            return  # trained here, or in the project's code, whose data this file hands it and splits (MGP122)
        escapes = self.analysis.models.model_escapes()
        sites = [site for site in map(self.analysis.models.site_of, program.wraps) if site is not None]
        if sites and all(self._trained_by_subclasses(site) for site in sites):
            return  # the subclasses that train it migrate with this file, their loaders split (MGP122 there)
        if self._does_not_train(sites, escapes):
            said = self._what_it_does(sites, escapes)
            for wrap in program.wraps:  # each wrap stays: each says why
                self.left(wrap, INFERENCE_ONLY, said)
            return
        backward = self._unfollowed_backward()
        for wrap in program.wraps:  # once per file: the advice is the same for every wrap
            site = self.analysis.models.site_of(wrap)
            where = self.analysis.models.after_wrap(site, escapes.get(site, [])) if site is not None else None
            if not where:
                continue
            if backward is not None:
                # self-critical's `while True:` loop over `loader.get_batch('train')`: it trains here, from data the
                # loop analysis does not follow; the wrap that goes elsewhere is only what the first wrap does.
                line = self.analysis.position(backward)[0]
                self.left(
                    wrap,
                    TRAINED_ELSEWHERE,
                    f"the training here (`{shorten(self.analysis.code_of(backward), 24)}`, line {line}) draws data the tool "
                    "does not follow to a DataLoader: not split, every process loads whole batches",
                )
                return
            others = len(program.wraps) - 1
            self.left(
                wrap,
                TRAINED_ELSEWHERE,
                f"no training loop here: the model goes to {self._the_training_one(where).what}"
                f"{f' (and {others} other wrapped model(s) elsewhere)' if others else ''}; distribute its training "
                "loader there",
            )
            return

    def _the_training_one(self, where: list) -> object:
        """Of the calls the model goes to after its wrap, the first that runs a project function that trains
        (Teacher-free KD's ``train_and_evaluate_kd(...)``, after ``utils.load_checkpoint(...)``), else the first."""
        project = project_of(self.analysis.path)
        for escape in where if project is not None else ():
            qualified = self.analysis.resolve(escape.node.func) if type(escape.node) is cst.Call else None
            found = project.find(qualified) if qualified and not qualified.startswith(("torch.", "builtins.")) else None
            if found is not None and project.trains_through(found) is not None:
                return escape
        return where[0]

    def _unfollowed_backward(self) -> Optional[cst.Call]:
        """A backward pass of this file in a loop (``while True:``) that is no training loop the analysis reads."""
        tree = self.analysis.tree
        for call in self.analysis.calls:
            if self.analysis.loaders.is_backward(call) and any(type(node) in (cst.While, cst.For) for node in tree.ancestors(call)):
                return call
        return None

    def _what_it_does(self, sites, escapes) -> str:
        if self._runs_here(sites):
            return "this file only evaluates (no backward pass, no optimizer step): left as DataParallel, which splits each batch"
        gone = [escape for site in sites for escape in escapes.get(site, [])]
        if gone:
            return (
                f"this file does not train (no backward pass, no optimizer step; the model goes to {gone[0].what}): left as "
                "DataParallel, one process"
            )
        return "this file does not train or run the model (it loads or saves its weights; no backward pass, no optimizer step): left as DataParallel"

    def _does_not_train(self, sites, escapes) -> bool:
        """Nothing here trains (no backward pass, no optimizer that steps); the model stays in this program (it is not
        returned to callers or kept by a class for its importers: MGP262 and MGP320 say where it goes), and
        neither it nor its outputs go to the project's own code (MGP285 or MGP286 say what that code does); and
        the program does something with it: runs it, hands it to a function out of sight (``test(model,
        loader)``, an ignite evaluator), or loads weights into it (a checkpoint converter). Then the file
        evaluates, converts or exports the model, and one process does that best."""
        analysis = self.analysis
        if not sites or any(analysis.loaders.is_backward(call) for call in analysis.calls) or self._optimizes():
            return False
        models = analysis.models
        index = models.index
        returned = {value for _, value, _ in index.returns}
        if any(self._held(site) for site in sites) or any(
            escape.node in returned for site in sites for escape in escapes.get(site, [])
        ):
            return False
        if any(
            not index.call_sites(function) and not (function is not None and self._handed_on(function)) and models.derived_sites(value, scope) & set(sites)
            for function, value, scope in index.returns
        ):
            return False  # a step function returns a loss (or outputs) to a caller elsewhere, not to an engine here
        project = project_of(analysis.path)
        outputs = models.output_escapes()
        for site in sites:
            for escape in [*escapes.get(site, []), *outputs.get(site, [])]:
                qualified = analysis.resolve(escape.node.func) if type(escape.node) is cst.Call else None
                found = project.find(qualified) if project is not None and qualified else None
                if found is None:
                    continue
                if escape in escapes.get(site, []) or project.trains_through(found) is not None:
                    return False  # the project's own code: ProjectTraining reads it
                # (its outputs handed to a project function that trains nothing: WS-DAN's eval.py crops the images by
                # the attention maps with utils.batch_augment, then runs the model again)
        if any(_trains_by_name(escape.node) for site in sites for escape in escapes.get(site, [])):
            return False  # trainer.fit(model), train(model, loader): the training is out of sight, not absent
        handed = any(escapes.get(site) for site in sites)
        return self._runs_here(sites) or handed or self._loads_weights(sites)

    def _optimizes(self) -> bool:
        """Whether an optimizer made here (``torch.optim.*``) may train: something here steps (``.step()``), or the
        optimizer goes to a call other than torch.optim's own (a training function out of sight). One made only to
        load its state from a checkpoint (pytorch-pose's ``convert_checkpoint.py``) trains nothing."""
        analysis = self.analysis
        made = [call for call in analysis.calls if (analysis.resolve(call.func) or "").startswith("torch.optim.")]
        if not made:
            return False
        if any(type(call.func) is cst.Attribute and call.func.attr.value == "step" for call in analysis.calls):
            return True
        names = set()
        for call in made:
            parent = analysis.tree.parent(call)
            if type(parent) is cst.Assign and all(type(target.target) is cst.Name for target in parent.targets):
                names.update(target.target.value for target in parent.targets)
            else:
                return True  # kept somewhere the reading does not follow
        for call in analysis.calls:
            if call in made or (analysis.resolve(call.func) or "").startswith("torch.optim."):
                continue
            for arg in call.args:
                if any(type(node) is cst.Name and node.value in names for node in _names_in(arg.value)):
                    return True
        return False

    def _runs_here(self, sites) -> bool:
        """A forward call of the model at module level, in a function this file calls, or in one it hands on to
        be called (reid-strong-baseline's ``Engine(_inference)``, an ignite evaluator's step)."""
        tree, index = self.analysis.tree, self.analysis.models.index
        for call, _, found in self.analysis.models.model_calls():
            function = tree.function(call)
            if found & set(sites) and (function is None or index.call_sites(function) or self._handed_on(function)):
                return True
        return False

    def _handed_on(self, function: cst.FunctionDef) -> bool:
        """``function`` given by name to a call of its own scope (``Engine(_inference)``)."""
        tree = self.analysis.tree
        scope = tree.parent(tree.parent(function))  # the block, then the function or module it is defined in
        name = function.name.value
        return any(
            type(arg.value) is cst.Name and arg.value.value == name
            for call in self.analysis.calls
            for arg in call.args
            if scope is not None and any(ancestor is scope for ancestor in tree.ancestors(call))
        )

    def _loads_weights(self, sites) -> bool:
        """``model.load_state_dict(...)`` (or ``model.module.load_state_dict``) on a wrapped model, or
        ``model.state_dict()`` of a wrapper never taken off (no ``model.module``): a converter that wraps only to save
        the keys prefixed ``module.`` (pytorch-semseg's ``__main__`` blocks of its model modules, which convert caffe
        weights)."""
        models = self.analysis.models
        unwrapped = self._unwrapped(sites)
        for call in self.analysis.calls:
            if type(call.func) is not cst.Attribute or call.func.attr.value not in ("load_state_dict", "state_dict"):
                continue
            if call.func.attr.value == "state_dict" and unwrapped:
                continue  # a program that takes the wrapper off is no converter saving the wrapper's keys
            owner = call.func.value
            if type(owner) is cst.Attribute and owner.attr.value == "module":
                owner = owner.value
            if models.model_sites(owner, self.analysis.values.scope_of(call)) & set(sites):
                return True
        return False

    def _unwrapped(self, sites) -> bool:
        """``model.module`` read anywhere of a wrapped model."""
        models, values = self.analysis.models, self.analysis.values
        return any(
            node.attr.value == "module" and models.model_sites(node.value, values.scope_of(node)) & set(sites)
            for node in self.analysis.tree.nodes(cst.Attribute)
        )
    def _trained_by_subclasses(self, site) -> bool:
        """The model is kept on ``self`` by a class whose subclasses in the project's other modules train it and
        migrate with this file (``analysis.held``: st-gcn's ``IO``, trained by ``REC_Processor``)."""
        if not self._held(site) or self.options.style != RUNTIME_STYLE:
            return False
        tree = self.analysis.tree
        function = tree.function(site.call)
        cls = next(node for node in tree.ancestors(function) if type(node) is cst.ClassDef)
        entry = self.analysis.entry_point
        kept = [
            target.attr.value
            for target, _ in self.analysis.models.assigned_to(site)
            if type(target) is cst.Attribute and type(target.value) is cst.Name and target.value.value == "self"
        ]
        attribute = kept[0] if entry is not None and entry.devices is not None and len(kept) == 1 else None
        held = held_training(self.analysis.path, cls.name.value, self.options, attribute)
        return held is not None and held.migrates

    def _held(self, site) -> bool:
        """The wrapped model is kept on ``self`` by a method of a class: the class's users run it."""
        tree = self.analysis.tree
        function = tree.function(site.call)
        if function is None or not any(type(node) is cst.ClassDef for node in tree.ancestors(function)):
            return False
        return any(
            type(target) is cst.Attribute and type(target.value) is cst.Name and target.value.value == "self"
            for target, _ in self.analysis.models.assigned_to(site)
        )


_TRAINING_WORDS = re.compile(r"(^|_)(fit|train|training|trainer)(_|$)", re.I)


def _trains_by_name(node: cst.CSTNode) -> bool:
    """A call whose name says it trains what it is given (``trainer.fit(model)``, ``train(model, loader)``,
    ``engine.train_epoch(...)``, ``Trainer(model)``): the model goes to a training loop out of sight."""
    if type(node) is not cst.Call:
        return False
    names = []
    func = node.func
    while type(func) is cst.Attribute:
        names.append(func.attr.value)
        func = func.value
    if type(func) is cst.Name:
        names.append(func.value)
    return any(_TRAINING_WORDS.search(name) for name in names)


def _names_in(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``node`` and the expressions inside it that may be a name handed on (a tuple or list of them, a keyword)."""
    if type(node) in (cst.Tuple, cst.List):
        return [inner for element in node.elements for inner in _names_in(element.value)]
    return [node]
