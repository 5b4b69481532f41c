"""MGP163: ``--style torch``: ``torch.save`` runs on rank 0 only."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.rules.base import DDP, TORCH_STYLE, Example, Review, Rewrite
from mgpu_migrate.rules.checkpoint_save import CheckpointSave
from mgpu_migrate.rules.torch_style import (
    DIST_IMPORT,
    NO_TORCH_FORM,
    TORCH_OPTIONS,
    statement,
)

WHOLE_DDP_PICKLED = Review(
    "MGP333",
    name="whole-ddp-pickled",
    summary="--style torch: the whole DDP model is pickled: the file loads only where a process group is set up",
    why=(
        "Under `--style torch`, `torch.save(model, path)` pickles torch's `DistributedDataParallel` itself: "
        "loading that file needs a process group set up (its unpickling looks for one), while the original's "
        "file held an `nn.DataParallel` that loads with torch alone, into loader code that goes on with "
        "`model.module` or `model.eval()`."
    ),
    todo=(
        "Save what the original saved: `torch.save(torch.nn.DataParallel(model.module), path)`; or migrate "
        "with the default style, whose wrapper pickles as that DataParallel."
    ),
)


class TorchCheckpointSave(CheckpointSave):
    """
    ## What it does
    Under ``--to ddp --style torch``, puts a ``torch.save(...)`` statement under ``if dist.get_rank() == 0:``
    (the saves the default style hands to ``mgpu_runtime.save``).

    ## Why is this bad?
    Every process holds the same model: each would write the same file at once, and the copies can
    interleave into a corrupt checkpoint.

    ## Example
    ```python
    torch.save(model.module.state_dict(), "model.pt")
    ```

    ## Use instead
    ```python
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "model.pt")
    ```

    ## Fix safety
    The other processes do not wait for the file (add ``dist.barrier()`` before reading it back). A save
    inside an ``if`` each process judges on its own rows (``if loss.item() < best:``) is taken when rank 0's
    rows say so. A save that is not a statement of its own, or that is moved after writing (``os.replace``),
    leaves the file whole (MGP296, MGP295): the default style handles both.
    """

    CODE = Rewrite("MGP163")
    STYLES = (TORCH_STYLE,)
    REVIEW_CODES = (WHOLE_DDP_PICKLED,)
    DESCRIPTION = "torch.save run by rank 0 only (--style torch)"
    EXAMPLES = (
        Example(
            """
            import torch
            import torch.nn as nn
            model = nn.DataParallel(model)
            torch.save(model.module.state_dict(), 'model.pt')  # weights only
            """,
            """
            import torch
            import torch.distributed as dist
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None)
            if dist.get_rank() == 0:
                torch.save(model.module.state_dict(), 'model.pt')  # weights only
            """,
            DDP,
            ("MGP160", "MGP163"),
            TORCH_OPTIONS,
        ),
        Example(
            """
            import torch
            import torch.nn as nn
            model = nn.DataParallel(model)
            torch.save(model, 'model.pth')  # the whole model
            """,
            """
            import torch
            import torch.distributed as dist
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None)
            if dist.get_rank() == 0:
                torch.save(model, 'model.pth')  # the whole model
            """,
            DDP,
            ("MGP160", "MGP163", WHOLE_DDP_PICKLED),
            TORCH_OPTIONS,
        ),
    )

    def apply(self) -> None:
        super().apply()
        if not self.program.migrates:
            return
        models = self.analysis.models
        for call in self.analysis.calls_to("torch.save"):
            saved = call.args[0].value if call.args and call.args[0].keyword is None and not call.args[0].star else None
            if saved is None or not models.model_sites(saved, self.analysis.values.scope_of(call)):
                continue
            self.left(
                saved,
                WHOLE_DDP_PICKLED,
                "the whole DDP model is pickled: the file loads only where a process group is set up; save "
                "`torch.nn.DataParallel(model.module)`, as the original did",
            )

    def _save_once(self, call: cst.Call, decided: cst.If | None, caller: cst.Call | None = None) -> None:
        # No wait to drop: torch's form has no barrier, so a main-process-only caller (``caller``) changes nothing.
        line = self.analysis.tree.statement(call)
        if not (
            type(line) is cst.SimpleStatementLine
            and len(line.body) == 1
            and type(line.body[0]) is cst.Expr
            and line.body[0].value is call
        ):
            self.left(call, NO_TORCH_FORM, "torch.save is not a statement of its own: no `if dist.get_rank() == 0:` form; file left")
            return

        def guarded(updated: cst.SimpleStatementLine) -> cst.If:
            guard = statement("if dist.get_rank() == 0:\n    pass\n")
            body = guard.body.with_changes(body=[updated.with_changes(leading_lines=())])
            return guard.with_changes(body=body, leading_lines=updated.leading_lines)

        self.edits.replace(line, guarded)
        self.edits.need_import(DIST_IMPORT)
        judged = "" if decided is None else f"; the `if` at line {self.analysis.position(decided)[0]} is judged on rank 0's rows"
        self.rewrote(call, f"torch.save on rank 0 only (`if dist.get_rank() == 0:`){judged}")
