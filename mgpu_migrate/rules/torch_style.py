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
    """Whether the file binds ``dist`` to anything but ``torch.distributed`` (the scaffold's calls need it)."""
    bound = analysis.bindings
    return DIST in bound.local or bound.imported.get(DIST, {DIST_MODULE}) != {DIST_MODULE} or bool(bound.star_modules)
