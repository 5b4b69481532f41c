"""MGP312: a wrapped model whose ``forward`` draws from numpy's or Python's generator (``--to ddp``): said."""

from __future__ import annotations

import os

from mgpu_migrate.analysis.models import wrapped_classes
from mgpu_migrate.analysis.project import project_of
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, Example, Review, Rule

FORWARD_DRAWS = Review(
    "MGP312",
    name="forward-draws",
    summary="the wrapped model's forward draws from numpy's or Python's generator: each process draws rank 0's numbers",
    why=(
        "The model's `forward`, or what it calls, draws from numpy's or Python's global generator (WS-DAN's "
        "`np.random.choice(self.M, 2, p=...)` for each row in training). Under DataParallel the devices' "
        "replicas drew in turn from the one process's generator, each its own numbers. After the migration "
        "every process starts its forward from the same generator state (rank 0's, which the runtime keeps "
        "alike on every process so that draws in the loop match the original's), so each process draws for "
        "its rows the numbers the first device drew for its own, and the numbers drawn after the forward "
        "differ from the original's. The runtime cannot draw the original's numbers here: how many a "
        "device's replica drew is known only after it ran."
    ),
    todo=(
        "Draw with torch inside `forward` (`torch.multinomial(weights, 2)` for `np.random.choice(M, 2, p=weights)`): "
        "the runtime gives each process's replica the generator its device had. Or accept draws alike on every "
        "process for a random augmentation, or use `--to balanced` (one process, as before)."
    ),
)


class ForwardDraws(Rule):
    """
    ## What it does
    Reads the class of each wrapped model in the project (a class of the file, one of another module, or one a
    factory of the project builds), its ``forward`` and what that calls (its own methods, the project's
    functions, the forwards of the project modules it keeps on ``self``), for draws from numpy's or Python's
    global generator, and says where (MGP312). Nothing is rewritten for it.

    ## Why is this bad?
    Under DataParallel each device's replica drew its own numbers, one after the other, from the one process's
    generator. Under DDP every process keeps the same generator state (the runtime makes draws in the training
    loop the original's that way), so every process's forward draws the first device's numbers for its rows, and
    what is drawn after the forward differs from the original's.

    ## Example
    ```python
    class WSDAN(nn.Module):
        def forward(self, x):
            ...
            k_index = np.random.choice(self.M, 2, p=attention_weights.cpu().numpy())

    net = nn.DataParallel(WSDAN(...))
    ```

    ## Use instead
    Draw with torch in ``forward`` (``torch.multinomial``): the runtime gives each process's replica the torch
    generator its device had. Or ``--to balanced``.

    ## Fix safety
    A note: the file migrates, and the message says which draw and where.
    """

    CODE = FORWARD_DRAWS
    PHASE = PROGRAM
    USES = ()  # (the wrapped classes are read by analysis.models.wrapped_classes)
    REVIEW_CODES = (FORWARD_DRAWS,)
    DESCRIPTION = "a wrapped model whose forward draws from numpy's or Python's generator is said"
    TARGETS = (DDP,)
    STYLES = (RUNTIME_STYLE,)  # (under --style torch no generator is kept alike: MGP310 reads the draws)
    EXAMPLES = (
        Example(
            """
            import numpy as np
            import torch.nn as nn


            class Net(nn.Module):
                def forward(self, x):
                    return x[np.random.choice(len(x), 2)]


            net = nn.DataParallel(Net())
            """,
            """
            import numpy as np
            import torch.nn as nn
            import mgpu_runtime


            class Net(nn.Module):
                def forward(self, x):
                    return x[np.random.choice(len(x), 2)]


            net = mgpu_runtime.DistributedDataParallel(Net())
            """,
            DDP,
            ("MGP101",),
            name="text that is no file reads no project: the model's class is not read (fixtures/shapes/forward_draws.py is)",
        ),
    )

    def apply(self) -> None:
        if not self.program.runs_distributed:
            return
        project = project_of(self.analysis.path)
        if project is None:
            return
        for wrap in self.program.wraps:
            for cls in wrapped_classes(self.analysis, wrap, project):
                made = project.forward_draw(cls)
                if made is None:
                    continue
                where = f"{os.path.relpath(made.path, os.path.dirname(self.analysis.path))}:{made.line}"
                self.left(
                    wrap,
                    FORWARD_DRAWS,
                    f"{shorten(cls.name, 24)}.forward draws `{shorten(made.call, 24)}` ({where}): every process draws the "
                    "first device's numbers for its rows",
                )
                break
