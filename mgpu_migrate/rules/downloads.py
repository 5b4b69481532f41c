"""MGP137, MGP336: datasets and files downloaded once, by the main process first (``--to ddp``)."""

from __future__ import annotations

import ast
import os
import re
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.guards import main_process_caller, under_main_process_block
from mgpu_migrate.analysis.project import DOWNLOADERS, Found, Project, project_download, project_of
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, gives_download, through_runtime

_NO_RUNTIME = "--style torch has no runtime to download with first"
_MESSAGE = 160  # the most characters of a message (one short line)
# The modules before a qualified name (`torchvision.datasets.` of `torchvision.datasets.CIFAR10`), not quoted.
_LEADING_MODULES = re.compile(r"^(?:\w+\.)+")

DOWNLOADED_BY_EVERY_PROCESS = Review(
    "MGP336",
    name="download-on-every-process",
    summary="every process downloads the same files into the same place at once",
    why=(
        "A dataset built with `download=True`, or a file fetched with `download_url` / `urlretrieve`, is "
        "downloaded by every process at the same moment, into the same path: the processes write the same "
        "archive at once, and one extracts or reads a file another is still writing (a failed checksum, a "
        "truncated file). The original's one process downloaded it once. The tool builds such a dataset on the "
        "main process first (MGP137) and fetches a file on the main process only; this one is another shape "
        "(a fetched file's result used, or `--style torch`, which has no runtime)."
    ),
    todo=(
        "Download on the main process first: `if dist.get_rank() == 0: build()`, then `dist.barrier()`, then "
        "build on the other processes (they find the files there)."
    ),
)


class Downloads(Rule):
    """
    ## What it does
    In a file that becomes a distributed program, makes what the original downloaded once be downloaded once:

    - a call given ``download=`` (a torchvision dataset, ``CIFAR10(root, download=True)``; a project's dataset or
      factory) becomes ``mgpu_runtime.main_process_first(CIFAR10, root, download=True)``: the main process builds
      it first, downloading and extracting what is missing, while the others wait; then they build it from the
      files it left, as a second run of the original would;
    - a call of a project function that downloads so (``get_train_dataset(p)``, which builds ``CIFAR10(...,
      download=True)`` in ``utils/``, found by project reading) is made the same way; so is the construction of a
      project class whose ``__init__`` defaults to ``download=True`` (open-reid's ``Market1501(root)``), not
      given ``download=False``, also reached through a module-level dict of such classes (open-reid's
      ``datasets.create(name, root)``, which builds ``__factory[name](root)``);
    - so is the construction of a project class that writes only what it finds missing (``Project.made_when_missing``:
      pytorch-pose's dataset caching its images' mean unless the cache file exists; dgcnn's ``ModelNet40``, whose
      loader makes its data directory and runs ``wget``/``unzip`` unless they exist), also one picked from a project
      module's names (pytorch-pose's ``datasets.__dict__[args.dataset](...)``, when every class or function there
      writes so, or writes nothing): the main process writes what is missing, the others find it;
    - a library fetch that is a statement of its own (torchvision's ``download_url``, ``urlretrieve``) runs on the
      main process only, and every process waits for it (``mgpu_runtime.on_main_process``).

    ## Why is this bad?
    Every process runs the script: every process downloads the same archive into the same path at the same
    moment, so the writes mix, and a process extracts or reads a file another is still writing. On a first run
    the job fails with a checksum error, a truncated archive or a file that exists already; or it trains on a
    half-written file.

    ## Example
    ```python
    train_set = CIFAR10("data", train=True, download=True, transform=augment)
    ```

    ## Use instead
    ```python
    train_set = mgpu_runtime.main_process_first(CIFAR10, "data", train=True, download=True, transform=augment)
    ```

    ## Fix safety
    Every process still builds the dataset from the same arguments, as before; only the order changes (the main
    process first) and the others wait. A build under a main-process block, or in a function only the main
    process calls, stays as it is (no other process downloads there). A project function that also builds a
    loader or joins the processes itself is not moved (its build on the main process alone would wait for the
    others). A fetch whose result is used, and any download under ``--style torch``, is reported (MGP336).
    """

    CODE = Rewrite("MGP137")
    PHASE = PROGRAM
    REVIEW_CODES = (DOWNLOADED_BY_EVERY_PROCESS,)
    DESCRIPTION = "datasets and files downloaded once, by the main process first"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            from torchvision.datasets import CIFAR10
            model = nn.DataParallel(model)
            train_set = CIFAR10('data', train=True, download=True)
            """,
            """
            from torchvision.datasets import CIFAR10
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            train_set = mgpu_runtime.main_process_first(CIFAR10, 'data', train=True, download=True)
            """,
            DDP,
            ("MGP101", "MGP137"),
            message="`CIFAR10(...)` downloads (`download=True`): built on the main process first, then the others (mgpu_runtime.main_process_first)",
            line=4,
        ),
        Example(
            """
            import torch.nn as nn
            from torchvision.datasets.utils import download_url
            model = nn.DataParallel(model)
            download_url('https://example.org/labels.txt', 'data')
            """,
            """
            from torchvision.datasets.utils import download_url
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            mgpu_runtime.on_main_process(download_url, 'https://example.org/labels.txt', 'data')
            """,
            DDP,
            ("MGP101", "MGP137"),
        ),
        Example(
            """
            import torch.nn as nn
            from torchvision.datasets import MNIST
            model = nn.DataParallel(model)
            test_set = MNIST('data', train=False, download=False)
            """,
            """
            from torchvision.datasets import MNIST
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            test_set = MNIST('data', train=False, download=False)
            """,
            DDP,
            ("MGP101",),
            name="download=False fetches nothing",
        ),
    )

    def apply(self) -> None:
        if not self.program.runs_distributed:
            return
        project: Optional[Project] = None
        for call in self.analysis.calls:
            qualified = self.analysis.resolve(call.func) or ""
            if qualified.startswith(RUNTIME + ".") or under_main_process_block(self.analysis, call):
                continue
            if gives_download(call):
                self._first(call, f"(`download={shorten(self._keyword(call), 20)}`)")
            elif qualified in DOWNLOADERS:
                self._fetch(call)
            elif type(call.func) in (cst.Name, cst.Attribute) and qualified and not qualified.startswith(("torch.", "builtins.")):
                project = project or project_of(self.analysis.path)
                found = project.find(qualified) if project is not None else None
                if project is None or found is None:
                    continue
                downloaded = project_download(project, found, self.analysis.code_of(call))
                if downloaded is not None:
                    where = f"{os.path.relpath(found.module.path, os.path.dirname(self.analysis.path))}:{downloaded.line}"
                    self._first(call, f"({where} `{shorten(_LEADING_MODULES.sub('', downloaded.call), 30)}`)", f"({where})")
                elif isinstance(found.node, ast.ClassDef):
                    self._made_first(call, [found], project)
            elif type(call.func) is cst.Subscript:
                project = project or project_of(self.analysis.path)
                picked = self._picked_from_module(call.func, project) if project is not None else None
                if project is not None and picked:
                    self._made_first(call, picked, project)

    def _picked_from_module(self, func: cst.Subscript, project: Project) -> list[Found]:
        """What ``module.__dict__[name]`` (pytorch-pose's ``datasets.__dict__[args.dataset](...)``) may pick: the
        classes and functions the project module's names hold; none for anything else."""
        if type(func.value) is not cst.Attribute or func.value.attr.value != "__dict__":
            return []
        picked = [found for found in map(project.module_classes, self.analysis.origins(func.value.value)) if found]
        return picked[0] if len(picked) == 1 else []

    def _made_first(self, call: cst.Call, candidates: list[Found], project: Project) -> None:
        """A construction (or a pick of a project module's names) whose every candidate writes only what it finds
        missing, one at least writing (pytorch-pose's dataset classes caching the images' mean; dgcnn's
        ``ModelNet40`` fetching its data through a shell command): built on the main process first, which writes
        what is missing; the others then find it."""
        if not all(project.writes_only_what_is_missing(candidate) for candidate in candidates):
            return
        made = next((made for made in map(project.made_when_missing, candidates) if made is not None), None)
        if made is None:
            return
        where = f"{os.path.relpath(made.path, os.path.dirname(self.analysis.path))}:{made.line}"
        written = f"`{shorten(made.call, 20)}`"
        self._first(call, f"({where} {written})", f"({where})", verb="writes what it lacks")

    def _keyword(self, call: cst.Call) -> str:
        value = next(arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "download")
        return self.analysis.code_of(value)

    def _why_not(self, call: cst.Call) -> Optional[str]:
        return _NO_RUNTIME if self.options.style != RUNTIME_STYLE else None

    def _what(self, call: cst.Call) -> str:
        return f"`{shorten(self.analysis.code_of(call.func), 40)}(...)`"

    def _first(self, call: cst.Call, *hows: str, verb: str = "downloads") -> None:
        """``call`` built on the main process first, said with the first of ``hows`` (the fullest first) whose
        messages fit one short line."""
        what = self._what(call)
        for how in hows:
            left, done = f"{verb} {how} on every process", f"{verb} {how}: built on the main process first, then the others ({RUNTIME}.main_process_first)"
            if len(f"{what} {done}") <= _MESSAGE and len(f"{what} {left}; not moved: {_NO_RUNTIME}") <= _MESSAGE:
                break
        self._move(call, "main_process_first", left, done)

    def _fetch(self, call: cst.Call) -> None:
        used = type(self.analysis.tree.parent(call)) is not cst.Expr
        self._move(call, "on_main_process", "fetches a file on every process", f"fetches on the main process only ({RUNTIME}.on_main_process); every process waits", "what it returns is used" if used else None)

    def _move(self, call: cst.Call, through: str, left: str, done: str, reason: Optional[str] = None) -> None:
        """``call`` made through ``mgpu_runtime.<through>``, or reported with why not; nothing where only the
        main process calls its function (no other process downloads there)."""
        if main_process_caller(self.analysis, call) is not None:
            return
        what = self._what(call)
        reason = self._why_not(call) or reason
        if reason is not None:
            self.left(call, DOWNLOADED_BY_EVERY_PROCESS, f"{what} {left}; not moved: {reason}")
            return
        if not self.rewrite_allowed(call):
            return
        self.edits.need_import(RUNTIME)
        self.edits.replace(call, through_runtime(through))
        self.rewrote(call, f"{what} {done}")
