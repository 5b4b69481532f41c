"""Jupyter notebooks (``.ipynb``), migrated as ruff lints them: their code cells, as one program.

The code cells are joined into one source, each after a boundary comment, so the rules see the whole
program (the imports in one cell, the training loop in another) and the rewrite is split back cell by cell.
Markdown and raw cells, outputs, execution counts and metadata are kept as they are; IPython magics
(``%time``, ``!pip``, ``x = !ls``, ``?obj``) are set aside before the rewrite and put back after it, and a
cell magic (``%%bash``) leaves its cell out altogether. Positions read ``nb.ipynb:cell N:line:col`` (the
notebook's N-th cell, counting every cell, and the line within it). A notebook whose cells cannot be
told apart after the rewrite, or that is no notebook, is left byte-identical.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

from mgpu_migrate import files
from mgpu_migrate.diagnostics import INTERNAL_ERROR, LINE_BREAK, READ_ERROR, Diagnostic
from mgpu_migrate.engine import migrate_source, might_need_migration
from mgpu_migrate.options import Options
from mgpu_migrate.output import diff_path
from mgpu_migrate.output.lines import moved_to_new_lines
from mgpu_migrate.report import CHANGED, FAILED, UNCHANGED, FileOutcome, changed_on_disk
from mgpu_migrate.results import unified_diff

SUFFIX = ".ipynb"
_BOUNDARY = "# %% mgpu-migrate cell {}"
_BOUNDARY_LINE = re.compile(r"^# %% mgpu-migrate cell (\d+)$")
_MAGIC = re.compile(r"^[ \t]*(?:[%!?]|[\w.]+[ \t]*=[ \t]*[%!])|^[^#\n]*\?[ \t]*$")
_PLACEHOLDER = "pass  # mgpu-migrate magic {}"
# A migrated notebook imports the runtime: its kernel installs it first (Colab and a fresh Jupyter lack it).
RUNTIME_INSTALL = "%pip install mgpu-runtime"
_RUNTIME_IMPORT = re.compile(r"^import mgpu_runtime$", re.M)
_INSTALLS_RUNTIME = re.compile(r"pip install\b.*\bmgpu[-_]runtime\b")
_RESTORE = re.compile(r"^([ \t]*)pass  # mgpu-migrate magic (\d+)$")


def cell_path(path: str, cell: int) -> str:
    return f"{path}:cell {cell}"


def _cell_text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _joined(cells: list[dict]) -> tuple[str, list[str]]:
    """The code cells as one source, each after its boundary comment; the magic lines set aside."""
    pieces, magics = [], []
    for number, cell in enumerate(cells, start=1):
        text = _cell_text(cell)
        if cell.get("cell_type") != "code" or text.lstrip().startswith("%%"):
            continue
        lines = []
        for line in LINE_BREAK.split(text):
            if _MAGIC.match(line):
                indent = line[: len(line) - len(line.lstrip(" \t"))]
                lines.append(indent + _PLACEHOLDER.format(len(magics)))
                magics.append(line)
            else:
                lines.append(line)
        pieces.append(_BOUNDARY.format(number) + "\n" + "\n".join(lines).rstrip("\n") + "\n")
    return "".join(pieces), magics


def _split(output: str, magics: list[str], expected: list[int]) -> dict[int, str] | None:
    """The rewritten code of each cell, magics put back; None unless every boundary survived, in order."""
    cells: dict[int, list[str]] = {}
    current: list[str] = []
    head: list[str] = []  # lines a rewrite put above the first boundary (an import) belong to the first cell
    order = []
    for line in LINE_BREAK.split(output):
        boundary = _BOUNDARY_LINE.match(line)
        if boundary:
            number = int(boundary[1])
            if number in cells:
                return None
            current = cells.setdefault(number, head if not cells else [])
            order.append(number)
            continue
        restored = _RESTORE.match(line)
        if restored:
            line = magics[int(restored[2])]
        (current if cells else head).append(line)
    if order != expected:
        return None
    return {number: "\n".join(lines).strip("\n") for number, lines in cells.items()}


def _with_runtime_install(output: str, magics: list[str], cells: list[dict]) -> str:
    """The rewritten code with ``%pip install mgpu-runtime`` above the runtime import the rewrite added (set
    aside as the magics are), unless a cell installs it already."""
    found = _RUNTIME_IMPORT.search(output)
    if found is None or any(_INSTALLS_RUNTIME.search(_cell_text(cell)) for cell in cells):
        return output
    magics.append(RUNTIME_INSTALL)
    return f"{output[: found.start()]}{_PLACEHOLDER.format(len(magics) - 1)}\n{output[found.start():]}"


def _cell_lines(text: str) -> list[tuple[int, int]]:
    """For each line of the joined source: (cell number, line within the cell)."""
    positions, cell, first = [], 1, 0
    for index, line in enumerate(LINE_BREAK.split(text)):
        boundary = _BOUNDARY_LINE.match(line)
        if boundary:
            cell, first = int(boundary[1]), index + 1
        positions.append((cell, max(index - first + 1, 1)))
    return positions


def _in_cells(path: str, diagnostics: list[Diagnostic], text: str) -> list[Diagnostic]:
    positions = _cell_lines(text)
    moved = []
    for diagnostic in diagnostics:
        cell, line = positions[min(diagnostic.line, len(positions)) - 1]
        moved.append(replace(diagnostic, path=cell_path(path, cell), line=line))
    return moved


def _with_source(cell: dict, code: str) -> dict:
    text = _cell_text(cell)
    # Jupyter keeps a cell's lines as a list, without a newline after the last.
    if text.endswith("\n"):
        code += "\n"
    source = code.splitlines(keepends=True) if isinstance(cell.get("source"), list) else code
    return {**cell, "source": source}


def _serialized(notebook: dict, like: str) -> str:
    """The notebook as JSON in the layout of the original text (Jupyter's: indent 1, non-ASCII kept)."""
    second = like.split("\n", 2)[1] if like.count("\n") >= 2 else ""
    indent = len(second) - len(second.lstrip(" ")) or None
    text = json.dumps(notebook, indent=indent, ensure_ascii="\\u" in like and not _has_non_ascii(like))
    return text + ("\n" if like.endswith("\n") else "")


def _has_non_ascii(text: str) -> bool:
    return any(ord(character) > 127 for character in text)


class NotANotebook(ValueError):
    pass


def _checked_cells(notebook: object) -> list[dict]:
    """The notebook's cells, each an object whose source is what nbformat makes it (a string, or a list of them)."""
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise NotANotebook("no list of cells")
    for number, cell in enumerate(notebook["cells"], start=1):
        if not isinstance(cell, dict):
            raise NotANotebook(f"cell {number} is no object")
        source = cell.get("source", "")
        if not (isinstance(source, str) or isinstance(source, list) and all(isinstance(line, str) for line in source)):
            raise NotANotebook(f"the source of cell {number} is neither a string nor a list of strings")
    return notebook["cells"]


def _unreadable(path: str, why: str) -> FileOutcome:
    return FileOutcome(path, FAILED, [Diagnostic(path, 1, 1, READ_ERROR, f"cannot read: {why}")])


def migrate_notebook(path: str, target: str, write: bool, want_diff: bool, options: Options) -> FileOutcome:
    """Migrate one notebook. Never raises for a bad file: it comes back as FAILED, untouched."""
    try:
        data, stamp = files.read(path)
        if not might_need_migration(data):
            return FileOutcome(path, UNCHANGED)
        original = data.decode("utf-8")
        notebook = json.loads(original)
        cells = _checked_cells(notebook)
    except RecursionError:
        return _unreadable(path, "not a Jupyter notebook (JSON nested too deeply)")
    except NotANotebook as error:
        return _unreadable(path, f"not a Jupyter notebook ({error})")
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return _unreadable(path, getattr(error, "strerror", None) or f"not a Jupyter notebook ({type(error).__name__})")
    source, magics = _joined(cells)
    result = migrate_source(source, target, path, options)
    if result.error is not None:
        return FileOutcome(path, FAILED, _in_cells(path, [result.error, *result.diagnostics], source))
    if not result.changed:
        return FileOutcome(path, UNCHANGED, _in_cells(path, result.diagnostics, source))
    output = _with_runtime_install(result.output, magics, cells)
    rewritten = _split(output, magics, [int(m[1]) for m in map(_BOUNDARY_LINE.match, LINE_BREAK.split(source)) if m])
    if rewritten is None:
        message = "internal error: the rewrite moved code across cells; notebook left unchanged, please report"
        return FileOutcome(path, FAILED, [Diagnostic(path, 1, 1, INTERNAL_ERROR, message)])
    new_cells = [_with_source(cell, rewritten[number]) if number in rewritten else cell for number, cell in enumerate(cells, start=1)]
    serialized = _serialized({**notebook, "cells": new_cells}, original)
    if write:
        try:
            files.write_atomically(path, serialized, "utf-8", read_as=files.SourceFile(path, data, "utf-8", stamp))
        except files.FileChanged:
            return changed_on_disk(path)
        except (OSError, UnicodeEncodeError) as error:
            message = f"cannot write: {getattr(error, 'strerror', None) or error}"
            return FileOutcome(path, FAILED, [Diagnostic(path, 1, 1, READ_ERROR, message)])
        diagnostics = _in_cells(path, moved_to_new_lines(result.diagnostics, source, output), output)
    else:
        diagnostics = _in_cells(path, result.diagnostics, source)
    return FileOutcome(path, CHANGED, diagnostics, unified_diff(original, serialized, diff_path(path)) if want_diff else "")
