"""The script that starts a program whose training module holds the DataParallel wrap (``--to ddp``).

A real project often trains in a module with no entry point of its own: ncsn's ``main.py`` parses the command
line, resets the log folder and builds a runner of ``runners/`` (``from runners import *``), whose ``train()``
wraps the model and loops. The runner becomes the distributed program, yet every process runs ``main.py`` from
its first line: its side effects (the reset, the config written) happen once per process, and
``mgpu_runtime.setup()`` belongs at its main block. So a script with a main block and no DataParallel of its
own that imports such a module is migrated too, as that program's entry point; so is a flat script that parses
its command line at module level (decision-transformer's ``run_dt_atari.py``, whose ``Trainer`` wraps), the
set-up then after its imports.

This module finds the candidates from bytes and paths alone (a regular expression over the imports, the
project's modules resolved on disk, the bytes screen of each), following a package's ``__init__`` one level (its
re-exports, ``from runners.anneal_runner import *``). Whether a candidate really becomes a distributed program
is its migration's verdict, which the engine asks for (``engine.started_programs``). It reads bytes and paths
only (not ``analysis/``), so the screen of a file never loads the parser.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator

from mgpu_migrate import files

# As project reading finds a project (``analysis/project.py``): the nearest directory holding one of these. This
# module reads bytes and paths only, so that screening a file never loads the parser.
ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
# How far above a file its project root is looked for.
MAX_LEVELS = 12

_MAIN = re.compile(rb"^if\s+__name__\s*==\s*['\"]__main__['\"]\s*:", re.MULTILINE)
# A flat script: its command line parsed by a statement of the module itself (decision-transformer's
# ``args = parser.parse_args()`` at the top of ``run_dt_atari.py``, which then builds and runs the trainer).
_PARSES = (b".parse_args(", b".parse_known_args(")
_FLAT_SCRIPT = re.compile(rb"(?:\w[\w, ]*=[ \t]*)?\w+\.parse_(?:known_)?args\(")
_IMPORTS = re.compile(
    rb"^[ \t]*(?:from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+\(?([\w., \t*]+)|import[ \t]+([\w., \t]+))", re.MULTILINE
)
# A class or module named by its dotted path to a loader of the script's own (st-gcn's main.py:
# ``import_class('processor.recognition.REC_Processor')``, ``importlib.import_module('models.resnet')``).
_IMPORTED_BY_NAME = re.compile(rb"""\bimport_\w+\s*\(\s*['"]([A-Za-z_][\w.]*)['"]""")
_MODULE_BYTES = 1 << 20


def has_main_block(data: bytes) -> bool:
    return _MAIN.search(data) is not None


def parses_at_module_level(data: bytes) -> bool:
    """A statement of the module itself (no indentation) parses the command line (``args = parser.parse_args()``).
    Found from the calls' bytes, each one's line checked alone: no pattern runs over a large file."""
    for call in _PARSES:
        at = data.find(call)
        while at != -1:
            start = data.rfind(b"\n", 0, at) + 1
            if _FLAT_SCRIPT.fullmatch(data, start, at + len(call)):
                return True
            at = data.find(call, at + 1)
    return False


def is_script(data: bytes, path: str | None = None) -> bool:
    """A script: a main block, a flat script that parses its command line at module level, or (given its
    ``path``) a module whose function the project installs as a command (:func:`console_function`)."""
    return (
        (b"__main__" in data and has_main_block(data))
        or parses_at_module_level(data)
        or (path is not None and b"def " in data and console_function(path) is not None)
    )


# A console script's target in a project's packaging (``'bert = bert_pytorch.__main__:train'`` in setup.py's
# ``entry_points``, ``bert = "bert_pytorch.__main__:train"`` under pyproject's ``[project.scripts]``, a line of
# setup.cfg's ``console_scripts =``): the module and its function.
_CONSOLE_TARGET = re.compile(r"""^[\s'"]*[\w.-]+\s*=\s*['"]?([A-Za-z_][\w.]*)\s*:\s*([A-Za-z_]\w*)\s*['"]?\s*,?\s*$""")
# Where the commands are listed: setup.py's ``'console_scripts': [...]`` (or a string of lines), setup.cfg's
# ``console_scripts =`` and the indented lines after it, pyproject's ``[project.scripts]`` or
# ``[tool.poetry.scripts]`` table (up to the next table).
_CONSOLE_SECTIONS = {
    "setup.py": re.compile(r"""['"]console_scripts['"]\s*:\s*(\[[^\]]*\]|'{3}.*?'{3}|"{3}.*?"{3}|'[^']*'|"[^"]*")""", re.DOTALL),
    "setup.cfg": re.compile(r"^console_scripts\s*=([^\n]*(?:\n[ \t]+[^\n]*)*)", re.MULTILINE),
    "pyproject.toml": re.compile(r"^\[(?:project|tool\.poetry)\.scripts\][ \t]*\n(.*?)(?=^\[|\Z)", re.MULTILINE | re.DOTALL),
}
_CONSOLE: dict[str, dict[str, str]] = {}


def console_function(path: str) -> str | None:
    """The function of the module at ``path`` that its project installs as a command (a console script), which
    then runs as the program's main function: BERT-pytorch's ``bert_pytorch/__main__.py`` has no main block, and
    its ``train()`` is the ``bert`` command. None when the module is no such target."""
    path = os.path.abspath(path)
    for directory in upward(os.path.dirname(path)):
        if any(os.path.isfile(os.path.join(directory, name)) for name in _CONSOLE_SECTIONS):
            return _console_targets(directory).get(path)
        if is_project_root(directory):
            return None
    return None


def _console_targets(root: str) -> dict[str, str]:
    """Each console script's module file under ``root`` (or ``root/src``), with its function; read once per run."""
    targets = _CONSOLE.get(root)
    if targets is None:
        targets = {}
        for name, section in _CONSOLE_SECTIONS.items():
            try:
                text = files.read(os.path.join(root, name))[0][:_MODULE_BYTES].decode("utf-8", "replace")
            except OSError:
                continue
            for listed in section.findall(text):
                # Each ``command = module:function``, split at lines, commas and brackets (setup.py's list).
                for line in re.split(r"[\n,\[\]]", listed):
                    match = _CONSOLE_TARGET.match(line)
                    if match is None:
                        continue
                    module, function = match.groups()
                    found = _module_file(module, (root, os.path.join(root, "src")))
                    if found is not None:
                        targets.setdefault(found, function)
        _CONSOLE[root] = targets
    return targets


def candidates(path: str, data: bytes, might_migrate: Callable[[bytes], bool]) -> tuple[str, ...]:
    """The project modules a script (:func:`is_script`) imports (directly, or re-exported by a package it
    imports) that may hold a migration site and are no scripts themselves; () for anything else."""
    return tuple(module for module, text in _modules(path, data) if might_migrate(text))


def wrapping_importers(path: str, might_migrate: Callable[[bytes], bool]) -> tuple[str, ...]:
    """The project's modules that may hold a migration site (``might_migrate``) and import the module at ``path``:
    those that may hand its training code a wrapped model (``engine.handed_programs``). Each tree's wrapping
    modules and what they import are read once per run, from bytes, so the question costs a lookup per module."""
    from mgpu_migrate.analysis.project import search_top

    top = search_top(path)
    index = _WRAPPING.get(top)
    if index is None:
        from mgpu_migrate.analysis.project import script_paths, searched_tree

        index = {}
        for module, data in searched_tree(top):
            if might_migrate(data):
                here = os.path.dirname(module)
                # Also where the module puts itself on sys.path (HRNet's tools/train.py: `import _init_paths`, which
                # inserts ../lib, then `from core.function import train`).
                bases = tuple(dict.fromkeys((*_bases(here), *script_paths(module))))
                for imported in _imported(data, here, bases):
                    index.setdefault(imported, []).append(module)
        _WRAPPING[top] = index
    return tuple(index.get(os.path.abspath(path), ()))


_WRAPPING: dict[str, dict[str, list[str]]] = {}


def trained_apart(path: str, data: bytes, started: tuple[str, ...]) -> tuple[str, ...]:
    """The project modules a script imports, as :func:`candidates` finds them, that run a backward pass
    (``.backward(`` in their bytes) and are neither among ``started`` (the modules its migration makes
    distributed programs) nor imported by one of them (a helper of their training, ``utils/train.py``):
    training the script may start apart from those programs (ncsn's other runners, picked by name)."""
    directory = os.path.dirname(os.path.abspath(path))
    bases = _bases(directory)
    helpers = {os.path.abspath(module) for module in started}
    for module in started:
        helpers.update(_imported(_read(module), os.path.dirname(os.path.abspath(module)), bases))
    return tuple(module for module, text in _modules(path, data) if b".backward(" in text and module not in helpers)


def _modules(path: str, data: bytes) -> list[tuple[str, bytes]]:
    """The project modules a script imports, with their bytes, but those that are scripts themselves."""
    if not is_script(data, path) or b"import" not in data:
        return []
    directory = os.path.dirname(os.path.abspath(path))
    bases = _bases(directory)
    found: dict[str, bytes] = {}
    for module in _imported(data, directory, bases):
        for inner in (module, *(_imported(_read(module), os.path.dirname(module), bases) if module.endswith("__init__.py") else ())):
            if inner == os.path.abspath(path) or inner in found:
                continue
            text = _read(inner)
            if not is_script(text, inner):
                found[inner] = text
    return list(found.items())


# A class statement and the bases it derives from (``class Trainer(Base):``, ``class Trainer(base.Base, object):``).
_CLASS = re.compile(rb"^[ \t]*class[ \t]+(\w+)[ \t]*\(([^)]*)\)[ \t]*:", re.MULTILINE)
_HELD_LEVELS = 4


def held_by(path: str, data: bytes, might_migrate: Callable[[bytes], bool]) -> tuple[str, ...]:
    """The project modules that may hold a migration site in a class that a class of this module derives from,
    directly or through project classes in between (st-gcn's ``REC_Processor(Processor)``, ``Processor(IO)``,
    IO's ``self.model = nn.DataParallel(...)``): the modules whose wrapped model this one may train. Read from
    bytes and paths alone, as the candidates of a script are: each base is looked up through the one import
    that binds its name, so a module with many imports and classes costs a few dictionary lookups."""
    return _walk_bases(path, data, might_migrate)[0]


def built_holders(path: str, data: bytes, might_migrate: Callable[[bytes], bool]) -> tuple[str, ...]:
    """The project modules that may hold a migration site in a class this module builds by a name it imports
    (CMC's ``train_CMC.py``: ``from models.alexnet import MyAlexNetCMC``, then ``model = MyAlexNetCMC(...)``,
    a class whose ``__init__`` keeps ``self.encoder = nn.DataParallel(...)``), and that train nothing themselves
    (no ``.backward(``): the modules whose wrapped model this one may train. Read from bytes and paths alone, each
    class looked up through the import binding its name."""
    if b"import" not in data:
        return ()
    directory = os.path.dirname(os.path.abspath(path))
    bases = _bases(directory)
    bindings = _bindings(data)
    read: dict[str, bytes] = {}
    found: list[str] = []
    for name, (_, _, original) in bindings.items():
        if not original or not re.search(rb"(?<![\w.])" + re.escape(name.encode()) + rb"\s*\(", data):
            continue
        module = _defining(bindings, directory, bases, name, read)
        if (
            module is not None
            and module != os.path.abspath(path)
            and module not in found
            and might_migrate(read[module])
            and b".backward(" not in read[module]
        ):
            found.append(module)
    return tuple(found)


def base_modules(path: str, data: bytes, might_migrate: Callable[[bytes], bool]) -> tuple[str, ...]:
    """The project modules :func:`held_by` passes through, up to the holders: those defining the classes this
    module's classes derive from (st-gcn's ``processor.py`` and ``io.py`` for ``recognition.py``)."""
    return _walk_bases(path, data, might_migrate)[1]


def _walk_bases(path: str, data: bytes, might_migrate: Callable[[bytes], bool]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    directory = os.path.dirname(os.path.abspath(path))
    bases = _bases(directory)
    found: list[str] = []
    seen = {os.path.abspath(path)}
    read: dict[str, bytes] = {}
    pending = [(data, directory, [base for _, names in _CLASS.findall(data) for base in _base_names(names)])]
    for _ in range(_HELD_LEVELS):
        following = []
        for text, here, dotted_names in pending:
            bindings = _bindings(text) if dotted_names else {}
            for dotted in dotted_names:
                module = _defining(bindings, here, bases, dotted, read)
                if module is None or module in seen:
                    continue
                seen.add(module)
                defined = read[module]
                if might_migrate(defined):
                    found.append(module)
                    continue
                name = dotted.rsplit(".", 1)[-1]
                inner = [base for cls, names in _CLASS.findall(defined) if cls.decode() == name for base in _base_names(names)]
                if inner:
                    following.append((defined, os.path.dirname(module), inner))
        pending = following
    return tuple(found), tuple(module for module in seen if module != os.path.abspath(path))


def _base_names(text: bytes) -> list[str]:
    """The classes a ``class`` statement derives from, as written (``Base``, ``base.Base``)."""
    names = []
    for base in text.split(b","):
        base = base.strip()
        if base and b"=" not in base and re.fullmatch(rb"[\w.]+", base):
            names.append(base.decode())
    return names


def _bindings(data: bytes) -> dict[str, tuple[str, str, str]]:
    """The names ``data``'s imports bind: ``from .base import Base as B`` binds ``B`` to ``(".", "base", "Base")``;
    ``import processors.base`` binds ``processors`` to ``("", "processors.base", "")``, and ``import a.b as x``
    binds ``x`` to ``("", "a.b", "")``."""
    bound: dict[str, tuple[str, str, str]] = {}
    for dots, source, names, plain in _IMPORTS.findall(data):
        for part in (names or plain).split(b","):
            words = part.strip().split()
            if not words or words[0] == b"*":
                continue
            original = words[0].decode()
            alias = words[2].decode() if len(words) == 3 and words[1] == b"as" else None
            if plain:
                bound[alias or original.split(".", 1)[0]] = ("", original, "")
            else:
                bound[alias or original] = (dots.decode(), source.decode(), original)
    return bound


def _defining(
    bindings: dict[str, tuple[str, str, str]], here: str, bases: tuple[str, ...], dotted: str, read: dict[str, bytes]
) -> str | None:
    """The file of the project module that defines the class a base names (``Base`` imported ``from
    processors.base import Base``, a relative ``from .base import Base``, or ``base.Base`` with ``base`` a module
    imported by name), when that file holds a ``class`` statement of that name; reads go through ``read``."""
    parts = dotted.split(".")
    binding = bindings.get(parts[0])
    if binding is None:
        return None
    dots, source, original = binding
    if original:  # from SOURCE import ORIGINAL; ``from processors import base``, then ``base.Base``
        module = source if len(parts) == 1 else ".".join(filter(None, [source, original, *parts[1:-1]]))
    else:  # import SOURCE [as NAME]
        if len(parts) == 1:
            return None
        module = ".".join([source, *parts[1:-1]]) if parts[0] != source.split(".", 1)[0] else ".".join(parts[:-1])
    if not module:
        return None
    where = bases
    if dots:
        up = here
        for _ in range(len(dots) - 1):
            up = os.path.dirname(up)
        where = (up,)
    found = _module_file(module, where)
    if found is None:
        return None
    if found not in read:
        read[found] = _read(found)
    return found if re.search(rb"^[ \t]*class[ \t]+" + parts[-1].encode() + rb"\b", read[found], re.MULTILINE) else None


def _bases(directory: str) -> tuple[str, ...]:
    """Where a module's imports are looked for: its own directory, the one above its package, the project root."""
    root = project_root(directory)
    return tuple(dict.fromkeys((directory, above_package(directory), *((root,) if root is not None else ()))))


def upward(directory: str) -> Iterator[str]:
    """``directory`` and those above it, nearest first, up to the file system's root or ``MAX_LEVELS`` of them."""
    for _ in range(MAX_LEVELS):
        yield directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return
        directory = parent


def is_project_root(directory: str) -> bool:
    return any(os.path.exists(os.path.join(directory, marker)) for marker in ROOT_MARKERS)


def project_root(directory: str) -> str | None:
    """The nearest directory at or above ``directory`` that holds one of ``ROOT_MARKERS``; with none, the nearest
    directory named on the command line at or above it (a project unpacked from an archive, with no ``.git``:
    ``mgpu-migrate hrnet/ --to ddp``); else None."""
    marked = next((each for each in upward(directory) if is_project_root(each)), None)
    if marked is not None or not _NAMED_ROOTS:
        return marked
    return next((each for each in upward(directory) if each in _NAMED_ROOTS), None)


_NAMED_ROOTS: frozenset[str] = frozenset()


def name_roots(directories: Iterable[str]) -> None:
    """The directories a run was given on its command line (or a benchmark's projects): the project roots of the
    files under them that no marker names (``project_root``). Called before any file is read."""
    global _NAMED_ROOTS
    named = _NAMED_ROOTS | {os.path.abspath(directory) for directory in directories if os.path.isdir(directory)}
    if named != _NAMED_ROOTS:
        _NAMED_ROOTS = frozenset(named)
        from mgpu_migrate.analysis import project

        project.forget_roots()


def named_roots() -> frozenset[str]:
    return _NAMED_ROOTS


def above_package(directory: str) -> str:
    """The directory above the package a directory belongs to (itself when it is no package), where
    ``import pkg.sub`` resolves when the project is run from its top."""
    current = directory
    for _ in range(MAX_LEVELS):
        if not os.path.exists(os.path.join(current, "__init__.py")):
            return current
        current = os.path.dirname(current)
    return current


def _read(path: str) -> bytes:
    try:
        return files.read(path, _MODULE_BYTES)[0]
    except OSError:
        return b""


def _imported(data: bytes, here: str, bases: tuple[str, ...]) -> list[str]:
    """The files of the project's modules that ``data``'s imports name (``from a.b import c``: ``a/b.py``, or
    ``a/b/c.py`` where ``c`` is a module; ``import a.b``: ``a/b.py``; relative imports from ``here``)."""
    found = []
    for dots, source, names, plain in _IMPORTS.findall(data):
        if plain:
            modules = [name.strip().split()[0].decode() for name in plain.split(b",") if name.strip()]
            where = bases
        else:
            base = source.decode()
            imported = [name.strip().split()[0].decode() for name in names.split(b",") if name.strip() and name.strip() != b"*"]
            modules = [base, *(f"{base}.{name}" if base else name for name in imported)] if base else imported
            if dots:
                up = here
                for _ in range(len(dots) - 1):
                    up = os.path.dirname(up)
                where = (up,)
            else:
                where = bases
        for module in modules:
            file = _module_file(module, where)
            if file is not None and file not in found:
                found.append(file)
    for dotted in _IMPORTED_BY_NAME.findall(data):
        name = dotted.decode()
        file = _module_file(name, bases) or (_module_file(name.rpartition(".")[0], bases) if "." in name else None)
        if file is not None and file not in found:
            found.append(file)
    return found


def _module_file(module: str, bases: tuple[str, ...]) -> str | None:
    for base in bases:
        relative = os.path.join(base, *module.split("."))
        for candidate in (relative + ".py", os.path.join(relative, "__init__.py")):
            if os.path.isfile(candidate):
                return os.path.abspath(candidate)
    return None
