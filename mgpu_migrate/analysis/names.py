"""Resolve names through imports and aliases, without executing anything.

A name is torch's ``DataParallel`` only when every binding of that name in the file is an import of it:
a user's own ``class DataParallel`` or a parameter called ``nn`` makes the name local, and a name bound
both ways is ambiguous. Bindings are collected over the whole file rather than per scope, which can
only make the tool more cautious (a local binding anywhere blocks a rewrite everywhere), never less.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

# Canonical qualified names of what the tool migrates.
DATA_PARALLEL = "torch.nn.DataParallel"
DATA_PARALLEL_FUNCTION = "torch.nn.parallel.data_parallel"
TORCH_DDP = "torch.nn.parallel.DistributedDataParallel"
APEX_DDP = "apex.parallel.DistributedDataParallel"
ENCODING_MODEL = "encoding.parallel.DataParallelModel"
ENCODING_CRITERION = "encoding.parallel.DataParallelCriterion"
# The Synchronized-BatchNorm package's DataParallel, which calls its layers back at each replicate (a vendored
# ``sync_batchnorm/replicate.py``, recognized by reading the project's copy: ``analysis.project``).
CALLBACK_DATA_PARALLEL = "sync_batchnorm.DataParallelWithCallback"
TORCH_MODULE = "torch.nn.Module"
TORCH_FUNCTIONAL = "torch.nn.functional"
# The runtime's names, recognized so that a second run (or a file already half migrated) is understood.
RUNTIME_MODEL = "mgpu_runtime.DataParallelModel"
RUNTIME_CRITERION = "mgpu_runtime.DataParallelCriterion"
RUNTIME_DATA_PARALLEL_FUNCTION = "mgpu_runtime.data_parallel"
RUNTIME_DDP = "mgpu_runtime.DistributedDataParallel"
RUNTIME_DISTRIBUTED_CRITERION = "mgpu_runtime.DistributedCriterion"

_ALIASES = {
    "torch.nn.parallel.DataParallel": DATA_PARALLEL,
    "torch.nn.parallel.data_parallel.DataParallel": DATA_PARALLEL,
    "torch.nn.parallel.data_parallel.data_parallel": DATA_PARALLEL_FUNCTION,
    "torch.nn.parallel.distributed.DistributedDataParallel": TORCH_DDP,
    "apex.parallel.distributed.DistributedDataParallel": APEX_DDP,
}

_ENCODING_NAMES = {"DataParallelModel": ENCODING_MODEL, "DataParallelCriterion": ENCODING_CRITERION}
_ENCODING_MODULE = "encoding.parallel"
# Top-level packages of frameworks other than PyTorch. A module under one of them is never PyTorch-Encoding's,
# even when it is called `parallel` and exports a pair of the same names (GluonCV's `gluoncv.utils.parallel`,
# for MXNet); a file importing one of them does not take its own `parallel` module for a vendored copy either.
NON_TORCH_FRAMEWORKS = frozenset(
    {"mxnet", "gluoncv", "gluonnlp", "gluonts", "tensorflow", "keras", "tf_keras", "jax", "flax", "paddle",
     "paddleseg", "paddlenlp", "mindspore", "oneflow", "megengine", "chainer", "theano"}
)

MIGRATED_NAMES = frozenset({DATA_PARALLEL, DATA_PARALLEL_FUNCTION, APEX_DDP, ENCODING_MODEL, ENCODING_CRITERION})
# The tops of qualified names that are never the project's own modules (nothing there is looked up in the project).
NOT_THE_PROJECT = frozenset({"torch", "mgpu_runtime", "apex", "encoding", "builtins", "os", "sys", "numpy", "math"})
# What a star import of a library binds, of the names the analysis reads: tqdm's progress bars around a loader.
_LIBRARY_STAR_EXPORTS = {"tqdm": frozenset({"tqdm", "trange"}), "tqdm.auto": frozenset({"tqdm", "trange"})}


def canonical(qualified: str, vendored_encoding: bool = False) -> str:
    """The canonical spelling of a qualified name (every import path of one object maps to one name).

    ``vendored_encoding``: also take a module of this file's own called ``parallel`` (``from .parallel import
    DataParallelModel``, ``from utils.parallel import ...``) for a vendored copy of PyTorch-Encoding's
    ``parallel.py``; only right in a PyTorch file (``Bindings.canonical`` decides).
    """
    if qualified in _ALIASES:
        return _ALIASES[qualified]
    module, _, name = qualified.rpartition(".")
    # torch.nn re-exports every class of its submodules: `torch.nn.modules.loss.MSELoss` is `torch.nn.MSELoss`.
    if module.startswith("torch.nn.modules") and name[:1].isupper():
        return f"torch.nn.{name}"
    # PyTorch-Encoding's pair, from `encoding.parallel` or from a vendored copy of its `parallel.py`.
    if name in _ENCODING_NAMES and (module == _ENCODING_MODULE or (vendored_encoding and _may_be_vendored(module))):
        return _ENCODING_NAMES[name]
    return qualified


def _top_level(module: str) -> str:
    """The top-level package of an absolute module name; "" for a relative one (``.utils.parallel``)."""
    return module.split(".")[0]


def _may_be_vendored(module: str) -> bool:
    """Whether ``module`` may be a copy of PyTorch-Encoding's ``parallel.py`` kept in the user's own code: a
    module called ``parallel`` that is not part of torch, of the runtime, or of another framework."""
    top = _top_level(module)
    return module.split(".")[-1] == "parallel" and top not in ("torch", "mgpu_runtime") and top not in NON_TORCH_FRAMEWORKS


@dataclass
class Bindings:
    """Every binding of every name in a file: imports by qualified name, anything else as local."""

    imported: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    local: set[str] = field(default_factory=set)
    # The import statements and aliases that bind each name, for removing the ones a rewrite leaves unused.
    import_aliases: dict[str, list[tuple[cst.CSTNode, cst.ImportAlias]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # Modules imported with `from module import *`: they may bind any name the file does not bind itself.
    star_modules: set[str] = field(default_factory=set)
    # Whether a `parallel` module of the user's own may be a vendored copy of PyTorch-Encoding's: set once the
    # whole file is read (``imports_torch_only``).
    vendored_encoding: bool = False
    # Modules of the project that hold a copy of PyTorch-Encoding's pair under another name
    # (``utils.encoding``), recognized by reading them (``analysis.project``).
    encoding_modules: frozenset[str] = frozenset()
    # Modules of the project holding the Synchronized-BatchNorm package's ``DataParallelWithCallback``.
    callback_modules: frozenset[str] = frozenset()
    # What a name bound by none of the file's statements comes from, when the project's copies of the modules it
    # star-imports tell (``analysis.project.star_resolver``); None without star imports or a project.
    star_resolver: Callable[[str], str | None] | None = None

    def imports_torch_only(self) -> bool:
        """Whether the file imports PyTorch (``torch`` or a package named after it: ``torchvision`` ...) and no
        other framework (``NON_TORCH_FRAMEWORKS``)."""
        tops = {_top_level(origin) for origins in self.imported.values() for origin in origins}
        tops |= {_top_level(module) for module in self.star_modules}
        return any(top.startswith("torch") for top in tops) and not tops & NON_TORCH_FRAMEWORKS

    def canonical(self, qualified: str) -> str:
        """``canonical`` for a name of this file (its own ``parallel`` module is PyTorch-Encoding's only in a
        PyTorch file)."""
        module, _, name = qualified.rpartition(".")
        if name in _ENCODING_NAMES and module in self.encoding_modules:
            return _ENCODING_NAMES[name]
        if name == "DataParallelWithCallback" and module in self.callback_modules:
            return CALLBACK_DATA_PARALLEL
        return canonical(qualified, self.vendored_encoding)

    def qualified_name(self, name: str) -> str | None:
        """The one qualified name ``name`` is imported as, or None when it is local or ambiguous."""
        origins = self.imported.get(name)
        if not origins and name not in self.local:
            return self._from_star_import(name)
        if not origins or name in self.local or len(origins) != 1:
            return None
        return next(iter(origins))

    def _from_star_import(self, name: str) -> str | None:
        # Only the names the tool migrates are taken from a star import: what else such a module binds
        # is not known without importing it.
        found = {self.canonical(f"{module}.{name}") for module in self.star_modules} & MIGRATED_NAMES
        if len(found) == 1:
            return found.pop()
        if found:
            return None
        resolved = self.star_resolver(name) if self.star_resolver is not None else None
        exported = {f"{module}.{name}" for module in self.star_modules if name in _LIBRARY_STAR_EXPORTS.get(module, ())}
        if exported:
            # One library's known export (speech-commands' `from tqdm import *`), unless a module of the project
            # star-imported beside it binds the name to something else.
            only = exported.pop() if len(exported) == 1 else None
            return only if only is not None and (resolved is None or self.canonical(resolved) == only) else None
        return self.canonical(resolved) if resolved is not None else None

    def star_sources(self, name: str) -> list[str]:
        """The star imports (``from mytools import *``) that may be where ``name`` comes from, when nothing
        else in the file binds it."""
        if name in self.imported or name in self.local:
            return []
        return [f"from {module} import *" for module in sorted(self.star_modules)]

    def is_ambiguous(self, name: str) -> bool:
        origins = self.imported.get(name, ())
        return bool(origins) and (name in self.local or len(origins) > 1)


def _dotted(node: cst.BaseExpression) -> str | None:
    if type(node) is cst.Name:
        return node.value
    if type(node) is cst.Attribute:
        base = _dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def _relative_prefix(node: cst.ImportFrom) -> str:
    return "." * len(node.relative)


def record_import(bindings: Bindings, node: cst.Import | cst.ImportFrom) -> None:
    """Add the names an import statement binds to ``bindings`` (the walk of ``scopes.FlowCollector`` calls this)."""
    if type(node) is cst.Import:
        for alias in node.names:
            dotted = _dotted(alias.name)
            if dotted is None:
                continue
            if alias.asname is not None and type(alias.asname.name) is cst.Name:
                bound, qualified = alias.asname.name.value, dotted
            else:
                bound = qualified = dotted.split(".")[0]
            _import(bindings, bound, qualified, node, alias)
        return
    module = _dotted(node.module) if node.module is not None else ""
    prefix = _relative_prefix(node) + (module or "")
    if type(node.names) is cst.ImportStar:
        bindings.star_modules.add(prefix)
        return
    for alias in node.names:
        if type(alias.name) is not cst.Name:
            continue
        name = alias.name.value
        bound = alias.asname.name.value if alias.asname and type(alias.asname.name) is cst.Name else name
        _import(bindings, bound, canonical(f"{prefix}.{name}") if prefix else name, node, alias)


def _import(bindings: Bindings, bound: str, qualified: str, statement: cst.CSTNode, alias: cst.ImportAlias) -> None:
    bindings.imported[bound].add(qualified)
    bindings.import_aliases[bound].append((statement, alias))


def names_in_target(target: cst.BaseExpression) -> list[str]:
    """The names a binding target binds: ``a``, ``b`` and ``c`` in ``a, (b, *c) = ...``."""
    if type(target) is cst.Name:
        return [target.value]
    if type(target) in (cst.Tuple, cst.List):
        return [name for element in target.elements for name in names_in_target(element.value)]
    if type(target) is cst.StarredElement:
        return names_in_target(target.value)
    return []


def resolve(bindings: Bindings, node: cst.BaseExpression) -> str | None:
    """The canonical qualified name an expression such as ``nn.parallel.DataParallel`` refers to."""
    dotted = _dotted(node)
    if dotted is None:
        return None
    head, _, rest = dotted.partition(".")
    base = bindings.qualified_name(head)
    if base is None:
        return None
    return bindings.canonical(f"{base}.{rest}" if rest else base)


def head_name(node: cst.BaseExpression) -> str | None:
    """The leftmost name of a dotted expression (``nn`` for ``nn.parallel.DataParallel``)."""
    while type(node) is cst.Attribute:
        node = node.value
    return node.value if type(node) is cst.Name else None
