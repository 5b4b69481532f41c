"""MGP262: a model wrapped here but trained in code this file does not show (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Review, Rule


INFERENCE_ONLY = Review(
    "MGP263",
    name="evaluation-script",
    summary="an evaluation script (the model runs here; no backward pass, no optimizer): left as DataParallel",
    why=(
        "The file only evaluates (the model runs here, with no backward pass and no optimizer, and goes nowhere "
        "else): one process per GPU would evaluate everything once per process, where DataParallel splits each "
        "batch over the GPUs. The file is left as it is."
    ),
    todo="Nothing; add `# noqa: MGP263` at the wrap to migrate it anyway.",
    veto=True,
    only_evaluates=True,
)
_NO_GRADIENTS = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad"})


TRAINED_ELSEWHERE = Review(
    "MGP262",
    name="trained-elsewhere",
    summary="the model is trained in code this file does not show: its data loader is not distributed",
    why=(
        "This file has no training loop: the wrapped model is trained in code it does not show (a caller, "
        "another module), whose data loader the tool does not distribute. Until it is, every process trains on "
        "whole batches."
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

    A file that only evaluates (its model runs in it, with no backward pass and no optimizer, and goes
    nowhere else), an evaluation or inference script, is left as it is (MGP263): under DDP every process
    would evaluate everything, while DataParallel splits each batch over the GPUs.

    ## Fix safety
    Only the wrap is rewritten (MGP101); the runtime's wrapper calls ``setup()`` when it is built.
    """

    CODE = TRAINED_ELSEWHERE
    PHASE = PROGRAM
    USES = ("loaders", "models")
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
        if not program.migrates or self.analysis.loaders.training_loops:
            return
        escapes = self.analysis.models.model_escapes()
        if self._only_evaluates(program, escapes):
            for wrap in program.wraps:  # each wrap stays: each says why
                self._left_for_evaluation(wrap)
            return
        for wrap in program.wraps:  # once per file: the advice is the same for every wrap
            site = self.analysis.models.site_of(wrap)
            where = self.analysis.models.after_wrap(site, escapes.get(site, [])) if site is not None else None
            if not where:
                continue
            others = len(program.wraps) - 1
            self.left(
                wrap,
                TRAINED_ELSEWHERE,
                f"no training loop here: the model goes to {where[0].what}"
                f"{f' (and {others} other wrapped model(s) elsewhere)' if others else ''}; distribute its training "
                "loader there",
            )
            return

    def _left_for_evaluation(self, wrap: cst.Call) -> None:
        self.left(
            wrap,
            INFERENCE_ONLY,
            "this file only evaluates (no backward pass, no optimizer): left as DataParallel, which splits each batch",
        )

    def _run_without_gradients(self, sites) -> set:
        """The sites whose every forward call runs under ``torch.no_grad()`` / ``inference_mode()``: their outputs
        hold no graph, so no code they go to (``np.argsort``, a plot) can train the model through them."""
        calls: dict = {}
        for call, _, found in self.analysis.models.model_calls():
            for site in found & sites:
                calls.setdefault(site, []).append(call)
        return {site for site, forwards in calls.items() if all(self._without_gradients(call) for call in forwards)}

    def _without_gradients(self, node: cst.CSTNode) -> bool:
        for ancestor in self.analysis.tree.ancestors(node):
            if type(ancestor) is cst.With and any(
                type(item.item) is cst.Call and self.analysis.resolve(item.item.func) in _NO_GRADIENTS
                for item in ancestor.items
            ):
                return True
        return False

    def _only_evaluates(self, program, escapes) -> bool:
        """The model runs in this file, nothing here trains (no backward pass, no optimizer built), and no
        wrapped model goes to code elsewhere."""
        models = self.analysis.models
        sites = {models.site_of(wrap) for wrap in program.wraps} - {None}
        outputs_escape = models.output_escapes()
        graphless = self._run_without_gradients(sites)
        if any(escapes.get(site) or (outputs_escape.get(site) and site not in graphless) for site in sites):
            return False  # the model or its outputs (with their graph) go to code that may train them
        index = models.index
        if any(
            not index.call_sites(function) and models.derived_sites(value, scope) & sites
            for function, value, scope in index.returns
        ):
            return False  # a step function returns a loss (or outputs) to a caller elsewhere
        if not any(found & sites for _, _, found in models.model_calls()):
            return False  # a module that builds the model: it runs elsewhere
        calls = self.analysis.calls
        return not any(
            self.analysis.loaders.is_backward(call)
            or (self.analysis.resolve(call.func) or "").startswith("torch.optim.")
            for call in calls
        )
