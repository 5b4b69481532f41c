"""Project reading: the project's own modules that a migrated file imports, and what their definitions are.

Real training code spreads over modules: the wrapper class in ``utils/``, the trainer in ``reid/trainers.py``,
a vendored copy of DataParallel. A rule asks about a name the file imports (``utils.encoding.DataParallelModel``)
and gets the definition it names in the project, with the facts rules need: a subclass of torch's DataParallel,
a hand-written one (``replicate`` + ``parallel_apply``), a function or class that runs a backward pass.

Only the modules that are asked about are read, with Python's own parser (``ast``, ~20x faster than LibCST),
once per run and file (cached by path and modification time), so a pre-commit run over a few changed files
reads only what they import and a big tree costs nothing for files that never ask. The project is found
from the file's location on disk: the nearest directory above it holding ``pyproject.toml``, ``setup.py``,
``setup.cfg`` or ``.git``. Imports resolve as Python would resolve them for the file run as a script (its
own directory first), from the project root, and from the directory above the file's package.
"""

from __future__ import annotations

import ast
import copy
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Callable, NamedTuple, Union

from mgpu_migrate import files, old_keywords
from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.writers import LIBRARY_WRITERS, LIBRARY_WRITING_METHODS, SHELL_COMMANDS, WRITER_OBJECTS
from mgpu_migrate.started import ROOT_MARKERS, above_package, project_root

# How deep a chain of definitions is followed.
_MAX_DEPTH = 6
# A module larger than this is generated (a data table), not read: nothing in it is a training loop to find.
_MODULE_BYTES = 8 << 20
_TORCH_DATA_PARALLEL = {names.DATA_PARALLEL, "torch.nn.parallel.data_parallel.DataParallel"}
# torch's pieces of DataParallel: a function calling both is DataParallel written by hand.
# A module's copies made for each GPU: torch's replicate, or its parameters broadcast by hand (attention-transfer's
# functional models: `Broadcast.apply(device_ids, *params.values())`).
_REPLICATE = {
    "torch.nn.parallel.replicate",
    "torch.nn.parallel.replicate.replicate",
    "torch.nn.parallel._functions.Broadcast.apply",
    "torch.cuda.comm.broadcast_coalesced",
    "torch.nn.parallel.comm.broadcast_coalesced",
}
_PARALLEL_APPLY = {"torch.nn.parallel.parallel_apply", "torch.nn.parallel.parallel_apply.parallel_apply"}

_ENCODING_NAMES = (".DataParallelModel", ".DataParallelCriterion")
_CALLBACK_NAME = ".DataParallelWithCallback"
_UNEVEN_LOSS_OPERATIONS = frozenset(
    {"topk", "sort", "argsort", "kthvalue", "cdist", "masked_select", "nonzero", "ignore_index"}
)

Definition = Union[ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef]
NOT_BOUND = "<not bound>"  # what a star import binds a name to when it binds no such name


@dataclass
class ProjectModule:
    """One module of the project, read with ``ast``: its imports and top-level definitions."""

    path: str
    package: str  # the dotted package the module sits in ("" at a base directory), for relative imports
    imports: dict[str, str] = field(default_factory=dict)  # local name -> qualified name it is imported as
    definitions: dict[str, Definition] = field(default_factory=dict)
    # What a `from THIS import *` elsewhere needs: the modules it star-imports itself (absolute, in order), the
    # top-level names bound other than by one plain import or definition (assigned, imported under an `if` or
    # a `try`, bound twice), and its `__all__` when that is a literal list of names ("?" inside: not literal).
    stars: list[str] = field(default_factory=list)
    others: set[str] = field(default_factory=set)
    exports: frozenset[str] | None = None
    # A name assigned at module level -> the values assigned (``BatchNorm2d = partial(InPlaceABNSync, ...)``).
    assigned: dict[str, list[ast.expr]] = field(default_factory=dict)
    # What a definition of this module leads to (``replica_link``), by the node's id: the layer's module and
    # class, the line and the primitive, or None (the module holds its nodes, so no id is reused).
    links: dict[int, tuple[ProjectModule, Definition, int, str] | None] = field(default_factory=dict, repr=False, compare=False)

    def qualified(self, node: ast.expr) -> str | None:
        """The qualified name of a dotted expression through this module's imports (``nn.DataParallel`` ->
        ``torch.nn.DataParallel``); a module-level definition gives ``.NAME`` (this module's own)."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        head = node.id
        parts.reverse()
        if head in self.imports:
            return names.canonical(".".join([self.imports[head], *parts]))
        if head in self.definitions and not parts:
            return "." + head
        return None


@dataclass(frozen=True)
class Found:
    """A definition in the project: which module, which node, and where (for diagnostics), as seen from the
    directory of the file that uses it (``seen_from``): `lib/trainers.py:13` reads the same from any cwd."""

    module: ProjectModule
    node: Definition
    seen_from: str

    @property
    def where(self) -> str:
        return f"{os.path.relpath(self.module.path, self.seen_from)}:{self.node.lineno}"

    @property
    def name(self) -> str:
        return self.node.name


class Project:
    """The project one file belongs to, as seen from that file."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        directory = os.path.dirname(self.path)
        self.root = find_root(directory)
        top = above_package(directory)
        bases = [directory, top, *_script_paths(self.path)]
        if self.root is not None:
            bases.append(self.root)
            # A directory with no __init__.py may be a namespace package that the scripts reach through a path they
            # put on sys.path (HRNet's lib/core/function.py, imported as `core.function` with lib/ on the path by
            # tools/_init_paths.py): its own imports (`from utils.vis import ...`) resolve from the directory above.
            parent = os.path.dirname(directory)
            if top == directory and parent.startswith(self.root) and parent != directory:
                bases.append(parent)
        bases.extend(_packages_installed_from(self.root or top))
        self.bases = tuple(dict.fromkeys(bases))
        self._found: dict[tuple[str, int], Found | None] = {}
        self._changes: dict[int, Write | None] = {}  # by definition node: its first directory change
        self._written: dict[int, Write | None] = {}  # by definition node: its first file write
        self._downloaded: dict[int, Write | None] = {}  # by definition node: its first download
        self._made: dict[int, Made | None] = {}  # by definition node: its first write of what was missing
        self._trained: dict[int, Made | None] = {}  # by function node: where it trains (``trains_through``)
        self._sample_draws: dict[int, Made | None] = {}  # by class node: its first draw for each sample (``sample_draw``)
        self._methods: dict[str, list[Found]] = {}  # by name: the project's methods of that name
        # A function's copy without the branches a call switches off, kept: the caches above key nodes by id,
        # which a copy that was dropped would hand on to the next object made.
        self._pruned: dict[tuple[int, frozenset[str]], ast.AST] = {}

    def find(self, qualified: str, depth: int = 0) -> Found | None:
        key = (qualified, depth)
        if key not in self._found:
            self._found[key] = self._find(qualified, depth)
        return self._found[key]

    def _find(self, qualified: str, depth: int) -> Found | None:
        """The project's definition that ``qualified`` (``pkg.module.Name``, as the file imports it) names,
        following re-exports (``from .encoding import DataParallelModel`` in a package's ``__init__``)."""
        if qualified.startswith("."):  # relative to the file itself: `from .parallel import X` -> `.parallel.X`
            level = len(qualified) - len(qualified.lstrip("."))
            base = os.path.dirname(self.path)
            for _ in range(level - 1):
                base = os.path.dirname(base)
            bases: tuple[str, ...] = (base,)
            qualified = qualified[level:]
        else:
            bases = self.bases
        module_name, _, name = qualified.rpartition(".")
        if not module_name or not name or depth > _MAX_DEPTH:
            return None
        for base in bases:
            module = _module_at(base, module_name)
            if module is None:
                continue
            return self._in_module(module, name, depth)
        return None

    def _in_module(self, module: ProjectModule, name: str, depth: int) -> Found | None:
        if name in module.definitions:
            return Found(module, module.definitions[name], os.path.dirname(self.path))
        if name in module.imports:
            imported = module.imports[name]
            return self.find(imported, depth + 1) if imported != f"{module.package}.{name}" else None
        # Re-exported by a star import (bearpaw's ``utils/__init__.py``: ``from .logger import *``, then
        # ``from utils import Logger``): the first of them that tells binds it, as ``resolve_in`` reads one.
        for star in module.stars:
            bound = self.star_binding(star, name, depth + 1)
            if bound is not None and bound != NOT_BOUND:
                return self.find(bound, depth + 1)
        return None

    def star_binding(self, module_name: str, name: str, depth: int = 0) -> str | None:
        """What ``from MODULE import *`` binds ``name`` to, read from the project's copy of MODULE and the modules
        it star-imports in turn: the qualified name it was imported as there (``torch`` for ``import torch``), or
        ``MODULE.NAME`` for a definition of the module's own; ``NOT_BOUND`` when the star import binds no such
        name; None when that cannot be told (a module outside the project, a name assigned or imported under a
        condition, an ``__all__`` that is not a literal list)."""
        module = self._module(module_name) if depth <= _MAX_DEPTH else None
        if module is None:
            return None
        if module.exports is not None:
            if "?" in module.exports:
                return None
            if name not in module.exports:
                return NOT_BOUND
        elif name.startswith("_"):
            return NOT_BOUND
        if name in module.others:
            return None
        found = set()
        if name in module.definitions:
            found.add(f"{module_name}.{name}")
        if name in module.imports:
            found.add(names.canonical(module.imports[name]))
        for star in module.stars:
            bound = self.star_binding(star, name, depth + 1)
            if bound is None:
                return None
            if bound != NOT_BOUND:
                found.add(bound)
        if not found:
            return NOT_BOUND
        return found.pop() if len(found) == 1 else None

    def _module(self, module_name: str) -> ProjectModule | None:
        """The project's module of that name, as the file imports it (``.x`` relative to the file)."""
        bases = self.bases
        if module_name.startswith("."):
            level = len(module_name) - len(module_name.lstrip("."))
            base = os.path.dirname(self.path)
            for _ in range(level - 1):
                base = os.path.dirname(base)
            bases, module_name = (base,), module_name[level:]
        if not module_name:
            return None
        return next((module for module in (_module_at(base, module_name) for base in bases) if module is not None), None)

    def module(self, module_name: str, level: int = 0, package: str = "") -> ProjectModule | None:
        """The project's module an import names (``from ..x import y`` inside ``package``: level 2, ``x``), as
        the file's imports resolve; None for a module outside the project."""
        return self._module(_absolute(module_name, level, package)) if module_name or level else None

    def own(self, name: str, source: str) -> Found | None:
        """A top-level definition of the file itself (a loss function beside the training loop), read from
        ``source``, the text being migrated (stdin or a notebook's cells are not what the disk holds)."""
        module = _parsed_text(self.path, source)
        return self._in_module(module, name, 0) if module is not None else None

    def resolve_in(self, found: Found, node: ast.expr, depth: int = 0) -> tuple[str | None, Found | None]:
        """What a name used inside a project definition is: its qualified name, and its project definition. A
        name the module has from a star import of the project's (WaveRNN's ``from utils.dsp import *``, then
        ``save_wav(...)``) is the one that import binds."""
        qualified = found.module.qualified(node)
        if qualified is None and isinstance(node, ast.Name) and node.id not in found.module.definitions:
            for star in found.module.stars:
                bound = self.star_binding(star, node.id)
                if bound is not None and bound != NOT_BOUND:
                    qualified = bound
                    break
        if qualified is None:
            return None, None
        if qualified.startswith("."):
            return qualified, Found(found.module, found.module.definitions[qualified[1:]], found.seen_from)
        return qualified, self.find(qualified, depth + 1)

    # -- facts -------------------------------------------------------------------------------------------
    def data_parallel_base(self, found: Found, depth: int = 0) -> str | None:
        """For a class deriving from torch's DataParallel (directly or through project classes), the
        qualified name of torch's class; None otherwise."""
        if not isinstance(found.node, ast.ClassDef) or depth > _MAX_DEPTH:
            return None
        for base in found.node.bases:
            qualified, definition = self.resolve_in(found, base, depth)
            if qualified in _TORCH_DATA_PARALLEL:
                return qualified
            if definition is not None and definition.node is not found.node:
                inherited = self.data_parallel_base(definition, depth + 1)
                if inherited:
                    return inherited
        return None

    def direct_data_parallel_subclass(self, found: Found) -> bool:
        """A class deriving from torch's DataParallel itself (its own module rebases that base, MGP106)."""
        return isinstance(found.node, ast.ClassDef) and any(
            self.resolve_in(found, base)[0] in _TORCH_DATA_PARALLEL for base in found.node.bases
        )

    def hand_written_data_parallel(self, found: Found) -> bool:
        """A function (or a class's method) that calls both torch's ``replicate`` (or broadcasts the parameters
        itself) and ``parallel_apply``."""
        called = {found.module.qualified(call.func) for call in _calls(found.node)}
        return bool(called & _REPLICATE) and bool(called & _PARALLEL_APPLY)

    def trains(self, found: Found) -> Found | None:
        """The definition holding a backward pass: this one (a function, or a class with such a method) or a
        project class it derives from (a ``Trainer`` whose ``BaseTrainer`` holds the loop)."""
        return self._in_class_or_bases(found, lambda definition: definition if _backward_lines(definition) else None)

    def trains_through(self, found: Found) -> Made | None:
        """Where a function trains, itself or through the project functions it calls by name and the methods of its
        own class, ``_MAX_DEPTH`` deep: its first backward pass or ``optimizer.step()`` (Teacher-free KD's
        ``train_and_evaluate_kd``, which builds a SummaryWriter and calls ``train_kd``, whose loop steps). Such a
        function runs on every process: on the main process alone its gradient sums would wait for the others."""
        return _memoized(self._trained, found.node, None, lambda: self._trains_through(found, 0, set()))

    def _trains_through(self, found: Found, depth: int, seen: set[int]) -> Made | None:
        if not isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)) or depth > _MAX_DEPTH or id(found.node) in seen:
            return None
        seen.add(id(found.node))
        calls = sorted(_calls(found.node), key=lambda call: (call.lineno, call.col_offset))
        for call in calls:
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr == "backward":
                return Made(found.module.path, call.lineno, ".backward()")
            if isinstance(func, ast.Attribute) and func.attr == "step" and "optim" in ast.unparse(func.value).lower():
                return Made(found.module.path, call.lineno, f"{ast.unparse(func)}()")
        for call in calls:
            inner = self._called_definition(found, call, depth)
            if inner is not None:
                trained = self._trains_through(inner, depth + 1, seen)
                if trained is not None:
                    return trained
        return None

    def uneven_loss(self, found: Found) -> tuple[int, str] | None:
        """For a loss class (its methods, and those of the project classes it derives from): the line and the
        name of the first operation whose result a mean over each process's rows cannot reproduce: ranking or
        comparing the rows (``topk``, ``sort``, ``cdist``: OHEM, hard mining), or a mean over a number of
        elements that varies with the data (``masked_select``, ``ignore_index``, ``nonzero``)."""
        if not isinstance(found.node, ast.ClassDef):
            return None
        return self._in_class_or_bases(found, _uneven_operation)

    def _in_class_or_bases(self, found: Found, fact, depth: int = 0):
        """``fact`` of a definition, or else of the first project class it derives from that has it."""
        result = fact(found)
        if result is not None or not isinstance(found.node, ast.ClassDef) or depth > _MAX_DEPTH:
            return result
        for base in found.node.bases:
            _, definition = self.resolve_in(found, base, depth)
            if definition is not None and definition.node is not found.node:
                inherited = self._in_class_or_bases(definition, fact, depth + 1)
                if inherited is not None:
                    return inherited
        return None

    def backward_line(self, found: Found) -> int:
        return _backward_lines(found)[0]

    def evaluates_in_parallel(self, found: Found) -> Write | None:
        """The DataParallel a function of the project builds to evaluate a model of its own (MOT's
        ``test.test``, which loads the weights just saved and wraps them): its first DataParallel, in a function
        that runs no backward pass; None for anything else (a class, a function that trains)."""
        if not isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _backward_lines(found):
            return None
        for call in sorted(_calls(found.node), key=lambda call: (call.lineno, call.col_offset)):
            # ``torch`` from a star import of the project's own module (MOT's ``from models import *``) is no
            # import of this module: then the spelling, ``torch.nn.DataParallel``, says it.
            qualified = found.module.qualified(call.func) or _dotted(call.func)
            if qualified in _DATA_PARALLEL or self._callback_data_parallel(qualified):
                # A builder that returns the wrapped model (``return nn.DataParallel(net)``) hands it to its
                # caller: no evaluation of its own (MGP320 follows such models).
                return None if _returns_the_wrap(found.node, call) else Write(call.lineno, qualified.rpartition(".")[2])
        return None

    def device_parameter(self, found: Found) -> str | None:
        """The parameter of a project function whose value its DataParallel takes as ``device_ids``
        (first-order-model's ``train(..., device_ids)`` wrapping in ``DataParallelWithCallback(model,
        device_ids=device_ids)``), or of a project class's ``__init__`` (BERT-pytorch's ``BERTTrainer(...,
        cuda_devices=...)``): the GPUs its caller chose. None when no wrap there chooses so, or its wraps choose
        differently."""
        node = constructor(found.node) if isinstance(found.node, ast.ClassDef) else found.node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        parameters = {arg.arg for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}
        chosen = set()
        for call in _calls(node):
            qualified = found.module.qualified(call.func) or _dotted(call.func)
            if qualified not in _DATA_PARALLEL and not self._callback_data_parallel(qualified):
                continue
            given = [keyword.value for keyword in call.keywords if keyword.arg == "device_ids"] + call.args[1:2]
            chosen.add(given[0].id if given and isinstance(given[0], ast.Name) and given[0].id in parameters else None)
        return chosen.pop() if len(chosen) == 1 else None

    def _callback_data_parallel(self, qualified: str) -> bool:
        """``qualified`` is the Synchronized-BatchNorm package's ``DataParallelWithCallback``, in the project."""
        if not qualified.endswith(_CALLBACK_NAME):
            return False
        definition = self.find(qualified)
        return definition is not None and bool(self.data_parallel_base(definition)) and _only_calls_back(definition.node)

    def writes_unless(self, found: Found, switched_off: frozenset[str]) -> Write | None:
        """``writes`` of a function called with ``switched_off`` (parameters given a false constant): what it
        writes only under ``if NAME:`` for one of them it does not write (SCAN's ``hungarian_evaluate(...,
        compute_confusion_matrix=False)``)."""
        if not switched_off:
            return self.writes(found)
        key = (id(found.node), switched_off)
        if key not in self._pruned:
            self._pruned[key] = _WithoutBranches(switched_off).visit(copy.deepcopy(found.node))
        return self.writes(Found(found.module, self._pruned[key], found.seen_from))  # type: ignore[arg-type]

    def writes(self, found: Found) -> Write | None:
        """The first file write in a function (or a class's methods, and those of the project classes it derives
        from): ``open(path, "w")`` or ``"a"``, ``torch.save``, numpy's, OpenCV's or torchvision's image and array
        writers, a TensorBoard writer, a copy of a file, ``savefig``; or a directory made or deleted there or in
        a project function it calls (``create_folder(d)``)."""
        return self._in_class_or_bases(found, self._first_write)

    def function_writes(self, found: Found) -> list[Write]:
        """Every write a function makes itself, in the order of its lines: its file writes and directory changes
        (``writes`` names the first), and its calls by name of project functions that write (``language_eval(...)``,
        whose ``json.dump(..., open(path, "w"))`` a caller's other processes would read back)."""
        if not isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return []
        listed = []
        caught = {id(call) for call in _calls_catching_existing(found.node)}
        for call in sorted(_calls(found.node), key=lambda call: (call.lineno, call.col_offset)):
            written = _file_write(found, call)
            qualified = found.module.qualified(call.func)
            if written is None and id(call) not in caught and changes_a_directory(call, qualified):
                written = Write(call.lineno, qualified or ".mkdir()", directory=True)
            if written is None and isinstance(call.func, ast.Name):
                _, helper = self.resolve_in(found, call.func)
                if helper is not None and isinstance(helper.node, (ast.FunctionDef, ast.AsyncFunctionDef)) and self.writes(helper):
                    written = Write(call.lineno, f"{call.func.id}(...)")
            if written is not None:
                listed.append(written)
        return listed

    def made_when_missing(self, found: Found) -> Made | None:
        """The first write of a definition that writes only what it finds missing (pytorch-pose's ``Mpii``, whose
        ``__init__`` calls ``self._compute_mean()``: ``if isfile(f): load it, else: compute; torch.save(..., f)``;
        dgcnn's ``ModelNet40``, whose data loader calls ``download()``: ``if not os.path.exists(d): os.mkdir(d)``,
        ``if not os.path.exists(...): os.system('wget ...; unzip ...')``). Every write (a file written, a directory
        made or deleted, a shell command, a download) sits under an existence test that skips it once the thing
        exists (or writes a file whose name an earlier test looked for), or is a call of a project function, class
        or own method that writes so itself, followed ``_MAX_DEPTH`` deep. Run on the main process first, it makes
        what is missing; the other processes then find it and skip the writes. None for a definition that writes
        nothing, writes anything unguarded, or joins the processes (built on the main process alone, it would wait
        for the others). A class stands for its ``__init__``."""
        made = self._made_when_missing(found, 0)
        return None if made is None or made is _NOTHING_MADE else made

    def writes_only_what_is_missing(self, found: Found) -> bool:
        """Whether every write of a definition is of what it finds missing (``made_when_missing``), or it writes
        nothing."""
        return self._made_when_missing(found, 0) is not None

    def _made_when_missing(self, found: Found, depth: int) -> Made | None:
        if isinstance(found.node, ast.ClassDef):
            init = self.method(found, "__init__")
            return self._made_when_missing(init, depth) if init is not None and init.node is not found.node else _NOTHING_MADE
        if depth > _MAX_DEPTH or _joins_the_processes(found):
            return None
        # (a function that calls itself writes nothing more by doing so)
        return _memoized(self._made, found.node, _NOTHING_MADE, lambda: self._first_made(found, depth))

    def _first_made(self, found: Found, depth: int) -> Made | None:
        assert isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef))
        guards = _Guards(found.node)

        def opaque(call: ast.Call) -> bool:
            qualified = found.module.qualified(call.func)
            return qualified in SHELL_COMMANDS or qualified in DOWNLOADERS or downloads_by_keyword(call)

        guarded = {id(call) for call in _calls(found.node) if guards.made_there(call, opaque)}
        checked = _paths_checked(found)
        caught = {id(call) for call in _calls_catching_existing(found.node)}
        first: Made | None = None
        listed = False
        for call in sorted(_calls(found.node), key=lambda call: (call.lineno, call.col_offset)):
            qualified = found.module.qualified(call.func)
            # What is written after a directory is listed may be named from what was there (pytorch-deeplab-
            # xception's Saver makes `experiment_<runs found>`): a process after the main one would find one more
            # run and make another.
            listed = listed or qualified in _LISTINGS or (isinstance(call.func, ast.Attribute) and call.func.attr in ("glob", "rglob", "iterdir"))
            made: Made | None = None
            through_helper = False
            written = _file_write(found, call)
            if written is not None:
                path = call.args[0] if written.call.startswith("open(") and call.args else None
                if isinstance(path, ast.Name) and call.lineno > checked.get(path.id, call.lineno):
                    guarded.add(id(call))  # a cache: the file an earlier test looked for
                made = Made(found.module.path, written.line, written.call)
            elif id(call) not in caught and changes_a_directory(call, qualified):
                made = Made(found.module.path, call.lineno, qualified or ".mkdir()")
            elif opaque(call):
                made = Made(found.module.path, call.lineno, qualified or ast.unparse(call.func))
            else:
                helper = self._called_definition(found, call, depth)
                inner = self._made_when_missing(helper, depth + 1) if helper is not None else _NOTHING_MADE
                if inner is _NOTHING_MADE:
                    continue
                if inner is None and id(call) not in guarded:
                    return None
                made, through_helper = inner or Made(found.module.path, call.lineno, f"{ast.unparse(call.func)}(...)"), inner is not None
            if listed or (not through_helper and id(call) not in guarded):
                return None
            first = first or made
        return first or _NOTHING_MADE

    def _called_definition(self, found: Found, call: ast.Call, depth: int) -> Found | None:
        """The project function or class ``call`` names, or the method of its own class it calls on ``self``
        (``self._compute_mean()``); None for anything else."""
        if isinstance(call.func, ast.Name):
            _, helper = self.resolve_in(found, call.func, depth)
        else:
            helper = self._own_method(found, call)
        if helper is None or helper.node is found.node or not isinstance(helper.node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        return helper

    def built_class(self, found: Found) -> Found | None:
        """The project class a definition builds: a class itself; the class a function returns a new object of,
        directly or through a name it assigns it to (pytorch-retinanet's ``resnet50``: ``model = ResNet(...)``,
        weights loaded, ``return model``)."""
        node = found.node
        if isinstance(node, ast.ClassDef):
            return found
        made: dict[str, ast.expr] = {}
        for inner in ast.walk(node):
            if isinstance(inner, ast.Assign) and len(inner.targets) == 1 and isinstance(inner.targets[0], ast.Name):
                made[inner.targets[0].id] = inner.value
        for inner in ast.walk(node):
            value = inner.value if isinstance(inner, ast.Return) else None
            if isinstance(value, ast.Name):
                value = made.get(value.id)
            if isinstance(value, ast.Call) and isinstance(value.func, (ast.Name, ast.Attribute)):
                _, cls = self.resolve_in(found, value.func)
                if cls is not None and isinstance(cls.node, ast.ClassDef):
                    return cls
        return None

    def constant_loss(self, cls: Found) -> Made | None:
        """Where a module's ``forward`` may give a constant tensor in place of a loss (pytorch-retinanet's
        ``FocalLoss``, called by ``ResNet.forward`` through ``self.focalLoss``: ``regression_losses.append(
        torch.tensor(0).float())`` for an image without a positive anchor): a scalar made from a number under a
        condition, in the forward or in what it calls (``in_forward``). A process whose rows all take that branch
        gives its loss no path to some parameters: DDP then waits for their gradients unless told to look for
        unused parameters."""
        return self.in_forward(cls, _constant_under_a_condition)

    def forward_draw(self, cls: Found) -> Made | None:
        """Where a module's ``forward``, or what it calls, draws from numpy's or Python's global generator
        (WS-DAN's ``np.random.choice(self.M, 2, p=...)`` for each row in training)."""
        return self.in_forward(cls, _global_draw)

    def in_forward(self, cls: Found, finder: Callable[[Found], ast.Call | None], depth: int = 0, name: str = "forward") -> Made | None:
        """The first call ``finder`` finds in a module's ``forward`` (or another method: ``name``; an object's
        ``__call__`` when it has no ``forward``) or in what it calls: its own methods, the project's functions, and
        the forwards (or calls) of the project objects ``__init__`` keeps on ``self``, ``_MAX_DEPTH`` deep."""
        if not isinstance(cls.node, ast.ClassDef) or depth > _MAX_DEPTH:
            return None
        method = self.method(cls, name) or (self.method(cls, "__call__") if name == "forward" else None)
        if method is None:
            return None
        kept = self._kept_modules(cls)
        return self._found_in(method, kept, finder, depth, set())

    def sample_draw(self, cls: Found) -> Made | None:
        """For a dataset class, the first random draw (numpy's, Python's or torch's global generator) reached from
        its methods other than ``__init__``, which run for each sample: in them, in the project functions they call
        (DeepLabv3's ``preprocess(...)`` of its utils, flipping and cropping with ``random``), their own methods, and
        the project objects ``__init__`` keeps (RAFT's ``self.augmentor = FlowAugmentor(...)``, whose ``__call__``
        draws from numpy). None when none is reached."""
        if not isinstance(cls.node, ast.ClassDef):
            return None
        return _memoized(self._sample_draws, cls.node, None, lambda: self._in_class_or_bases(cls, self._sample_draw_here))

    def _sample_draw_here(self, cls: Found) -> Made | None:
        """``sample_draw`` in one class's own methods, with the objects its own ``__init__`` keeps."""
        if not isinstance(cls.node, ast.ClassDef):
            return None
        kept = self._kept_modules(cls)
        for method in cls.node.body:
            if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.name != "__init__":
                made = self._found_in(Found(cls.module, method, cls.seen_from), kept, _any_draw, 0, set())
                if made is not None:
                    return made
        # transforms that draw for each sample they are applied to (torchvision's RandomHorizontalFlip, ColorJitter),
        # built in the class or in a module-level name it reads (InsightFace-v2's `data_transforms['train']`)
        from mgpu_migrate.analysis.draws import drawing_transform

        read = {node.id for node in ast.walk(cls.node) if isinstance(node, ast.Name)}
        built = [*_calls(cls.node), *(call for name in read for value in cls.module.assigned.get(name, []) for call in _calls(value))]
        transforms = [call for call in built if drawing_transform(cls.module.qualified(call.func) or "")]
        if transforms:
            first = min(transforms, key=lambda call: call.lineno)
            return Made(cls.module.path, first.lineno, ast.unparse(first.func))
        # a method of a base class calls `self.augmentor(...)`, which this class's __init__ keeps
        for kept_class in kept.values():
            made = self.in_forward(kept_class, _any_draw, 1)
            if made is not None:
                return made
        return None

    def _found_in(
        self, found: Found, kept: dict[str, Found], finder: Callable[[Found], ast.Call | None], depth: int, seen: set[int]
    ) -> Made | None:
        if id(found.node) in seen or depth > _MAX_DEPTH:
            return None
        seen.add(id(found.node))
        first = finder(found)
        if first is not None:
            return Made(found.module.path, first.lineno, ast.unparse(first.func))
        for call in _calls(found.node):
            func = call.func
            followed: Found | None = None
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" and func.attr in kept:
                inner = self.in_forward(kept[func.attr], finder, depth + 1)
                if inner is not None:
                    return inner
                continue
            held = func.value if isinstance(func, ast.Attribute) else None
            if isinstance(held, ast.Attribute) and isinstance(held.value, ast.Name) and held.value.id == "self" and held.attr in kept:
                inner = self.in_forward(kept[held.attr], finder, depth + 1, name=func.attr)  # `self.augmentor.spatial(...)`
                if inner is not None:
                    return inner
                continue
            if isinstance(func, ast.Name):
                _, followed = self.resolve_in(found, func, depth)
            else:
                followed = self._own_method(found, call)
            if followed is not None and isinstance(followed.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = self._found_in(followed, kept, finder, depth + 1, seen)
                if inner is not None:
                    return inner
        return None

    def _kept_modules(self, cls: Found) -> dict[str, Found]:
        """The project classes whose objects a class's ``__init__`` keeps on ``self`` (``self.focalLoss =
        losses.FocalLoss()``), by attribute."""
        init = self.method(cls, "__init__")
        kept: dict[str, Found] = {}
        if init is None:
            return kept
        for node in ast.walk(init.node):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call)):
                continue
            target, func = node.targets[0], node.value.func
            on_self = isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
            if on_self and isinstance(func, (ast.Name, ast.Attribute)):
                _, made = self.resolve_in(init, func)
                if made is not None and isinstance(made.node, ast.ClassDef) and made.node is not cls.node:
                    kept[target.attr] = made
        return kept

    def methods_named(self, name: str) -> list[Found]:
        """The methods of that name of the project's classes, in the modules of the tree searched for importers
        (``search_top``): what ``obj.name(...)`` may run when the object's class is not known (HRNet's
        ``val_dataset.evaluate(...)``, the dataset built by ``eval('dataset.' + name)``)."""
        if name not in self._methods:
            self._methods[name] = self._methods_named(name)
        return self._methods[name]

    def _methods_named(self, name: str) -> list[Found]:
        wanted = f"def {name}(".encode()
        found = []
        top = search_top(self.path)
        for path, data in searched_tree(top):
            if wanted not in data:
                continue
            package = os.path.relpath(os.path.dirname(path), top)
            module = _read(path, "" if package == "." else package.replace(os.sep, "."))
            if module is None:
                continue
            for definition in module.definitions.values():
                if isinstance(definition, ast.ClassDef):
                    method = next((item for item in definition.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name), None)
                    if method is not None:
                        found.append(Found(module, method, os.path.dirname(self.path)))
        return found

    def module_classes(self, module_name: str) -> list[Found]:
        """The project classes and functions a project module's names hold (pytorch-pose's ``pose.datasets``,
        whose ``__init__`` imports ``mpii``, ``coco`` and ``lsp``): what ``module.__dict__[name]`` may pick."""
        module = self._module(module_name)
        if module is None:
            return []
        found = [Found(module, definition, os.path.dirname(self.path)) for definition in module.definitions.values()]
        for qualified in module.imports.values():
            definition = self.find(qualified) if not qualified.startswith(".") else None
            if definition is not None:
                found.append(definition)
        return found

    def _first_write(self, found: Found) -> Write | None:
        written = self._file_write(found, 0)
        changed = self._directory_change(found, 0)
        if written is None or (changed is not None and changed.line < written.line):
            return changed
        return written

    def _file_write(self, found: Found, depth: int) -> Write | None:
        """The first file write in ``found``, itself or through the project's functions it calls by name
        (``hungarian_evaluate`` calling ``confusion_matrix``, which calls ``plt.savefig``), ``_MAX_DEPTH`` deep."""
        key = id(found.node)
        if key in self._written:
            return self._written[key]
        self._written[key] = None  # a function that calls itself writes nothing more by doing so
        written = _first_file_write(found)
        for call in sorted(_calls(found.node), key=lambda call: (call.lineno, call.col_offset)):
            if written is not None and call.lineno >= written.line:
                break
            if isinstance(call.func, ast.Name) and depth < _MAX_DEPTH:
                _, helper = self.resolve_in(found, call.func, depth)
                functions = (ast.FunctionDef, ast.AsyncFunctionDef)
                if helper is not None and isinstance(helper.node, functions) and self._file_write(helper, depth + 1):
                    written = Write(call.lineno, f"{call.func.id}(...)")
                    break
            sibling = self._own_method(found, call) if depth < _MAX_DEPTH else None
            if sibling is not None and self._file_write(sibling, depth + 1):
                assert isinstance(call.func, ast.Attribute)
                written = Write(call.lineno, f"self.{call.func.attr}(...)")
                break
        self._written[key] = written
        return written

    def _own_method(self, found: Found, call: ast.Call) -> Found | None:
        """The method of its own class that a method calls on its first parameter (torchlight's ``print_timer``
        calling ``self.print_log(...)``)."""
        node = found.node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.args.args:
            return None
        func = call.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == node.args.args[0].arg):
            return None
        for definition in found.module.definitions.values():
            if isinstance(definition, ast.ClassDef) and any(item is node for item in definition.body):
                return self.method(Found(found.module, definition, found.seen_from), func.attr)
        return None

    def _directory_change(self, found: Found, depth: int) -> Write | None:
        """The first call that makes or deletes a directory in ``found``, itself or through the project's
        functions it calls by name (``create_logging`` calling ``create_folder``), followed ``_MAX_DEPTH`` deep."""
        key = id(found.node)
        if key in self._changes:
            return self._changes[key]
        self._changes[key] = None  # a function that calls itself changes nothing more by doing so
        change = None
        caught = {id(call) for call in _calls_catching_existing(found.node)}
        for call in sorted(_calls(found.node), key=lambda call: (call.lineno, call.col_offset)):
            qualified = found.module.qualified(call.func)
            if id(call) not in caught and changes_a_directory(call, qualified):
                change = Write(call.lineno, qualified or ".mkdir()", directory=True)
                break
            if isinstance(call.func, ast.Name) and depth < _MAX_DEPTH:
                _, helper = self.resolve_in(found, call.func, depth)
                functions = (ast.FunctionDef, ast.AsyncFunctionDef)
                if helper is not None and isinstance(helper.node, functions) and self._directory_change(helper, depth + 1):
                    change = Write(call.lineno, f"{call.func.id}(...)", directory=True)
                    break
        self._changes[key] = change
        return change


    def downloads(self, found: Found, depth: int = 0) -> Write | None:
        """The first download in a function, itself or through what it calls of the project (``get_train_dataset``
        building ``CIFAR10(root, download=True)``; open-reid's ``create`` building ``__factory[name](root)``, a
        class of a module-level dict whose ``__init__`` defaults to ``download=True``), ``_MAX_DEPTH`` deep: a
        call given ``download=`` that is not ``False`` (torchvision's datasets, a project's), of a library function
        that fetches a file (``download_url``, ``urlretrieve``), or of a project definition that downloads
        (``reaches_download``). None for a function that also builds a loader or joins the processes itself (its
        build on the main process alone would wait for the others)."""
        if not isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)) or depth > _MAX_DEPTH:
            return None
        # (a function that calls itself downloads nothing more by doing so)
        return _memoized(self._downloaded, found.node, None, lambda: self._first_download(found, depth))

    def _first_download(self, found: Found, depth: int) -> Write | None:
        if _joins_the_processes(found):
            return None
        for call in sorted(_calls(found.node), key=lambda call: (call.lineno, call.col_offset)):
            qualified = found.module.qualified(call.func)
            if downloads_by_keyword(call) or qualified in DOWNLOADERS:
                return Write(call.lineno, qualified or ast.unparse(call.func))
            if isinstance(call.func, ast.Name):
                _, helper = self.resolve_in(found, call.func, depth)
                if helper is not None and self.reaches_download(helper, call, depth + 1) is not None:
                    return Write(call.lineno, f"{call.func.id}(...)")
            elif isinstance(call.func, ast.Subscript) and any(
                self.reaches_download(entry, call, depth + 1) is not None
                for entry in self._registered(found, call.func.value, depth)
            ):
                return Write(call.lineno, f"{ast.unparse(call.func)}(...)")
        return None

    def reaches_download(self, found: Found, call: ast.Call, depth: int = 0) -> Write | None:
        """What ``call``, a call of the project definition ``found``, downloads: a function's first download
        (``downloads``); a class's construction, when its ``__init__`` (its own or a project base's) has a
        ``download`` parameter defaulting to a true constant that ``call`` leaves so (open-reid's ``Market1501(root,
        download=True)``: the line of that ``__init__``), or when its ``__init__`` downloads itself. None when
        ``call`` turns it off (``download=False``)."""
        if any(keyword.arg == "download" and _false_constant(keyword.value) for keyword in call.keywords):
            return None
        if not isinstance(found.node, ast.ClassDef) or depth > _MAX_DEPTH:
            return self.downloads(found, depth)
        init = self.method(found, "__init__")
        if init is None or not isinstance(init.node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _joins_the_processes(init):
            return None
        line = init.node.lineno if init.module is found.module else found.node.lineno
        default = _download_default(init.node)
        if default is not None:
            position, value = default
            given = call.args[position] if position is not None and position < len(call.args) else None
            starred = any(isinstance(argument, ast.Starred) for argument in call.args[: (position or 0) + 1])
            if given is None or starred or not _false_constant(given):
                return Write(line, f"download={ast.unparse(value)}")
        downloaded = self.downloads(init, depth + 1)
        return downloaded._replace(line=line) if downloaded is not None and init.module is not found.module else downloaded

    def _registered(self, found: Found, registry: ast.expr, depth: int) -> list[Found]:
        """The project definitions a module-level dict literal holds as values (open-reid's ``__factory =
        {'market1501': Market1501, ...}``, indexed by name in ``create``), the dict named in ``found``'s module or
        imported there from another of the project's; none for anything else."""
        if not isinstance(registry, ast.Name):
            return []
        module, name = found.module, registry.id
        qualified = module.qualified(registry)
        if qualified is not None:
            if qualified.startswith("."):
                return []
            module_name, _, name = qualified.rpartition(".")
            imported = self._module(module_name) if module_name else None
            if imported is None:
                return []
            module = imported
        entries = []
        for value in module.assigned.get(name, []):
            if not isinstance(value, ast.Dict):
                continue
            for entry in value.values:
                entry_name = module.qualified(entry)
                if entry_name is None:
                    continue
                if entry_name.startswith("."):
                    entries.append(Found(module, module.definitions[entry_name[1:]], found.seen_from))
                else:
                    definition = self.find(entry_name, depth + 1)
                    if definition is not None:
                        entries.append(definition)
        return entries

    def kept_on_self(self, holder: str, attribute: str) -> Found | None:
        """The project class whose object a class of the module at ``holder`` keeps on ``self.<attribute>``
        (st-gcn's ``IO.init_environment()``: ``self.io = torchlight.IO(...)``): the object its subclasses in other
        modules use; None when no class there builds one, or builds several."""
        package = os.path.relpath(os.path.dirname(os.path.abspath(holder)), above_package(os.path.dirname(os.path.abspath(holder))))
        module = _read(os.path.abspath(holder), "" if package == "." else package.replace(os.sep, "."))
        if module is None:
            return None
        built = {
            qualified
            for definition in module.definitions.values()
            if isinstance(definition, ast.ClassDef)
            for node in ast.walk(definition)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            for target in node.targets
            if isinstance(target, ast.Attribute) and target.attr == attribute
            and isinstance(target.value, ast.Name) and target.value.id == "self"
            for qualified in (module.qualified(node.value.func),)
        }
        if len(built) != 1 or None in built:
            return None
        qualified = built.pop()
        assert qualified is not None
        return self._class_named(module, qualified)

    def method(self, cls: Found, name: str, depth: int = 0) -> Found | None:
        """The method ``name`` of a project class, defined there or in a project class it derives from."""
        assert isinstance(cls.node, ast.ClassDef)
        for statement in cls.node.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == name:
                return Found(cls.module, statement, cls.seen_from)
        for base in cls.node.bases if depth < 4 else ():
            _, inherited = self.resolve_in(cls, base)
            if inherited is not None and isinstance(inherited.node, ast.ClassDef) and inherited.node is not cls.node:
                found = self.method(inherited, name, depth + 1)
                if found is not None:
                    return found
        return None

    def object_class(self, qualified: str) -> Found | None:
        """The project class of an object that a project module makes once, at module level (pytorch-playground's
        ``logger = Logger()`` in utee/misc.py, which the script uses as ``misc.logger``); None for a name bound
        otherwise or more than once."""
        module_name, _, name = qualified.rpartition(".")
        module = self._module(module_name) if module_name else None
        if module is None or name in module.definitions or name in module.imports:
            return None
        values = module.assigned.get(name, [])
        made = values[0] if len(values) == 1 and isinstance(values[0], ast.Call) else None
        cls = module.qualified(made.func) if made is not None else None
        return self._class_named(module, cls) if cls is not None else None

    def _class_named(self, module: ProjectModule, qualified: str) -> Found | None:
        """The project class a name read in ``module`` stands for (``.Name``: the module's own), else None."""
        if qualified.startswith("."):
            definition = module.definitions.get(qualified[1:])
            found = Found(module, definition, os.path.dirname(self.path)) if definition is not None else None
        else:
            found = self.find(qualified)
        return found if found is not None and isinstance(found.node, ast.ClassDef) else None


def project_download(project: Project, found: Found, code: str) -> Write | None:
    """What a migrated file's call of the project definition ``found`` (the call's text, ``code``) downloads, where
    MGP137 moves the call through ``mgpu_runtime.main_process_first``: a class's construction (``Market1501(root)``,
    ``reaches_download``), or a function's download when the function writes nothing else (one that does is
    MGP132's, called on the main process only). MGP132's rule leaves these calls to MGP137."""
    try:
        call = ast.parse(code.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    if not isinstance(call, ast.Call):
        return None
    downloaded = project.reaches_download(found, call)
    if downloaded is None or (not isinstance(found.node, ast.ClassDef) and project.writes(found) is not None):
        return None
    return downloaded


# Library functions that fetch a file to a path they are given.
DOWNLOADERS = frozenset(
    {
        "torchvision.datasets.utils.download_url",
        "torchvision.datasets.utils.download_and_extract_archive",
        "torchvision.datasets.utils.download_file_from_google_drive",
        "urllib.request.urlretrieve",
        "wget.download",
        "gdown.download",
    }
)
# A function calling one of these builds a loader or joins the processes: built on the main process alone, it
# would wait for processes that wait for it.
_JOINS_THE_PROCESSES = ("torch.utils.data.DataLoader", "torch.distributed.", "mgpu_runtime.")


def downloads_by_keyword(call: ast.Call) -> bool:
    """``X(..., download=True)``, or given any value but a constant ``False``, ``None`` or ``0``."""
    return any(keyword.arg == "download" and not _false_constant(keyword.value) for keyword in call.keywords)


def _false_constant(value: ast.expr) -> bool:
    return isinstance(value, ast.Constant) and not value.value


def _joins_the_processes(found: Found) -> bool:
    return any((found.module.qualified(call.func) or "").startswith(_JOINS_THE_PROCESSES) for call in _calls(found.node))


def _download_default(init: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int | None, ast.expr] | None:
    """An ``__init__``'s ``download`` parameter defaulting to a true constant (``download=True``): its position
    among the arguments a call passes (``self`` not counted; None when it is keyword-only), and the default."""
    arguments = init.args
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults = dict(zip([argument.arg for argument in positional[len(positional) - len(arguments.defaults) :]], arguments.defaults))
    keyword_only = {argument.arg: default for argument, default in zip(arguments.kwonlyargs, arguments.kw_defaults)}
    names = [argument.arg for argument in positional]
    if "download" in names and "download" in defaults:
        position: int | None = names.index("download") - 1
        value = defaults["download"]
    elif keyword_only.get("download") is not None:
        position, value = None, keyword_only["download"]
    else:
        return None
    if not isinstance(value, ast.Constant) or not value.value:
        return None
    return position, value


class Made(NamedTuple):
    """A write of what a definition found missing: the module it is in, its line there, the call that writes."""

    path: str
    line: int
    call: str


_NOTHING_MADE = Made("", 0, "")  # a definition that writes nothing


class Write(NamedTuple):
    """Where a project definition writes (its line, in its module), the call that does, and whether what it
    writes is a directory (made or deleted) rather than a file."""

    line: int
    call: str
    directory: bool = False


class _WithoutBranches(ast.NodeTransformer):
    """A function's copy without the bodies of ``if NAME:`` for the parameters a call switched off."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def visit_If(self, node: ast.If) -> ast.If:
        self.generic_visit(node)
        if isinstance(node.test, ast.Name) and node.test.id in self.names:
            node.body = [ast.Pass()]
        return node


def _returns_the_wrap(function: ast.FunctionDef | ast.AsyncFunctionDef, wrap: ast.Call) -> bool:
    """The function returns the wrap's result: the call itself, or a name it is assigned to."""
    names = {
        target.id
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and node.value is wrap
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(function):
        if isinstance(node, ast.Return) and node.value is not None:
            returned = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            if any(value is wrap or (isinstance(value, ast.Name) and value.id in names) for value in returned):
                return True
    return False


returns_the_wrap = _returns_the_wrap


def _dotted(node: ast.expr) -> str:
    return ast.unparse(node) if isinstance(node, (ast.Name, ast.Attribute)) else ""


def _backward_lines(found: Found) -> list[int]:
    return [
        call.lineno
        for call in _calls(found.node)
        if isinstance(call.func, ast.Attribute) and call.func.attr == "backward"
    ]


_DATA_PARALLEL = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel.DataParallel"})
DATA_PARALLEL_CLASSES = _DATA_PARALLEL
_WRITERS = LIBRARY_WRITERS | WRITER_OBJECTS | {"torch.save"}
_WRITING_METHODS = LIBRARY_WRITING_METHODS | {"unlink"}  # unlink: a Path removed


# Calls that make or delete a directory: every process making it at once fails (FileExistsError) but the first,
# and one deleting it deletes what the others have made there. ``os.makedirs(d, exist_ok=True)`` is safe on each.
_DIRECTORY_CHANGES = frozenset({"os.makedirs", "os.mkdir", "shutil.rmtree", "os.rmdir", "os.removedirs"})


def changes_a_directory(call: ast.Call, qualified: str | None) -> bool:
    path_method = qualified is None and isinstance(call.func, ast.Attribute) and call.func.attr == "mkdir"
    if qualified not in _DIRECTORY_CHANGES and not path_method:
        return False
    return not any(
        keyword.arg == "exist_ok" and isinstance(keyword.value, ast.Constant) and keyword.value.value is True
        for keyword in call.keywords
    )


# What a handler catches when a directory that exists already is no error to it (``except OSError as e: if
# e.errno != errno.EEXIST: raise``): a making under it is safe on every process.
EXISTING_CAUGHT = frozenset({"OSError", "FileExistsError", "IOError", "EnvironmentError", "Exception", "BaseException"})


def _calls_catching_existing(node: ast.AST) -> list[ast.Call]:
    """The calls in the body of a ``try`` with a handler that catches a directory's existing already."""
    found = []
    for statement in ast.walk(node):
        if isinstance(statement, ast.Try) and any(
            handler.type is None or any(ast.unparse(kind).rpartition(".")[2] in EXISTING_CAUGHT for kind in _kinds(handler.type))
            for handler in statement.handlers
        ):
            found.extend(call for part in statement.body for call in _calls(part))
    return found


def _kinds(caught: ast.expr) -> list[ast.expr]:
    return list(caught.elts) if isinstance(caught, ast.Tuple) else [caught]


def _paths_checked(found: Found) -> dict[str, int]:
    """For each name a test ``os.path.exists(name)`` (or ``isfile``) of the function reads, the line of its first
    such test: a write to ``name`` on a later line is to a file the function looked for first."""
    tested: dict[str, int] = {}
    for node in ast.walk(found.node):
        if isinstance(node, (ast.If, ast.IfExp)):
            for inner in ast.walk(node.test):
                if isinstance(inner, ast.Call) and len(inner.args) == 1 and isinstance(inner.args[0], ast.Name):
                    qualified = found.module.qualified(inner.func) or ""
                    if qualified in ("os.path.exists", "os.path.isfile", "posixpath.exists", "posixpath.isfile"):
                        name = inner.args[0].id
                        tested[name] = min(tested.get(name, node.lineno), node.lineno)
    return tested


# The calls that list a directory.
_LISTINGS = frozenset({"glob.glob", "glob.iglob", "os.listdir", "os.scandir", "os.walk"})
# The tests that a path exists: os.path's (also a project's wrapper of the same name, pytorch-pose's `isfile`) and
# pathlib's methods.
_EXISTENCE_TESTS = frozenset({"exists", "isfile", "isdir", "lexists", "is_file", "is_dir"})


def _existence(test: ast.expr) -> tuple[str, frozenset[str]] | None:
    """Whether ``test`` is true when a path is there ("present": ``os.path.exists(p)``, ``a and b`` of such), or
    when one is missing ("missing": ``not os.path.isfile(p)``, ``not exists(p) and download``), with the paths it
    tests (their text); else None."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _existence(test.operand)
        return None if inner is None else ("missing" if inner[0] == "present" else "present", inner[1])
    if isinstance(test, ast.Call):
        func = test.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name not in _EXISTENCE_TESTS:
            return None
        tested = test.args[0] if test.args else func.value if isinstance(func, ast.Attribute) and not test.args else None
        return "present", frozenset({ast.unparse(tested)} if tested is not None else ())
    if isinstance(test, ast.BoolOp):
        found = [_existence(value) for value in test.values]
        kinds = [kind[0] if kind is not None else None for kind in found]
        paths = frozenset().union(*(kind[1] for kind in found if kind is not None))
        # `a and b` runs its body only when a part that needs a missing path is true; its else when any part is
        # false, which for a conjunction of presences means a path is missing. `or` is the mirror.
        sure, whole = ("missing", "present") if isinstance(test.op, ast.And) else ("present", "missing")
        if sure in kinds:
            return sure, paths
        return (whole, paths) if all(kind == whole for kind in kinds) else None
    return None


class _Guards:
    """The calls of a function that run only when a path is missing: under ``if not exists(p):``, in the ``else``
    of ``if exists(p):``, or after an ``if exists(p): ... return`` (open-reid's ``download``). Each such stretch of
    code is a scope, with the paths its test names."""

    def __init__(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scopes: list[frozenset[str]] = []  # by scope: the paths its test names
        self.of_call: dict[int, list[int]] = {}  # by call: the scopes it runs in
        self.calls: dict[int, list[ast.Call]] = {}  # by scope: its calls
        self._walk(function.body, [])

    def _open(self, paths: frozenset[str], scopes: list[int]) -> list[int]:
        self.scopes.append(paths)
        return [*scopes, len(self.scopes) - 1]

    def _note(self, node: ast.AST, scopes: list[int]) -> None:
        for call in _calls(node):
            self.of_call.setdefault(id(call), []).extend(scopes)
            for scope in scopes:
                self.calls.setdefault(scope, []).append(call)

    def _walk(self, statements: list[ast.stmt], scopes: list[int]) -> None:
        for statement in statements:
            if isinstance(statement, ast.If):
                test = _existence(statement.test)
                self._note(statement.test, scopes)
                missing = test is not None and test[0] == "missing"
                self._walk(statement.body, self._open(test[1], scopes) if test is not None and missing else scopes)
                self._walk(statement.orelse, self._open(test[1], scopes) if test is not None and not missing else scopes)
                if test is not None and not missing and statement.body and isinstance(statement.body[-1], ast.Return):
                    scopes = self._open(test[1], scopes)
                continue
            for _, value in ast.iter_fields(statement):
                if isinstance(value, list) and value and all(isinstance(item, ast.stmt) for item in value):
                    self._walk(value, scopes)
                elif isinstance(value, list):
                    for item in value:
                        if isinstance(item, ast.ExceptHandler):
                            self._walk(item.body, scopes)
                        elif isinstance(item, ast.AST):
                            self._note(item, scopes)
                elif isinstance(value, ast.AST):
                    self._note(value, scopes)

    def made_there(self, call: ast.Call, opaque: Callable[[ast.Call], bool]) -> bool:
        """Whether ``call`` runs in a scope whose code makes what its test looks for: a call there is given one of
        the tested paths, or is a method of it (``torch.save(mean, path)`` under ``if not isfile(path):``,
        ``root.mkdir()`` under ``if not root.exists():``), or is ``opaque`` (a shell command, a download: what it
        makes is not read)."""
        return any(self._makes(scope, opaque) for scope in self.of_call.get(id(call), ()))

    def _makes(self, scope: int, opaque: Callable[[ast.Call], bool]) -> bool:
        tested = self.scopes[scope]
        return any(opaque(call) or any(ast.unparse(value) in tested for value in _given(call)) for call in self.calls.get(scope, ()))


_SCALAR_FACTORIES = frozenset({"torch.tensor", "torch.as_tensor", "torch.scalar_tensor", "torch.zeros", "torch.ones"})


def _constant_under_a_condition(found: Found) -> ast.Call | None:
    """The first constant scalar a definition makes in a branch of an ``if`` (``torch.tensor(0).float()``)."""
    conditional = [
        call
        for statement in ast.walk(found.node)
        if isinstance(statement, (ast.If, ast.IfExp))
        for branch in ([*statement.body, *statement.orelse] if isinstance(statement, ast.If) else [statement.body, statement.orelse])
        for call in _calls(branch)
        if _constant_scalar(found, call)
    ]
    return min(conditional, key=lambda call: (call.lineno, call.col_offset)) if conditional else None


def _global_draw(found: Found) -> ast.Call | None:
    """The first draw a definition makes from numpy's or Python's global generator (``np.random.choice``)."""
    return _first_draw(found, with_torch=False)


def _any_draw(found: Found) -> ast.Call | None:
    """The first draw a definition makes from numpy's, Python's or torch's global generator."""
    return _first_draw(found, with_torch=True)


def _first_draw(found: Found, with_torch: bool) -> ast.Call | None:
    from mgpu_migrate.analysis.draws import TORCH_DRAWS, numpy_draw

    draws = [
        call
        for call in _calls(found.node)
        if numpy_draw(qualified := found.module.qualified(call.func) or "") or (with_torch and qualified.startswith(TORCH_DRAWS))
    ]
    return min(draws, key=lambda call: (call.lineno, call.col_offset)) if draws else None


def _constant_scalar(found: Found, call: ast.Call) -> bool:
    """``torch.tensor(0)``, ``torch.zeros(1)``, ``x.new_tensor(0.0)``: a tensor of one number, made from constants."""
    func = call.func
    qualified = found.module.qualified(func) or ""
    if qualified not in _SCALAR_FACTORIES and not (isinstance(func, ast.Attribute) and func.attr in ("new_tensor", "new_zeros")):
        return False
    if len(call.args) != 1:
        return False
    argument = call.args[0]
    if isinstance(argument, ast.UnaryOp):
        argument = argument.operand
    if qualified in ("torch.zeros", "torch.ones") or (isinstance(func, ast.Attribute) and func.attr == "new_zeros"):
        return isinstance(argument, ast.Constant) and argument.value == 1 or isinstance(argument, (ast.Tuple, ast.List)) and not argument.elts
    return isinstance(argument, ast.Constant) and type(argument.value) in (int, float)


def freezes_parameter(found: Found, position: int) -> bool:
    """Whether a function's last statement freezes its parameter at ``position`` (``cfg.freeze()``, yacs: no
    write to it succeeds after)."""
    node = found.node
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
        return False
    parameters = [*node.args.posonlyargs, *node.args.args]
    if position >= len(parameters):
        return False
    last = node.body[-1]
    call = last.value if isinstance(last, ast.Expr) else None
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "freeze"
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == parameters[position].arg
    )


def _given(call: ast.Call) -> list[ast.expr]:
    """What a call is given: its arguments, and the object of a method it calls."""
    return [*call.args, *(keyword.value for keyword in call.keywords), *([call.func.value] if isinstance(call.func, ast.Attribute) else [])]


def _memoized(table: dict, node: ast.AST, meanwhile, compute: Callable):
    """``table``'s answer for a definition's node, computed once; ``meanwhile`` is the answer while it is being
    computed (a definition that reaches itself)."""
    key = id(node)
    if key not in table:
        table[key] = meanwhile
        table[key] = compute()
    return table[key]


def _first_file_write(found: Found) -> Write | None:
    for call in sorted(_calls(found.node), key=lambda call: (call.lineno, call.col_offset)):
        written = _file_write(found, call)
        if written is not None:
            return written
    return None


def _file_write(found: Found, call: ast.Call) -> Write | None:
    """The file ``call`` writes, in ``found``'s module: ``open(path, "w")``, a known writer, a writing method."""
    func = call.func
    if isinstance(func, ast.Name) and func.id == "open" and func.id not in found.module.imports:
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax"):
            return Write(call.lineno, f"open(..., {mode.value!r})")
        return None
    qualified = found.module.qualified(func)
    if qualified in _WRITERS:
        return Write(call.lineno, qualified)
    if isinstance(func, ast.Attribute) and func.attr in _WRITING_METHODS:
        return Write(call.lineno, f".{func.attr}()")
    return None


def _uneven_operation(found: Found) -> tuple[int, str] | None:
    uses = []
    for node in ast.walk(found.node):
        name = None
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        elif isinstance(node, ast.keyword):
            name = node.arg
        if name in _UNEVEN_LOSS_OPERATIONS:
            uses.append((getattr(node, "lineno", None) or node.value.lineno, name))
    return min(uses) if uses else None


def star_resolver(path: str, star_modules: set[str]) -> Callable[[str], str | None]:
    """For a file with star imports: what a name the file does not bind itself comes from, when the project's
    copies of every star-imported module tell (``from models import *``, where ``models`` imports torch), else
    None. Every star import is read, and those that bind the name must agree (which binds last is not asked)."""
    project = project_of(path)
    ordered = sorted(star_modules)

    def resolve(name: str) -> str | None:
        if project is None:
            return None
        found = set()
        for module in ordered:
            bound = project.star_binding(module, name)
            if bound is None:
                return None
            if bound != NOT_BOUND:
                found.add(bound)
        return found.pop() if len(found) == 1 else None

    return resolve


# What a layer builds in its ``__init__`` to meet its copies in nn.DataParallel's replica threads (CCNet's
# InPlaceABNSync: a master queue and a queue per worker), as ``mgpu_runtime.replica_links`` finds them held.
REPLICA_LINKS = frozenset(
    {
        *(f"{module}.{name}" for module in ("queue", "Queue") for name in ("Queue", "LifoQueue", "PriorityQueue")),
        *(f"threading.{name}" for name in ("Barrier", "Condition", "Event", "Semaphore", "BoundedSemaphore")),
        *(
            f"{module}.{name}"
            for module in ("multiprocessing", "torch.multiprocessing")
            for name in ("Queue", "SimpleQueue", "JoinableQueue", "Barrier", "Condition", "Event")
        ),
    }
)
# Modules whose names are never the project's: a model's reference to them is not followed.
_NOT_THE_PROJECTS = frozenset(
    {
        "torch", "torchvision", "numpy", "math", "os", "sys", "functools", "collections", "itertools", "typing",
        "re", "random", "time", "json", "copy", "warnings", "logging", "abc", "queue", "Queue", "threading",
        "multiprocessing", "builtins", "scipy", "cv2", "PIL", "mgpu_runtime",
    }
)
# How many definitions one search reads at most, and how deep it follows names.
_LINK_BUDGET = 400
_LINK_DEPTH = 10


@dataclass(frozen=True)
class ReplicaLink:
    """A layer class (``layer``) whose ``__init__`` builds a queue, a barrier, a condition or an event
    (``primitive``, at ``line`` of the layer's module)."""

    layer: Found
    line: int
    primitive: str


def replica_link(module: ProjectModule, expression: ast.expr, project: Project | None, seen_from: str) -> ReplicaLink | None:
    """The first layer class that ``expression`` (a model's construction, read in ``module``: the file's own)
    builds, through what it names in the project (``project``; only the file's own definitions when None): its
    classes and functions, the classes they derive from and name in their bodies, and module-level aliases
    (``BatchNorm2d = partial(InPlaceABNSync, ...)``), whose ``__init__`` builds one of ``REPLICA_LINKS``. A
    layer is an ``nn.Module``: a class that derives, through the project's classes, from one of ``torch.nn``."""
    return _LinkSearch(project, seen_from).expression(module, expression, 0)


class _LinkSearch:
    """One search of ``replica_link``. What a definition leads to is kept in its module (``ProjectModule.links``)
    when its search was whole (no definition on the way cut off as already on the way, too deep, or past the
    budget), so the files of one project that build the same model read its classes once."""

    def __init__(self, project: Project | None, seen_from: str) -> None:
        self.project = project
        self.seen_from = seen_from
        self.read = 0
        self.aliases: list[int] = []  # the aliases being read
        self.on_the_way: list[ast.AST] = []  # the definitions being read
        self.whole: list[bool] = []  # for each: whether nothing on the way from it was cut off
        self.cut_off: set[int] = set()  # definitions read in this search whose reading was not whole

    def expression(self, module: ProjectModule, node: ast.AST, depth: int) -> ReplicaLink | None:
        for reference in _references(node):
            for found in self._named(module, reference, depth):
                link = self.definition(found, depth + 1)
                if link is not None:
                    return link
        return None

    def _cut(self, above: int = -1) -> None:
        """A definition was not read (too deep, past the budget): what the readings on the way to it found is not
        whole; or only those above the ``above``-th, when it is that one, on the way already, which reads it whole."""
        for index in range(above + 1, len(self.whole)):
            self.whole[index] = False

    def _named(self, module: ProjectModule, reference: ast.expr, depth: int) -> list[Found]:
        """The project definitions a name or a dotted name stands for, through module-level aliases."""
        qualified = module.qualified(reference)
        if qualified is None:
            if isinstance(reference, ast.Name) and reference.id in module.assigned:
                key = id(module.assigned[reference.id])
                if key in self.aliases or depth >= _LINK_DEPTH:
                    self._cut()
                    return []
                self.aliases.append(key)
                try:
                    return [
                        found
                        for value in module.assigned[reference.id]
                        for inner in _references(value)
                        for found in self._named(module, inner, depth + 1)
                    ]
                finally:
                    self.aliases.pop()
            return []
        if qualified.startswith("."):
            return [Found(module, module.definitions[qualified[1:]], self.seen_from)]
        if self.project is None or qualified.partition(".")[0] in _NOT_THE_PROJECTS:
            return []
        found = self.project.find(qualified)
        return [found] if found is not None else []

    def definition(self, found: Found, depth: int) -> ReplicaLink | None:
        node, module = found.node, found.module
        key = id(node)
        if key in module.links:
            kept = module.links[key]
            return ReplicaLink(Found(kept[0], kept[1], self.seen_from), kept[2], kept[3]) if kept else None
        on_the_way = next((index for index, way in enumerate(self.on_the_way) if way is node), None)
        if on_the_way is not None:  # `super(ResNet, self)` in ResNet, or two classes that name each other
            self._cut(on_the_way)
            return None
        if key in self.cut_off or depth > _LINK_DEPTH or self.read >= _LINK_BUDGET:
            self._cut()
            return None
        self.read += 1
        self.on_the_way.append(node)
        self.whole.append(True)
        try:
            link = self._read(found, depth)
        finally:
            self.on_the_way.pop()
            whole = self.whole.pop()
        if not whole:
            self.cut_off.add(key)
        if whole or link is not None:  # a layer found is found, however the search went
            module.links[key] = (link.layer.module, link.layer.node, link.line, link.primitive) if link else None
        return link

    def _read(self, found: Found, depth: int) -> ReplicaLink | None:
        node = found.node
        if isinstance(node, ast.ClassDef):
            init = constructor(node)
            built = next(
                (call for call in _calls(init) if found.module.qualified(call.func) in REPLICA_LINKS), None
            ) if init is not None else None
            if built is not None and self._is_layer(found, 0):
                return ReplicaLink(found, built.lineno, found.module.qualified(built.func) or "")
            for base in node.bases:
                link = self.expression(found.module, base, depth)
                if link is not None:
                    return link
        for statement in node.body:
            link = self.expression(found.module, statement, depth)
            if link is not None:
                return link
        return None

    def _is_layer(self, found: Found, depth: int) -> bool:
        if not isinstance(found.node, ast.ClassDef) or depth > _MAX_DEPTH:
            return False
        for base in found.node.bases:
            qualified = found.module.qualified(base)
            if qualified is None:
                continue
            if qualified.startswith("torch.nn."):
                return True
            if qualified.startswith("."):
                inherited = [Found(found.module, found.module.definitions[qualified[1:]], self.seen_from)]
            elif self.project is not None:
                inherited = [f for f in (self.project.find(qualified),) if f is not None]
            else:
                inherited = []
            if any(other.node is not found.node and self._is_layer(other, depth + 1) for other in inherited):
                return True
        return False


def _references(node: ast.AST) -> list[ast.expr]:
    """The names and dotted names ``node`` reads, in source order (``nn.Conv2d`` once, not also ``nn``);
    nested functions and classes included, ``self.x`` and other attributes of values left out."""
    found: list[ast.expr] = []
    todo = [node]
    while todo:
        current = todo.pop()
        if isinstance(current, ast.Attribute):
            base = current.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and isinstance(current.ctx, ast.Load):
                found.append(current)
                continue
        elif isinstance(current, ast.Name) and isinstance(current.ctx, ast.Load):
            found.append(current)
            continue
        todo.extend(reversed(list(ast.iter_child_nodes(current))))
    return found


def encoding_pair_modules(path: str, imported: dict[str, set[str]]) -> frozenset[str]:
    """The modules a file imports ``DataParallelModel`` or ``DataParallelCriterion`` from that hold a copy of
    PyTorch-Encoding's pair: both classes derive from torch's DataParallel, and the model's ``gather`` returns
    the per-device outputs as they are (what makes it Encoding's: the criterion takes them ungathered)."""
    wanted = {origin for origins in imported.values() for origin in origins if origin.endswith(_ENCODING_NAMES)}
    project = project_of(path) if wanted else None
    if project is None:
        return frozenset()
    found = set()
    for origin in wanted:
        module = origin.rpartition(".")[0]
        model, criterion = (project.find(f"{module}.{name}") for name in ("DataParallelModel", "DataParallelCriterion"))
        if (
            model is not None
            and criterion is not None
            and project.data_parallel_base(model)
            and project.data_parallel_base(criterion)
            and _returns_its_argument(model.node, "gather")
        ):
            found.add(module)
    return frozenset(found)


def callback_data_parallel_modules(path: str, imported: dict[str, set[str]]) -> frozenset[str]:
    """The modules a file imports ``DataParallelWithCallback`` from that hold the Synchronized-BatchNorm package's
    class: it derives from torch's DataParallel, and its one method, ``replicate(self, module, device_ids)``,
    makes the replicas with DataParallel's own and calls ``execute_replication_callbacks`` on them (what
    ``replication_callbacks=True`` of the runtime's DDP reproduces over the processes)."""
    wanted = {origin for origins in imported.values() for origin in origins if origin.endswith(_CALLBACK_NAME)}
    project = project_of(path) if wanted else None
    if project is None:
        return frozenset()
    found = set()
    for origin in wanted:
        definition = project.find(origin)
        if definition is not None and project.data_parallel_base(definition) and _only_calls_back(definition.node) or definition is None and _copied_in_later(project, origin.rpartition(".")[0]):
            found.add(origin.rpartition(".")[0])
    return frozenset(found)


def _copied_in_later(project: Project, module: str) -> bool:
    """A package ``sync_batchnorm`` inside the project that the checkout lacks: the Synchronized-BatchNorm package,
    which a project's README has the user copy in (SPADE's ``models/networks/sync_batchnorm``, a git submodule);
    the class imported from it by the package's own name is the package's."""
    if module.rpartition(".")[2] != "sync_batchnorm" or module.startswith("."):
        return False
    parts = module.split(".")
    for base in project.bases:
        parent = os.path.join(base, *parts[:-1])
        if os.path.isdir(parent) and not os.path.exists(os.path.join(parent, parts[-1])) and not os.path.exists(os.path.join(parent, parts[-1] + ".py")):
            return True
    return False


def _only_calls_back(cls: ast.AST) -> bool:
    """``cls`` (a class) defines nothing but ``replicate(self, module, device_ids)``, which returns the replicas
    of the base class's ``replicate`` after calling ``execute_replication_callbacks`` on them."""
    if not isinstance(cls, ast.ClassDef):
        return False
    methods = [node for node in cls.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    if len(methods) != 1 or not isinstance(methods[0], ast.FunctionDef) or methods[0].name != "replicate":
        return False
    method = methods[0]
    if [arg.arg for arg in method.args.args] != ["self", "module", "device_ids"] or method.decorator_list:
        return False
    calls = [node for node in ast.walk(method) if isinstance(node, ast.Call)]
    called = {_dotted(call.func).rpartition(".")[2] for call in calls}
    return called <= {"replicate", "super", "execute_replication_callbacks"} and "execute_replication_callbacks" in called


def _returns_its_argument(cls: ast.ClassDef, method: str) -> bool:
    """Whether ``cls.method(self, outputs, ...)`` is ``return outputs``."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == method and len(node.args.args) >= 2:
            returned = [statement for statement in node.body if isinstance(statement, ast.Return)]
            first = node.args.args[1].arg
            return any(isinstance(r.value, ast.Name) and r.value.id == first for r in returned)
    return False


@dataclass(frozen=True)
class Importer:
    """A module of the project that imports a given one (found by its bytes, not parsed)."""

    path: str
    line: int
    trains: bool  # it calls `.backward(` itself
    # The line of its own ``init_process_group(`` call (0: none): it runs distributed training of its own.
    own_process_group: int = 0

    def where(self, seen_from: str) -> str:
        return f"{os.path.relpath(self.path, seen_from)}:{self.line}"


def importers(path: str, uses: str) -> list[Importer]:
    """The project's modules that import the module at ``path`` (``from gpt2_training.train_utils import
    load_model``, ``import model``, ``from . import train_utils``): first those that name ``uses`` (the
    function or class that holds the wrap), then those that run a backward pass.

    Found by a bounded byte search of the project's tree (at most ``_SEARCH_FILES`` files of at most
    ``_SEARCH_BYTES`` each and ``_SEARCH_TOTAL`` in all, read once per run; a folder with a project marker of its
    own is another project, not searched): a module's importers are never among what it imports, so
    project reading alone does not see them. Without a project marker the tree searched is the top package's
    directory (its parent when the file is in no package)."""
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    root = find_root(directory)
    top = search_top(path)
    relative = os.path.relpath(path, top)[: -len(".py")].replace(os.sep, ".")
    parts = relative.split(".")
    if parts[-1] == "__init__":
        parts.pop()
    if not parts or ".." in relative:
        return []
    found = []
    for other, data in _tree(top):
        if other != path and parts[-1].encode() in data:
            # Without a project marker, an import of a dotted suffix of the module's path names it only from inside
            # the folder that suffix is relative to: `from trainer import Trainer` in another folder of scripts
            # beside this one is that folder's trainer.
            within = None if root is not None else _within(top, parts, os.path.dirname(other))
            line = _import_line(data, parts, os.path.dirname(other) in (directory, os.path.dirname(directory)), within)
            if line:
                group = _PROCESS_GROUP.search(data)
                own = data.count(b"\n", 0, group.start()) + 1 if group else 0
                found.append((uses.encode() not in data, Importer(other, line, b".backward(" in data, own)))
    found.sort(key=lambda entry: (entry[0], not entry[1].trains, entry[1].path))
    return [importer for _, importer in found]



def search_top(path: str) -> str:
    """The tree searched for the importers of the module at ``path``: the project's root, else the top package's
    directory (its parent when the file is in no package: a folder of scripts, whose importers may be beside it)."""
    directory = os.path.dirname(os.path.abspath(path))
    root = find_root(directory)
    top = root or above_package(directory)
    if root is None and top == directory and not os.path.exists(os.path.join(directory, "__init__.py")):
        top = os.path.dirname(directory)
    return top


def searched_tree(top: str) -> tuple[tuple[str, bytes], ...]:
    """The modules of the tree at ``top`` and their bytes, read once per run (bounded: see ``importers``)."""
    return _tree(top)


def importers_through_packages(path: str, uses: str) -> list[Importer]:
    """``importers``, and the importers of each package ``__init__`` among them, which hands the module on."""
    found = importers(path, uses)
    return found + [inner for outer in found if outer.path.endswith("__init__.py") for inner in importers(outer.path, uses)]

# A process group the module sets up itself (``torch.distributed.init_process_group(backend='nccl')``), in code.
_PROCESS_GROUP = re.compile(rb"^[^#\n]*\binit_process_group\s*\(", re.MULTILINE)


def trees_searched() -> list[tuple[str, int, int]]:
    """The trees searched for importers so far in this process, with their files and bytes (for
    benchmarks/real_projects.py)."""
    return sorted((top, len(files), sum(len(data) for _, data in files)) for top, files in _SEARCHED.items())


_SEARCHED: dict[str, tuple[tuple[str, bytes], ...]] = {}
_SEARCH_FILES = 5000
_SEARCH_BYTES = 1 << 20
_SEARCH_TOTAL = 64 << 20
_SKIPPED_DIRECTORIES = frozenset({"node_modules", "site-packages", "__pycache__", "build", "dist"})


@cache
def _tree(top: str) -> tuple[tuple[str, bytes], ...]:
    found = []
    total = 0
    for file in _modules_under(top):
        if len(found) == _SEARCH_FILES or total > _SEARCH_TOTAL:
            break
        try:
            data, _ = files.read(file, _SEARCH_BYTES)  # a FIFO, a device or a file over the bound is not read
        except OSError:
            continue
        found.append((file, data))
        total += len(data)
    _SEARCHED[top] = searched = tuple(found)
    return searched


def _modules_under(top: str) -> Iterator[str]:
    boundary = os.path.realpath(top)
    for directory, subdirectories, names_here in os.walk(top):
        # A folder holding a project marker is another project (a tree with no marker of its own may be a
        # folder of scripts beside whole repositories): its modules do not import this one.
        subdirectories[:] = sorted(
            d
            for d in subdirectories
            if not d.startswith(".")
            and d not in _SKIPPED_DIRECTORIES
            and "venv" not in d
            and not any(os.path.exists(os.path.join(directory, d, marker)) for marker in ROOT_MARKERS)
        )
        for name in sorted(names_here):
            file = os.path.join(directory, name)
            # As the walker does, a link leading out of the tree is not followed: someone else's file, or /dev/zero.
            if name.endswith(".py") and not (os.path.islink(file) and not files.inside(os.path.realpath(file), boundary)):
                yield file


def _within(top: str, parts: list[str], folder: str) -> int:
    """How many leading parts of a module's dotted path (relative to ``top``) a file in ``folder`` may leave out
    of an import of it at most: those of the folders of ``top`` that hold ``folder``."""
    relative = os.path.relpath(folder, top)
    if relative == "." or relative.startswith(".."):
        return 0
    held = 0
    for name in relative.split(os.sep):
        if held >= len(parts) - 1 or name != parts[held]:
            break
        held += 1
    return held


def _import_line(data: bytes, parts: list[str], nearby: bool, within: int | None = None) -> int:
    """The line of ``data`` that imports the module ``parts`` names (any dotted suffix of it; with ``within``, a
    suffix that leaves out at most that many leading parts), or 0."""
    last = re.escape(parts[-1])
    patterns = []
    for start in range(len(parts) if within is None else within + 1):
        name = r"\.".join(map(re.escape, parts[start:]))
        patterns.append(rf"import\s+(?:[\w.]+\s*,\s*)*{name}(?![\w.])|from\s+{name}\s+import\b")
        if start < len(parts) - 1:
            parent = r"\.".join(map(re.escape, parts[start:-1]))
            patterns.append(rf"from\s+{parent}\s+import\s+[^#\n]*(?<![\w.]){last}(?![\w.])")
    if nearby:  # `from .train_utils import x`, `from . import train_utils`
        patterns.append(rf"from\s+\.+{last}\s+import\b|from\s+\.+\s+import\s+[^#\n]*(?<![\w.]){last}(?![\w.])")
    match = re.compile(rb"^[ \t]*(?:" + "|".join(patterns).encode() + rb")", re.MULTILINE).search(data)
    if match is None:  # named by its dotted path (`import_class('processor.recognition.REC_Processor')`)
        dotted = r"\.".join(map(re.escape, parts))
        match = re.compile(rf"""\bimport_\w+\s*\(\s*['"]{dotted}(?:\.\w+)?['"]""".encode()).search(data)
    return data.count(b"\n", 0, match.start()) + 1 if match else 0


def project_of(path: str) -> Project | None:
    """The project of a file on disk (None for text that is no file: stdin, a string)."""
    return _project(os.path.abspath(path)) if os.path.isfile(path) else None


@lru_cache(maxsize=256)
def _project(path: str) -> Project:
    return Project(path)


def _calls(node: ast.AST) -> list[ast.Call]:
    return [child for child in ast.walk(node) if isinstance(child, ast.Call)]


def find_root(directory: str) -> str | None:
    """The nearest directory at or above ``directory`` holding a project marker."""
    return _find_root(os.path.abspath(directory))


@cache
def _find_root(directory: str) -> str | None:
    return project_root(directory)


def forget_roots() -> None:
    """Drop what was read under the roots known so far (``started.name_roots`` named more)."""
    _find_root.cache_clear()
    _project.cache_clear()


def _script_paths(path: str, depth: int = 0) -> list[str]:
    """The directories a script puts on ``sys.path`` relative to its own (``sys.path.insert(1,
    os.path.join(sys.path[0], '../utils'))``, ``os.path.dirname(__file__)``), where its imports resolve too; also
    those a module beside it does when the script imports it (faster-rcnn's ``import _init_paths``, whose
    ``add_path(osp.join(this_dir, 'lib'))`` inserts ``lib/``). Only module-level statements, names bound there
    and functions that insert their argument, and only when the text mentions ``sys.path`` (most files are not
    parsed)."""
    try:
        source, _ = files.read(path, _MODULE_BYTES)
    except OSError:
        return []
    if b"sys.path" not in source:
        if depth > 0:
            return []
        beside = (_beside(path, name.decode("ascii", "replace")) for name in _PLAIN_IMPORT.findall(source))
        return [directory for module in beside if module is not None for directory in _script_paths(module, depth + 1)]
    try:
        tree = ast.parse(source, path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found: list[str] = []
    reader = _PathReader(path)
    for statement in _module_level(tree.body):
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            reader.note_import(statement)
            if depth == 0 and isinstance(statement, ast.Import):
                for alias in statement.names:
                    module = _beside(path, alias.name)
                    if module is not None:
                        found.extend(_script_paths(module, depth + 1))
        elif isinstance(statement, ast.FunctionDef):
            reader.note_function(statement)
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            reader.assign(statement.targets[0], statement.value)
        elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            directory = reader.inserted(statement.value)
            if directory is not None:
                found.append(os.path.normpath(directory))
    return found


script_paths = _script_paths

# ``import _init_paths`` on a line of its own: a module that may edit ``sys.path`` for its importer.
_PLAIN_IMPORT = re.compile(rb"^import[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*(?:#.*)?$", re.MULTILINE)


def _beside(path: str, module_name: str) -> str | None:
    """The file of the module ``import module_name`` finds beside ``path`` (a plain ``name.py``), if there."""
    candidate = os.path.join(os.path.dirname(os.path.abspath(path)), *module_name.split(".")) + ".py"
    return candidate if os.path.isfile(candidate) else None


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a module's body, and of its top-level ``if``s and ``try``s."""
    for statement in body:
        if isinstance(statement, ast.If):
            yield from _module_level(statement.body + statement.orelse)
        elif isinstance(statement, ast.Try):
            yield from _module_level(statement.body)
        else:
            yield statement


class _PathReader:
    """Reads the directory a module-level ``sys.path`` edit names, from the module's own location: ``__file__``,
    ``sys.path[0]``, string constants, ``os.path`` ``dirname``/``join``/``abspath``/``realpath`` (also through an
    alias such as ``osp``) and names bound to such values above it."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.os_path = {"os.path"}
        self.values: dict[str, str] = {}
        self.inserters: dict[str, int] = {}  # a module function that inserts its parameter: which one

    def note_import(self, statement: ast.Import | ast.ImportFrom) -> None:
        if isinstance(statement, ast.Import):
            self.os_path.update(alias.asname for alias in statement.names if alias.name == "os.path" and alias.asname)
        elif statement.module == "os" and statement.level == 0:
            self.os_path.update(alias.asname or alias.name for alias in statement.names if alias.name == "path")

    def note_function(self, function: ast.FunctionDef) -> None:
        parameters = [argument.arg for argument in function.args.args]
        for node in ast.walk(function):
            argument = self._edit(node) if isinstance(node, ast.Call) else None
            if isinstance(argument, ast.Name) and argument.id in parameters:
                self.inserters[function.name] = parameters.index(argument.id)
                return

    def assign(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            evaluated = self.value(value)
            if evaluated is None:
                self.values.pop(target.id, None)
            else:
                self.values[target.id] = evaluated

    def inserted(self, call: ast.Call) -> str | None:
        """The directory ``call`` puts on ``sys.path``, if it is such an edit and its argument can be read."""
        argument = self._edit(call)
        if argument is None and isinstance(call.func, ast.Name) and call.func.id in self.inserters:
            index = self.inserters[call.func.id]
            argument = call.args[index] if index < len(call.args) else None
        return self.value(argument) if argument is not None else None

    @staticmethod
    def _edit(call: ast.Call) -> ast.expr | None:
        """The directory argument of ``sys.path.insert(i, d)`` or ``sys.path.append(d)``."""
        if (
            isinstance(call.func, ast.Attribute)
            and call.func.attr in ("insert", "append")
            and ast.unparse(call.func.value) == "sys.path"
            and call.args
        ):
            return call.args[-1]
        return None

    def value(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return os.path.join(os.path.dirname(self.path), node.value)
        if isinstance(node, ast.Name):
            return self.path if node.id == "__file__" else self.values.get(node.id)
        if ast.unparse(node) == "sys.path[0]":
            return os.path.dirname(self.path)
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            return None
        if ast.unparse(node.func.value) not in self.os_path or node.keywords:
            return None
        parts = [self.value(argument) if index == 0 else _constant_text(argument) for index, argument in enumerate(node.args)]
        if any(part is None for part in parts):
            return None
        first = parts[0]
        assert first is not None
        if node.func.attr == "join":
            return os.path.join(first, *(part for part in parts[1:] if part is not None))
        if node.func.attr == "dirname" and len(parts) == 1:
            return os.path.dirname(first)
        if node.func.attr in ("abspath", "realpath", "normpath") and len(parts) == 1:
            return os.path.normpath(first)
        return None


def _constant_text(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


@cache
def _packages_installed_from(top: str) -> tuple[str, ...]:
    """The folders of ``top`` that hold a package the project installs from its own tree (st-gcn's
    ``torchlight/setup.py`` beside ``torchlight/torchlight/``, installed with ``cd torchlight; python setup.py
    install``): there ``import torchlight`` resolves as in the installed copy."""
    try:
        names = sorted(os.listdir(top))
    except OSError:
        return ()
    return tuple(
        folder
        for folder in (os.path.join(top, name) for name in names)
        if os.path.isfile(os.path.join(folder, "setup.py"))
        and os.path.isfile(os.path.join(folder, os.path.basename(folder), "__init__.py"))
    )


def _module_at(base: str, module_name: str) -> ProjectModule | None:
    """The module ``module_name`` under the base directory ``base``: ``a/b.py`` or ``a/b/__init__.py``."""
    relative = os.path.join(base, *module_name.split("."))
    for path in (relative + ".py", os.path.join(relative, "__init__.py")):
        if os.path.isfile(path):
            package = module_name if path.endswith("__init__.py") else module_name.rpartition(".")[0]
            return _read(path, package)
    return None


def _read(path: str, package: str) -> ProjectModule | None:
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return None
    return _parsed(path, package, stamp)


def modules_read() -> list[str]:
    """The project modules read so far in this process (for benchmarks/real_projects.py)."""
    return sorted(_READ)


_READ: set[str] = set()


@lru_cache(maxsize=512)
def _parsed(path: str, package: str, stamp: int) -> ProjectModule | None:
    """One project module, read once per run (and again only if it changed on disk)."""
    _READ.add(path)
    try:
        tree = _ast_of(files.read(path, _MODULE_BYTES)[0], path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # Python 2 code, a broken file: nothing is known about it
    return _module_of(tree, path, package)


def _ast_of(source: bytes, path: str) -> ast.Module:
    """The module's tree; one whose only syntax error is PyTorch's old ``async=`` keyword is read as the
    migration reads it (``old_keywords``)."""
    try:
        return ast.parse(source, path)
    except SyntaxError:
        if b"async" not in source:
            raise
        try:
            text = source.decode("utf-8")
        except UnicodeDecodeError:
            raise SyntaxError("not UTF-8") from None
        readable = old_keywords.readable(text)
        if readable is None:
            raise
        return ast.parse(readable, path)


def text_module(path: str, source: str) -> ProjectModule | None:
    """The module a file's own text makes (its definitions, imports and module-level names), None when Python's
    parser refuses it: what the project reading knows of the file being migrated, also when it is no file."""
    return _parsed_text(path, source)


@lru_cache(maxsize=4)
def _parsed_text(path: str, source: str) -> ProjectModule | None:
    """The file being migrated, from its text (each rule that asks gets the same one)."""
    try:
        return _module_of(ast.parse(source, path), path, "")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _module_of(tree: ast.Module, path: str, package: str) -> ProjectModule:
    module = ProjectModule(path, package)
    bound: set[str] = set()
    for statement in tree.body:
        names_bound = _top_level_names(statement)
        module.others |= names_bound & bound  # bound twice: which one a star import sees depends on the order
        bound |= names_bound
        if isinstance(statement, ast.ImportFrom) and any(alias.name == "*" for alias in statement.names):
            module.stars.append(_absolute(statement.module or "", statement.level, package))
        if not isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Import, ast.ImportFrom)):
            module.others |= names_bound
            if "__all__" in names_bound:
                module.exports = _literal_names(statement)
        if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            module.definitions[statement.name] = statement
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            _add_imports(module, statement, package, guarded=False)
        elif isinstance(statement, (ast.Try, ast.If)):
            # `try: from queue import Queue` / `except ImportError: from Queue import Queue` (Python 2's name):
            # the first import of a name in such a block is the one a current Python runs.
            for inner in _guarded_statements(statement):
                _add_imports(module, inner, package, guarded=True)
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
            module.assigned.setdefault(statement.targets[0].id, []).append(statement.value)
    return module


def _top_level_names(statement: ast.stmt) -> set[str]:
    """The names a module-level statement binds (in its branches too: an import under ``try`` or ``if``)."""
    if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return {statement.name}
    found = set()
    for node in ast.walk(statement):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            found.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    found.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            found.add(node.name)
    return found


def _literal_names(statement: ast.stmt) -> frozenset[str]:
    """``__all__ = ["a", "b"]`` (or a tuple): its names; anything else: a set holding "?" (no name is known)."""
    value = statement.value if isinstance(statement, ast.Assign) else None
    if isinstance(value, (ast.List, ast.Tuple)) and all(
        isinstance(item, ast.Constant) and isinstance(item.value, str) for item in value.elts
    ):
        return frozenset(item.value for item in value.elts)  # type: ignore[union-attr]
    return frozenset({"?"})


def _guarded_statements(statement: ast.Try | ast.If, depth: int = 0) -> Iterator[ast.stmt]:
    """The imports of a module-level ``try`` or ``if``, in the order its parts are written (nested two deep)."""
    parts: list[list[ast.stmt]] = [statement.body]
    if isinstance(statement, ast.Try):
        parts += [handler.body for handler in statement.handlers] + [statement.orelse, statement.finalbody]
    else:
        parts.append(statement.orelse)
    for part in parts:
        for inner in part:
            if isinstance(inner, (ast.Import, ast.ImportFrom)):
                yield inner
            elif isinstance(inner, (ast.Try, ast.If)) and depth < 2:
                yield from _guarded_statements(inner, depth + 1)


def _add_imports(module: ProjectModule, statement: ast.Import | ast.ImportFrom, package: str, guarded: bool) -> None:
    """The names an import binds, by the qualified names they stand for (a guarded one only if none bound it yet)."""
    bound: dict[str, str] = {}
    if isinstance(statement, ast.Import):
        for alias in statement.names:
            if alias.asname:
                bound[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                bound[top] = top
    else:
        source = _absolute(statement.module or "", statement.level, package)
        for alias in statement.names:
            if alias.name != "*":
                bound[alias.asname or alias.name] = f"{source}.{alias.name}" if source else alias.name
    for name, qualified in bound.items():
        if not guarded or name not in module.imports:
            module.imports[name] = qualified


def _absolute(module: str, level: int, package: str) -> str:
    """``from ..x import y`` inside ``package`` -> the absolute module ``x`` is."""
    if not level:
        return module
    parts = package.split(".") if package else []
    parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join([*parts, module] if module else parts)


def constructor(node: ast.ClassDef) -> ast.FunctionDef | None:
    """The ``__init__`` a class defines in its own body (None when it inherits one)."""
    return next((item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"), None)
