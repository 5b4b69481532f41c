"""The methods of a file's DataParallel subclasses that the runtime's wrapper calls once the class is rebased on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from mgpu_migrate.analysis import FileAnalysis


def rebased_machinery(analysis: FileAnalysis, rewritten: frozenset) -> frozenset[cst.FunctionDef]:
    """The ``scatter`` and ``gather`` methods of this file's DataParallel subclasses rebased on the runtime's
    wrapper (``rewritten``: the nodes the wrap rules rewrote). The runtime calls them as DataParallel did, and under
    ddp a move to a GPU inside them is this process's own (``mgpu_runtime.distributed.own_machinery``)."""
    return frozenset(
        statement
        for cls in analysis.models.subclasses
        if any(base.value in rewritten for base in cls.bases)
        for statement in cls.body.body
        if type(statement) is cst.FunctionDef and statement.name.value in ("scatter", "gather")
    )
