"""Whether a training script's program builds its loader on torch 0.4's DataLoader iterator, so that it cannot
run on the torch the runtime needs.

RCAN and the EDSR code it grew from wrote their own multi-scale loader (``MSDataLoader``) by deriving its iterator
from torch's private ``torch.utils.data.dataloader._DataLoaderIter`` and its worker loop. torch 1.2 replaced that
class (``_SingleProcessDataLoaderIter``, ``_MultiProcessingDataLoaderIter``) and its helpers, so the import fails
and no part of the program runs on torch 2.13, the runtime's lowest release: there is no run of the original to
keep, nor one that ``mgpu-migrate verify`` could compare with.

Read as Python imports the program: the script's unconditional top-level imports, and those of the project modules
they import, in turn (``main.py`` -> ``data/__init__.py`` -> ``dataloader.py``), each module once. An import under
``try``/``if`` (a fallback for newer releases) is not followed, since the program may run without it.
"""

from __future__ import annotations

import ast
import os
from functools import lru_cache
from typing import NamedTuple

from mgpu_migrate import files
from mgpu_migrate.analysis.project import project_of

_LOADER_MODULE = "torch.utils.data.dataloader"
# torch 0.4's DataLoader iterator, the base of a loader's own iterator: gone since torch 1.2.
_OLD_ITERATOR = "_DataLoaderIter"
_MODULES_READ = 200  # at most this many of the project's modules are read per script
_MODULE_BYTES = 1 << 20


class OldLoader(NamedTuple):
    """The import of torch 0.4's iterator: the module's path and the line."""

    path: str
    line: int

    def where(self, seen_from: str) -> str:
        return f"{os.path.relpath(self.path, seen_from)}:{self.line}"


def old_loader(script: str) -> OldLoader | None:
    """The first import of ``torch.utils.data.dataloader._DataLoaderIter`` that running ``script`` executes,
    in the script or in a project module it imports (unconditionally, at any depth), or None."""
    project = project_of(script)
    if project is None:
        return None
    queue = [(os.path.abspath(script), "")]
    seen = {queue[0][0]}
    while queue and len(seen) <= _MODULES_READ:
        path, package = queue.pop(0)
        for node in _top_level_imports(path):
            if isinstance(node, ast.ImportFrom):
                if node.module == _LOADER_MODULE and any(alias.name == _OLD_ITERATOR for alias in node.names):
                    return OldLoader(path, node.lineno)
                base = node.module or ""
                # `from data import loaders` may name the module `data` or its submodule `data.loaders`
                imports = [(base, node.level)] + [
                    (f"{base}.{a.name}" if base else a.name, node.level) for a in node.names
                ]
            else:
                imports = [(alias.name, 0) for alias in node.names]
            for name, level in imports:
                if not level and (name == "torch" or name.startswith("torch.")):
                    continue
                module = project.module(name, level, package)
                if module is not None and os.path.abspath(module.path) not in seen:
                    seen.add(os.path.abspath(module.path))
                    queue.append((os.path.abspath(module.path), module.package))
    return None


@lru_cache(maxsize=256)
def _top_level_imports(path: str) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """The imports a module runs whenever it is imported: its top-level ones, outside ``try`` and ``if``."""
    try:
        tree = ast.parse(files.read(path, _MODULE_BYTES)[0], path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    return tuple(node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)))
