"""MGP280/MGP281: the project's own DataParallel (a subclass in another module, or one written by hand)."""

from __future__ import annotations

import ast

import libcst as cst

from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.hand_written import data_parallel_by_hand
from mgpu_migrate.analysis.project import Project, project_of
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import BALANCED, CHECKS, DDP, RUNTIME_STYLE, Example, Review, Rule

PROJECT_DATA_PARALLEL = Review(
    "MGP280",
    name="project-data-parallel",
    summary="a DataParallel subclass of the project's own, defined in another module: not migrated",
    why=(
        "The wrap is the project's own subclass of DataParallel, defined in another module of the project (a "
        "CornerNet-style `DataParallel(chunk_sizes=...)`, a vendored sync-BN wrapper). It scatters, gathers or "
        "replicates its own way, which neither the balanced runtime nor DistributedDataParallel reproduces. "
        "Under --to ddp the whole file is left as it is."
    ),
    todo=(
        "Use `nn.DataParallel` at this site if the subclass adds nothing the training needs, then run the tool "
        "again; otherwise migrate the subclass's callers by hand."
    ),
    veto=True,
)
HAND_WRITTEN = Review(
    "MGP281",
    name="hand-written-data-parallel",
    summary="DataParallel written by hand (replicate + parallel_apply): not migrated",
    why=(
        "The model is run over devices by hand (`replicate`, `scatter`, `parallel_apply`, `gather`), in this "
        "file or in a project helper it calls. The tool rewrites torch's DataParallel, not its pieces. Under "
        "--to ddp the whole file is left as it is."
    ),
    todo=(
        "Replace the hand-written helper with `nn.DataParallel(model)`, then run the tool again; or migrate "
        "by hand."
    ),
    veto=True,
)
_REPLICATE = frozenset({"torch.nn.parallel.replicate", "torch.nn.parallel.replicate.replicate"})
_PARALLEL_APPLY = frozenset({"torch.nn.parallel.parallel_apply", "torch.nn.parallel.parallel_apply.parallel_apply"})


class ProjectWrappers(Rule):
    """
    ## What it does
    Reports each call of the project's own DataParallel, found by reading the module the file imports it
    from (``from utils.utils import CustomDataParallel``): a class deriving from torch's ``DataParallel``
    (a CornerNet-style ``DataParallel(chunk_sizes=...)``, YOLACT's ``CustomDataParallel``, a vendored
    sync-BN ``DataParallelWithCallback``, a copy of PyTorch-Encoding's pair), or a function that replicates
    the model and applies the copies by hand (``replicate`` + ``parallel_apply``), called here or defined here.
    Under ``--to ddp`` the file is then left as it is (under ``--to balanced`` a subclass is rebased on the
    runtime's wrapper in its own file, or MGP210 says there why not).

    ## Why is this bad?
    Such a wrapper scatters, gathers or reduces its own way (uneven chunk sizes, dropped remainders, losses
    computed per device and averaged with equal weights), which no runtime wrapper reproduces by its name;
    before, the tool left it without a word, and the rest of the file was migrated around it.

    ## Example
    ```python
    from utils.utils import CustomDataParallel   # class CustomDataParallel(nn.DataParallel) in utils/utils.py
    model = CustomDataParallel(model, num_gpus)
    ```

    ## Use instead
    Replace the wrapper with ``nn.DataParallel`` where its own scatter and gather are not needed, then run
    the tool again; otherwise migrate it by hand.

    ## Fix safety
    Nothing is rewritten (under ``--to ddp``, in the whole file: a file migrates entirely or not at all).
    """

    CODE = PROJECT_DATA_PARALLEL
    PHASE = CHECKS
    USES = ("bindings",)
    REVIEW_CODES = (PROJECT_DATA_PARALLEL, HAND_WRITTEN)
    DESCRIPTION = "the project's own DataParallel classes and hand-written replicate/parallel_apply reported"
    TARGETS = (BALANCED, DDP)
    EXAMPLES = (
        Example(
            """
            from torch.nn.parallel import replicate, parallel_apply


            def forward(module, inputs, devices):  # DataParallel by hand
                replicas = replicate(module, devices)
                return parallel_apply(replicas, inputs)
            """,
            None,
            BALANCED,
            (HAND_WRITTEN,),
        ),
        Example(
            """
            from torch.nn.parallel import replicate, parallel_apply


            def forward(module, inputs, devices):  # DataParallel by hand
                replicas = replicate(module, devices)
                return parallel_apply(replicas, inputs)
            """,
            None,
            DDP,
            (HAND_WRITTEN,),
        ),
    )

    def apply(self) -> None:
        project = project_of(self.analysis.path)
        replicated = False
        for call in self.analysis.calls:
            qualified = self.analysis.resolve(call.func)
            if qualified is None:
                # A name imported two ways (`try: from jactorch... import X` / `except: from .replicate import X`):
                # the project's own copy is one of them.
                if project is not None and type(call.func) is cst.Name:
                    for origin in sorted(self.analysis.bindings.imported.get(call.func.value, ())):
                        if origin.split(".")[0].lstrip(".") not in names.NOT_THE_PROJECT and self._project_call(project, call, origin):
                            break
                continue
            if qualified in _REPLICATE and not replicated and self._applies_in_same_function(call) and not self._rewritten(call):
                replicated = True
                self.left(
                    call,
                    HAND_WRITTEN,
                    "DataParallel written by hand (replicate, then parallel_apply): not migrated; use nn.DataParallel "
                    "here, then run the tool again",
                )
            elif project is not None and qualified.split(".")[0].lstrip(".") not in names.NOT_THE_PROJECT:
                self._project_call(project, call, qualified)

    def _rewritten(self, call: cst.Call) -> bool:
        """The function holding ``call`` is torch's data_parallel by hand, whose body MGP107 replaced."""
        function = self.analysis.tree.function(call)
        return function is not None and function.body in self.rewritten

    def _applies_in_same_function(self, call: cst.Call) -> bool:
        function = self.analysis.tree.function(call)
        return any(
            self.analysis.resolve(other.func) in _PARALLEL_APPLY and self.analysis.tree.function(other) is function
            for other in self.analysis.calls
        )

    def _project_call(self, project: Project, call: cst.Call, qualified: str) -> bool:
        """Report a call of the project's own DataParallel; whether it was one."""
        if "parallel" not in qualified.rpartition(".")[2].lower():
            # A copy of DataParallel goes by a name that says so (the pre-filter counts on it too); reading the
            # project's modules behind every other call made a tree check of a large repository 2x slower.
            return False
        canonical = self.analysis.bindings.canonical(qualified)
        if qualified in names.MIGRATED_NAMES or canonical in names.MIGRATED_NAMES:
            return False  # a vendored copy the tool recognizes and migrates itself
        if canonical == names.CALLBACK_DATA_PARALLEL and self.analysis.resolve(call.func) == canonical:
            head = call.func.value if type(call.func) is cst.Name else None
            origins = self.analysis.bindings.imported.get(head, set()) if head is not None else set()
            origin = next(iter(origins)) if len(origins) == 1 else None
            if self.target == BALANCED and origin is not None and project.find(origin) is None:
                # SPADE's models/networks/sync_batchnorm, a submodule its checkout lacks: nothing here to rebase
                self.left(
                    call,
                    PROJECT_DATA_PARALLEL,
                    f"`DataParallelWithCallback`'s `{shorten(origin.rpartition('.')[0], 40)}` is not in this checkout: copy "
                    "the package in, then run the tool again",
                )
                return True
            return False  # the Synchronized-BatchNorm package's: a wrap site (MGP101, MGP109), rebased under balanced
        found = project.find(qualified)
        if found is None:
            return False
        # Under --to balanced the subclass's own file rebases it on the runtime's wrapper, or says why not; under
        # --to ddp too when it overrides only what the runtime's DistributedDataParallel calls (a call of it is then
        # a wrap site here, rewritten as it is: MGP106).
        if call in self.rewritten:
            return True  # a wrap site: its module rebases the class (MGP106)
        if self.target == DDP and project.data_parallel_base(found) is not None:
            self.left(
                call,
                PROJECT_DATA_PARALLEL,
                f"`{found.name}` ({found.where}) is the project's own DataParallel subclass: not migrated; use "
                "nn.DataParallel here",
            )
            return True
        if project.hand_written_data_parallel(found):
            by_hand = isinstance(found.node, ast.FunctionDef) and data_parallel_by_hand(found.node, found.module.qualified)
            if by_hand and (self.target == BALANCED or self.options.style == RUNTIME_STYLE):
                return True  # its own module calls the runtime's data_parallel instead (MGP107)
            self.left(
                call,
                HAND_WRITTEN,
                f"`{found.name}` ({found.where}) is DataParallel written by hand: not migrated; use nn.DataParallel "
                "instead, then run the tool again",
            )
            return True
        return False
