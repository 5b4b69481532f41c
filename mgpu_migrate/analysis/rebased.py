"""The methods of a file's DataParallel subclasses that the runtime's wrapper calls once the class is rebased on it."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from mgpu_migrate.analysis import FileAnalysis


def rebased_classes(analysis: FileAnalysis, rewritten: Collection[cst.CSTNode]) -> frozenset[cst.ClassDef]:
    """This file's DataParallel subclasses rebased on the runtime's wrapper (``rewritten``: the nodes the wrap rules
    rewrote; MGP106 rewrites a class's DataParallel base), and the classes of this file deriving from them."""
    subclasses = analysis.models.subclasses
    by_name = {cls.name.value: cls for cls in subclasses}
    rebased = {cls for cls in subclasses if any(base.value in rewritten for base in cls.bases)}
    grown = True
    while grown:
        grown = False
        for cls in subclasses - rebased:
            if any(type(base.value) is cst.Name and by_name.get(base.value.value) in rebased for base in cls.bases):
                rebased.add(cls)
                grown = True
    return frozenset(rebased)


def rebased_machinery(analysis: FileAnalysis, rewritten: Collection[cst.CSTNode]) -> frozenset[cst.FunctionDef]:
    """The ``scatter`` and ``gather`` methods of the rebased classes (``rebased_classes``). The runtime calls them as
    DataParallel did, and under ddp a move to a GPU inside them is this process's own
    (``mgpu_runtime.distributed.own_machinery``)."""
    return frozenset(
        statement
        for cls in rebased_classes(analysis, rewritten)
        for statement in cls.body.body
        if type(statement) is cst.FunctionDef and statement.name.value in ("scatter", "gather")
    )
