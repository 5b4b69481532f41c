"""What the ``--style torch`` rules share: the plain-PyTorch code they write and the codes they report.

The torch style writes the textbook scaffold (``init_process_group``, ``DistributedSampler``, torch's
``DistributedDataParallel``, saves on rank 0) with no runtime import. A rewrite only the runtime can make leaves
the whole file as it is (``NEEDS_RUNTIME``, reported by the pipeline), and so does a site the torch rules find
no plain form for (``NO_TORCH_FORM``, a veto): the file is never half in one style.
"""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis import FileAnalysis
from mgpu_migrate.options import TORCH_STYLE, Options

TORCH_OPTIONS = Options(style=TORCH_STYLE)

# `import torch.distributed as dist`, the name every torch-style call goes through.
DIST_IMPORT = "torch.distributed as dist"
DIST = "dist"
DIST_MODULE = "torch.distributed"

NEEDS_RUNTIME = "MGP295"
NO_TORCH_FORM = "MGP296"
LOSS_SCALE = "MGP297"
DATA_ORDER = "MGP298"
GLOBAL_BATCH = "MGP299"
# Notes on the distributed program a file becomes: void when it is left as it is.
TORCH_NOTES = frozenset({LOSS_SCALE, DATA_ORDER, GLOBAL_BATCH})


def statement(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code)


def dist_taken(analysis: FileAnalysis) -> bool:
    """Whether ``dist`` may mean anything but ``torch.distributed`` where the scaffold uses it: the file binds
    it otherwise, uses a ``dist`` a star import may bind, or star-imports after the place of the new import."""
    bound = analysis.bindings
    if DIST in bound.local or bound.imported.get(DIST, {DIST_MODULE}) != {DIST_MODULE}:
        return True
    if not bound.star_modules:
        return False
    if DIST not in bound.imported and any(name.value == DIST for name in analysis.tree.nodes(cst.Name)):
        return True
    first_imports = _first_import_run(analysis.module)
    stars = [node for node in analysis.tree.nodes(cst.ImportFrom) if type(node.names) is cst.ImportStar]
    return any(analysis.tree.statement(star) not in first_imports for star in stars)


def _first_import_run(module: cst.Module) -> set[cst.CSTNode]:
    """The top-level import lines the new imports go after (``imports.add_import``)."""
    run = set()
    for line in module.body:
        is_import = type(line) is cst.SimpleStatementLine and all(
            type(small) in (cst.Import, cst.ImportFrom) for small in line.body
        )
        docstring = type(line) is cst.SimpleStatementLine and type(getattr(line.body[0], "value", None)) in (cst.SimpleString, cst.ConcatenatedString)
        if is_import:
            run.add(line)
        elif not (docstring and not run):
            break
    return run
