"""A model that a project class holds, trained by the subclasses that the project's other modules define.

st-gcn's ``processor/io.py``: class ``IO`` builds the model and keeps it wrapped on ``self`` (``self.model =
nn.DataParallel(self.model)``); ``processor/recognition.py`` derives from it (through ``Processor``) and trains:
its loader, its loop, its backward pass. The file that wraps migrates when the modules whose classes derive from
the holder all train the model and all migrate (``engine.held_programs`` makes each of them a program that
trains the held model: loaders split, side effects made once). Found by the bounded byte search of the
project's tree that finds a module's importers (``project.importers``); each verdict is that module's own
migration's, so every file of the program reaches the same one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

from mgpu_migrate.analysis.project import importers
from mgpu_migrate.options import DEFAULT_OPTIONS, Options

_LEVELS = 4
_CLASS = re.compile(rb"^[ \t]*class[ \t]+(\w+)[ \t]*\(([^)]*)\)[ \t]*:", re.MULTILINE)


@dataclass(frozen=True)
class Subclass:
    """A class of another module of the project that derives from the holder (directly or through others)."""

    path: str
    line: int  # the line of its ``class`` statement
    name: str
    base: str  # the class it derives from
    trains: bool  # its module runs a backward pass (``.backward(``)

    def where(self, seen_from: str) -> str:
        return f"{os.path.relpath(self.path, seen_from)}:{self.line}"


@dataclass(frozen=True)
class HeldTraining:
    """What becomes of the model a class holds: ``migrates``, or ``why`` not (a message naming the site,
    ``module:line``)."""

    migrates: bool
    why: str = ""
    how: str = "derived"  # "built": the model's class is built by the importing modules, not derived from


def subclasses(path: str, name: str) -> list[Subclass]:
    """The classes of the project's other modules that derive from class ``name`` of the module at ``path``,
    directly or through each other (at most a few levels)."""
    found: list[Subclass] = []
    pending = [(path, name)]
    seen = {(os.path.abspath(path), name)}
    for _ in range(_LEVELS):
        following = []
        for module, holder in pending:
            for importer in importers(module, holder):
                if not _importable(importer.path):
                    continue
                data = _read(importer.path)
                for match in _CLASS.finditer(data):
                    if not re.search(rb"(?:^|[\s,.])" + holder.encode() + rb"\s*(?:,|$)", match.group(2)):
                        continue
                    derived = match.group(1).decode()
                    if (importer.path, derived) in seen:
                        continue
                    seen.add((importer.path, derived))
                    line = data.count(b"\n", 0, match.start()) + 1
                    found.append(Subclass(importer.path, line, derived, holder, b".backward(" in data))
                    following.append((importer.path, derived))
        pending = following
    return found


def between(path: str, holder: str) -> bool:
    """Whether a class of the module at ``path`` stands between a class of the module ``holder`` and a subclass
    that trains (st-gcn's ``Processor``: ``IO`` holds the wrap, ``REC_Processor(Processor)`` trains)."""
    path = os.path.abspath(path)
    for name in sorted(set(re.findall(rb"^[ \t]*class[ \t]+(\w+)", _read(holder), re.MULTILINE))):
        derived = subclasses(holder, name.decode())
        for sub in derived:
            if os.path.abspath(sub.path) == path and not sub.trains and _trained_below(sub, derived):
                return True
    return False


def _trained_below(sub: Subclass, derived: list[Subclass]) -> bool:
    below = [other for other in derived if other.base == sub.name and other.path != sub.path]
    return any(other.trains or _trained_below(other, derived) for other in below)


def stored_by_a_base(path: str, source: str, name: str) -> bool:
    """Whether a module defining a class the classes of the module at ``path`` derive from stores ``self.<name>``
    or an entry of it (st-gcn's ``self.data_loader['train'] = DataLoader(...)`` in ``Processor.load_data()``)."""
    from mgpu_migrate.engine import might_need_migration
    from mgpu_migrate.started import base_modules

    stored = re.compile(rb"\bself\." + re.escape(name.encode()) + rb"\s*(?:\[[^\]\n]*\]\s*)?=(?!=)")
    modules = base_modules(path, source.encode("utf-8", "surrogateescape"), might_need_migration)
    return any(stored.search(_read(module)) for module in modules)


def direct_users(path: str, name: str, derived: list[Subclass]) -> list[str]:
    """The modules (``path:line`` of their import) that import the module at ``path`` and name class ``name``
    without deriving from it: they build the model themselves."""
    modules = {sub.path for sub in derived}
    here = os.path.dirname(os.path.abspath(path))
    return [
        importer.where(here)
        for importer in importers(path, name)
        if importer.path not in modules
        and _importable(importer.path)
        and re.search(rb"\b" + name.encode() + rb"\b", _read(importer.path))
    ]


def held_training(
    path: str, name: str, options: Options = DEFAULT_OPTIONS, one_per_chosen: Optional[str] = None
) -> Optional[HeldTraining]:
    """Whether the model that class ``name`` of the module at ``path`` holds on ``self`` migrates with the
    subclasses that train it; None when no subclass of the project trains it (the modules importing the class
    then train it some other way). ``one_per_chosen``: the attribute holding the model (``model`` of
    ``self.model``) when the class gives the set-up the GPUs it chooses (``analysis.devices.chosen_in_method``),
    so that a subclass runs as one process per GPU chosen for it: then a subclass that does not train, and that
    reads of the wrapped model what DataParallel does not have (``self.model.extract_feature(...)``, st-gcn's
    demos), ran on one GPU alone in the original, and runs so still, as one process."""
    derived = subclasses(path, name)
    if not any(sub.trains for sub in derived):
        return None if derived else _built_training(path, name, options)
    here = os.path.dirname(os.path.abspath(path))
    users = direct_users(path, name, derived)
    if users:
        return HeldTraining(False, f"{users[0]} uses `{name}` itself, beside the subclasses that train it")
    # The cheap verdicts first (a subclass that does not train, one in between), then each module that trains.
    for sub in sorted(derived, key=lambda sub: sub.trains):
        if not sub.trains:
            if any(other.base == sub.name for other in derived):
                continue
            elif one_per_chosen is not None and _one_device_only(sub.path, one_per_chosen):
                continue  # with one GPU chosen for it: one process, unwrapped, as the original ran it
            else:
                why = "does not train it: every process would run it"
            return HeldTraining(False, f"`{sub.name}` ({sub.where(here)}) {why}")
        left = _not_a_program(sub.path, here, options)
        if left is not None:
            return HeldTraining(False, f"`{sub.name}` ({sub.where(here)}) trains it, and {left}")
    return HeldTraining(True)


def _not_a_program(module: str, here: str, options: Options) -> Optional[str]:
    """Why a module that trains the held model does not become its program (it is left, naming its first site left;
    no script imports it), or None when it does. A module that asked about the holder migrates if the holder does
    (its own migration says what else it needs)."""
    from mgpu_migrate.engine import being_decided, migration_of  # each module's verdict is its own migration's

    assumed = being_decided(module)
    result = None if assumed else migration_of(module, options)
    if not assumed and (result is None or not result.changed or result.error is not None):
        vetoes = [d for d in (result.diagnostics if result is not None else []) if d.needs_review]
        first = vetoes[0] if vetoes else None
        return "is left" + (f" ({os.path.relpath(first.path, here)}:{first.line}: {first.code})" if first is not None else "")
    if not _started(module):
        return "no script imports it: no place for the set-up"
    return None


def _built_training(path: str, name: str, options: Options) -> Optional[HeldTraining]:
    """For a class that keeps its own wrap and that no class of the project derives from (CMC's ``MyAlexNetCMC``:
    ``self.encoder = nn.DataParallel(self.encoder)`` in its ``__init__``): it migrates when every module of the
    project that builds it (calls it by name) trains it (a backward pass) and migrates, each as a program that
    trains the model this class holds (``engine.held_programs``); None when no module builds it."""
    call = re.compile(rb"(?<![\w.])" + re.escape(name.encode()) + rb"\s*\(")
    users = [importer for importer in importers(path, name) if _importable(importer.path) and call.search(_read(importer.path))]
    if not users:
        return None
    here = os.path.dirname(os.path.abspath(path))
    for user in users:
        if not user.trains:
            return HeldTraining(False, f"{user.where(here)} builds it and does not train it: every process would run it", "built")
    for user in users:
        why = _not_a_program(user.path, here, options)
        if why is not None:
            return HeldTraining(False, f"{user.where(here)} builds and trains it, and {why}", "built")
    return HeldTraining(True, how="built")


# What a DataParallel wrap has of its own (nn.Module's public names and DataParallel's): any other attribute of
# the wrapped model read through the wrap (``self.model.extract_feature``) fails, as DataParallel does not forward.
_WRAP_ATTRIBUTES = frozenset(
    {
        "T_destination", "add_module", "apply", "bfloat16", "buffers", "call_super_init", "children", "compile",
        "cpu", "cuda", "device_ids", "dim", "double", "dump_patches", "eval", "extra_repr", "float", "forward",
        "gather", "get_buffer", "get_extra_state", "get_parameter", "get_submodule", "half", "ipu",
        "load_state_dict", "module", "modules", "mtia", "named_buffers", "named_children", "named_modules",
        "named_parameters", "output_device", "parallel_apply", "parameters", "register_backward_hook",
        "register_buffer", "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
        "register_full_backward_pre_hook", "register_load_state_dict_post_hook",
        "register_load_state_dict_pre_hook", "register_module", "register_parameter",
        "register_state_dict_post_hook", "register_state_dict_pre_hook", "replicate", "requires_grad_", "scatter",
        "set_extra_state", "set_submodule", "share_memory", "src_device_obj", "state_dict", "to", "to_empty",
        "train", "training", "type", "xpu", "zero_grad"
    }
)


def _one_device_only(module: str, attribute: str) -> bool:
    """Whether the module reads, through ``self.<attribute>``, something of the wrapped model that a DataParallel
    wrap does not have (``self.model.extract_feature(data)``, ``self.model.graph``): its classes could run the
    model on one GPU only, where it is not wrapped."""
    reads = re.findall(rb"\bself\." + re.escape(attribute.encode()) + rb"\.([A-Za-z]\w*)", _read(module))
    return any(read.decode() not in _WRAP_ATTRIBUTES for read in reads)


def _started(module: str) -> bool:
    """Whether the module is a script, or a script of the project imports it where the engine finds the modules a
    script starts (``started.candidates``): there ``mgpu_runtime.setup()`` runs before anything touches CUDA."""
    from mgpu_migrate.engine import might_start_module
    from mgpu_migrate.started import candidates, is_script

    if is_script(_read(module), module):
        return True
    name = os.path.basename(module)[: -len(".py")]
    for importer in importers(module, name):
        data = _read(importer.path)
        if _importable(importer.path) and is_script(data, importer.path) and module in candidates(importer.path, data, might_start_module):
            return True
    return False


def _importable(path: str) -> bool:
    """A file Python can import as a module (not ``train.ddp.py``, a copy beside it)."""
    return os.path.basename(path)[: -len(".py")].isidentifier()


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(1 << 20)
    except OSError:
        return b""


def set_up_where_chosen(modules: tuple[str, ...], options: Options = DEFAULT_OPTIONS) -> Optional[str]:
    """The module (its path) holding the wrap whose model one of ``modules`` trains (or one of them), when its
    migration calls ``mgpu_runtime.setup(devices=...)`` in the method that chooses the GPUs (st-gcn's ``IO.init_environment()``,
    ``analysis.devices.chosen_in_method``): the program's set-up is there, and the script starting ``modules``
    must not set up first, on every visible GPU, before the command line it hands the class is read."""
    from mgpu_migrate.engine import being_decided, migration_of, might_need_migration
    from mgpu_migrate.program import SETUP
    from mgpu_migrate.started import held_by

    for module in modules:
        # ``modules`` are those the script starts (the holders' are found through them), or the holders whose
        # model the script trains itself.
        for holder in (module, *held_by(module, _read(module), might_need_migration)):
            if being_decided(holder):
                continue  # the module asking holds no set-up of its own while the class asks about it
            result = migration_of(holder, options)
            if result is not None and result.changed and any(
                diagnostic.code == SETUP.code and diagnostic.path == holder for diagnostic in result.diagnostics
            ):
                return holder
    return None

