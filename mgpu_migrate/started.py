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
from collections.abc import Callable

from mgpu_migrate import files

# As project reading finds a project (``analysis/project.py``): the nearest directory holding one of these. This
# module reads bytes and paths only, so that screening a file never loads the parser.
_ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
_MAX_LEVELS = 12

_MAIN = re.compile(rb"^if\s+__name__\s*==\s*['\"]__main__['\"]\s*:", re.MULTILINE)
# A flat script: its command line parsed by a statement of the module itself (decision-transformer's
# ``args = parser.parse_args()`` at the top of ``run_dt_atari.py``, which then builds and runs the trainer).
_FLAT_SCRIPT = re.compile(rb"^(?:[\w, ]+=[ \t]*)?\w+\.parse_(?:known_)?args\(", re.MULTILINE)
_IMPORTS = re.compile(
    rb"^[ \t]*(?:from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+\(?([\w., \t*]+)|import[ \t]+([\w., \t]+))", re.MULTILINE
)
_MODULE_BYTES = 1 << 20


def has_main_block(data: bytes) -> bool:
    return _MAIN.search(data) is not None


def is_script(data: bytes) -> bool:
    """A script: a main block, or a flat script that parses its command line at module level."""
    return has_main_block(data) or _FLAT_SCRIPT.search(data) is not None


def candidates(path: str, data: bytes, might_migrate: Callable[[bytes], bool]) -> tuple[str, ...]:
    """The project modules a script (:func:`is_script`) imports (directly, or re-exported by a package it
    imports) that may hold a migration site and are no scripts themselves; () for anything else."""
    return tuple(module for module, text in _modules(path, data) if might_migrate(text))


def trained_apart(path: str, data: bytes, started: tuple[str, ...]) -> tuple[str, ...]:
    """The project modules a script imports, as :func:`candidates` finds them, that run a backward pass
    (``.backward(`` in their bytes) and are neither among ``started`` (the modules its migration makes
    distributed programs) nor imported by one of them (a helper of their training, ``utils/train.py``):
    training the script may start apart from those programs (ncsn's other runners, picked by name)."""
    directory = os.path.dirname(os.path.abspath(path))
    root = _root(directory)
    bases = tuple(dict.fromkeys((directory, _above_package(directory), *((root,) if root is not None else ()))))
    helpers = {os.path.abspath(module) for module in started}
    for module in started:
        helpers.update(_imported(_read(module), os.path.dirname(os.path.abspath(module)), bases))
    return tuple(module for module, text in _modules(path, data) if b".backward(" in text and module not in helpers)


def _modules(path: str, data: bytes) -> list[tuple[str, bytes]]:
    """The project modules a script imports, with their bytes, but those that are scripts themselves."""
    if not is_script(data) or b"import" not in data:
        return []
    directory = os.path.dirname(os.path.abspath(path))
    root = _root(directory)
    bases = tuple(dict.fromkeys((directory, _above_package(directory), *((root,) if root is not None else ()))))
    found: dict[str, bytes] = {}
    for module in _imported(data, directory, bases):
        for inner in (module, *(_imported(_read(module), os.path.dirname(module), bases) if module.endswith("__init__.py") else ())):
            if inner == os.path.abspath(path) or inner in found:
                continue
            text = _read(inner)
            if not is_script(text):
                found[inner] = text
    return list(found.items())


# A class statement and the bases it derives from (``class Trainer(Base):``, ``class Trainer(base.Base, object):``).
_CLASS = re.compile(rb"^[ \t]*class[ \t]+(\w+)[ \t]*\(([^)]*)\)[ \t]*:", re.MULTILINE)
_HELD_LEVELS = 4


def held_by(path: str, data: bytes, might_migrate: Callable[[bytes], bool]) -> tuple[str, ...]:
    """The project modules that may hold a migration site in a class that a class of this module derives from,
    directly or through project classes in between (st-gcn's ``REC_Processor(Processor)``, ``Processor(IO)``,
    IO's ``self.model = nn.DataParallel(...)``): the modules whose wrapped model this one may train. Read from
    bytes and paths alone, as the candidates of a script are."""
    directory = os.path.dirname(os.path.abspath(path))
    root = _root(directory)
    bases = tuple(dict.fromkeys((directory, _above_package(directory), *((root,) if root is not None else ()))))
    found: list[str] = []
    seen = {os.path.abspath(path)}
    pending = [(data, directory, [name for _, names in _CLASS.findall(data) for name in _base_names(names)])]
    for _ in range(_HELD_LEVELS):
        following = []
        for text, here, names in pending:
            for name in names:
                module = _defining(text, here, bases, name)
                if module is None or module in seen:
                    continue
                seen.add(module)
                defined = _read(module)
                if might_migrate(defined):
                    found.append(module)
                    continue
                inner = [base for cls, names in _CLASS.findall(defined) if cls.decode() == name for base in _base_names(names)]
                if inner:
                    following.append((defined, os.path.dirname(module), inner))
        pending = following
    return tuple(found)


def _base_names(text: bytes) -> list[str]:
    """The names of the classes a ``class`` statement derives from (the last part of a dotted one)."""
    names = []
    for base in text.split(b","):
        base = base.strip()
        if base and b"=" not in base and re.fullmatch(rb"[\w.]+", base):
            names.append(base.rsplit(b".", 1)[-1].decode())
    return names


def _defining(data: bytes, here: str, bases: tuple[str, ...], name: str) -> str | None:
    """The file of the project module that ``data`` imports ``name`` from (``from processors.base import
    Base``, a relative ``from .base import Base``), or whose module it names (``base.Base``)."""
    for dots, source, names, plain in _IMPORTS.findall(data):
        imported = [part.strip().split()[0].decode() for part in (names or plain).split(b",") if part.strip() and part.strip() != b"*"]
        module = source.decode()
        where = bases
        if dots:
            up = here
            for _ in range(len(dots) - 1):
                up = os.path.dirname(up)
            where = (up,)
        if not plain and name in imported and module:
            found = _module_file(module, where)
            if found is not None and re.search(rb"^[ \t]*class[ \t]+" + name.encode() + rb"\b", _read(found), re.MULTILINE):
                return found
        for part in imported:
            # ``from processors import base`` / ``import processors.base``: the class is ``base.Base``.
            dotted = f"{module}.{part}" if module and not plain else part
            found = _module_file(dotted, where)
            named = re.search(rb"\b" + dotted.rsplit(".", 1)[-1].encode() + rb"\." + name.encode() + rb"\b", data)
            if named and found is not None and re.search(rb"^[ \t]*class[ \t]+" + name.encode() + rb"\b", _read(found), re.MULTILINE):
                return found
    return None


def _root(directory: str) -> str | None:
    current = directory
    for _ in range(_MAX_LEVELS):
        if any(os.path.exists(os.path.join(current, marker)) for marker in _ROOT_MARKERS):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent
    return None


def _above_package(directory: str) -> str:
    current = directory
    for _ in range(_MAX_LEVELS):
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
    return found


def _module_file(module: str, bases: tuple[str, ...]) -> str | None:
    for base in bases:
        relative = os.path.join(base, *module.split("."))
        for candidate in (relative + ".py", os.path.join(relative, "__init__.py")):
            if os.path.isfile(candidate):
                return os.path.abspath(candidate)
    return None
