"""MGP123: checkpoints are written once, by the main process, through ``mgpu_runtime.save`` (``--to ddp``).

With its ``--style torch`` twin, ``TorchCheckpointSave`` (MGP163): ``torch.save`` runs on rank 0 only.
"""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis.guards import main_process_caller, under_main_process_block
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, TORCH_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.save_reading import CHECKPOINT_SAVE, TORCH_SAVE, SaveReading
from mgpu_migrate.rules.syntax import RUNTIME, argument, on_the_main_process, runtime_attr, with_keyword
from mgpu_migrate.rules.torch_style import DIST_IMPORT, NO_TORCH_FORM, TORCH_OPTIONS, statement

SAVE_ON_EVERY_PROCESS = Review(
    "MGP240",
    name="save-on-every-process",
    summary="a save every process still runs: into a file object or buffer, save_pretrained, or one its next lines move",
    why=(
        "This save still runs on every process: it writes into a file object or a buffer, it is "
        "`save_pretrained`, which `mgpu_runtime.save` does not replace, or the lines after it move, copy or remove "
        "its file with more than printing or logging between or beside them (which every process may need)."
    ),
    todo="Put it under `if mgpu_runtime.is_main_process():`, or save to a path with `mgpu_runtime.save`.",
)


class CheckpointSave(SaveReading, Rule):
    """
    ## What it does
    Replaces ``torch.save(obj, path)`` with ``mgpu_runtime.save(obj, path)``, which every process calls and
    the main process alone carries out, atomically (temporary file, then rename), while the others wait. A save
    whose file the lines after it move, copy or remove (pytorch/examples' ``if is_best: shutil.copyfile(filename,
    "model_best.pth.tar")``) goes under ``if mgpu_runtime.is_main_process():`` with them, then every process waits;
    lines between or beside them that only print or log (mean-teacher's ``LOG.info("--- checkpoint saved to %s
    ---" % path)``) go with them.

    ## Why is this bad?
    Under DDP every process runs the script, so each would write the same checkpoint to the same path at
    the same time: wasted work at best, a truncated file at worst, and a process that reads the checkpoint
    right after may see it half written.

    ## Example
    ```python
    torch.save(model.module.state_dict(), "model.pt")
    ```

    ## Use instead
    ```python
    mgpu_runtime.save(model.module.state_dict(), "model.pt")
    ```

    ## Fix safety
    Safe: the state of every process is the same after a synchronized step, and ``save`` returns on every
    process once the file is complete. A ``torch.save`` already under a main-process-only ``if`` is left as
    it is (the runtime's ``save`` waits for every process, so it would wait forever there). A save into a file
    object or a buffer (``with open(...) as f: torch.save(obj, f)``, ``io.BytesIO()``) is left with MGP240, as
    is ``save_pretrained``: every process still runs them.
    """

    CODE = CHECKPOINT_SAVE
    PHASE = PROGRAM
    USES = ("models", "values")
    STYLES = (RUNTIME_STYLE,)
    REVIEW_CODES = (SAVE_ON_EVERY_PROCESS,)
    DESCRIPTION = "torch.save replaced with mgpu_runtime.save (main process only, atomic)"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch

            model = torch.nn.DataParallel(model)
            torch.save(model.module.state_dict(), 'model.pt')
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            mgpu_runtime.save(model.module.state_dict(), 'model.pt')
            """,
            DDP,
            ("MGP101", "MGP123"),
        ),
        Example(
            """
            import torch

            model = torch.nn.DataParallel(model)
            with open('model.pt', 'wb') as f:
                torch.save(model.state_dict(), f)
            """,
            """
            import torch
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model)
            with open('model.pt', 'wb') as f:
                torch.save(model.state_dict(), f)
            """,
            DDP,
            ("MGP101", "MGP240"),
        ),
        Example(
            """
            import torch

            def save_model(model, path):
                torch.save(model.state_dict(), path)

            model = torch.nn.DataParallel(model)
            if args.local_rank in [-1, 0]:
                save_model(model, 'model.pt')
            """,
            """
            import mgpu_runtime

            def save_model(model, path):
                mgpu_runtime.save(model.state_dict(), path, wait=False)

            model = mgpu_runtime.DistributedDataParallel(model)
            if args.local_rank in [-1, 0]:
                save_model(model, 'model.pt')
            """,
            DDP,
            ("MGP123", "MGP101"),
        ),
    )

    def apply(self) -> None:
        if not self.program.runs_distributed:
            return
        for call in self.analysis.calls_to(TORCH_SAVE):
            if under_main_process_block(self.analysis, call):
                continue
            destination = argument(call, "f", 1)
            if destination is not None and self._is_file_object(call, destination.value):
                self.left(
                    call,
                    SAVE_ON_EVERY_PROCESS,
                    "saving into a file object or buffer: every process runs this",
                )
                continue
            if destination is not None and self._private_temporary(destination.value, call):
                continue  # each process writes its own file, and reads it back
            moved = self._moved_after(call, destination)
            if moved is not None:
                self._guard_save_and_move(call, moved, self.analysis.code_of(destination.value))
                continue
            if not self.rewrite_allowed(call):
                continue
            self._save_once(call, self._decided_per_process(call), main_process_caller(self.analysis, call))
        for call in self.analysis.calls:
            if (
                type(call.func) is cst.Attribute
                and call.func.attr.value == "save_pretrained"
                and not under_main_process_block(self.analysis, call)
            ):
                self.left(
                    call,
                    SAVE_ON_EVERY_PROCESS,
                    "save_pretrained runs on every process",
                )

    def _save_once(self, call: cst.Call, decided: cst.If | None, caller: cst.Call | None = None) -> None:
        """Make ``torch.save`` write once (``decided``: an ``if`` around it that each process judges alone;
        ``caller``: a call of the save's function that only the main process makes)."""
        alone = decided is not None or caller is not None
        self.edits.replace(call, lambda updated, alone=alone: self._to_runtime_save(updated, alone))
        self.edits.need_import(RUNTIME)
        if decided is not None:
            self.rewrote(
                call,
                f"{RUNTIME}.save(..., wait=False): written once, by the main process; no process waits, as the "
                f"`if` at line {self.analysis.position(decided)[0]} is judged per process",
            )
        elif caller is not None:
            self.rewrote(
                call,
                f"{RUNTIME}.save(..., wait=False): written once, by the main process; no process waits, as line "
                f"{self.analysis.position(caller)[0]} calls it on the main process only",
            )
        else:
            self.rewrote(call, f"{RUNTIME}.save: written once, by the main process, atomically")

    @staticmethod
    def _to_runtime_save(call: cst.Call, alone: bool) -> cst.Call:
        call = call.with_changes(func=runtime_attr("save"))
        return with_keyword(call, "wait", cst.Name("False")) if alone else call

    def _decided_per_process(self, call: cst.Call):
        """The innermost ``if`` around the save whose test reads a value computed from the model's outputs
        (``if loss.item() < best:``): under DDP each process computes it from its own rows."""
        models = self.analysis.models
        scope = self.analysis.values.scope_of(call)
        for guard, _ in self.analysis.tree.enclosing_ifs(call):
            if models.derived_sites(guard.test, scope) or any(
                type(node) is cst.Attribute and node.attr.value == "item"
                for node in contains(guard.test, lambda n: type(n) is cst.Attribute)
            ):
                return guard
        return None

    def _guard_save_and_move(self, call: cst.Call, mover: cst.Call, path: str) -> None:
        """``torch.save(obj, tmp)`` followed by ``os.replace(tmp, path)``, with nothing between or beside them but
        lines that only log or print (mean-teacher's ``LOG.info("--- checkpoint saved to %s ---" % path)``) or name
        what nothing else in the function reads (tsn-pytorch's ``best_name = ...`` for the copy): all of them go under
        ``if mgpu_runtime.is_main_process():``, then every process waits (unless the save sits under an ``if`` each
        process decides for itself). Any other shape is left with MGP240. A file written between them, only
        written to (``with open(...) as f: f.write(...)``), goes along, which ``SharedFiles`` leaves to this rule."""
        followers, other, simple = self._span(call, mover, path)
        if not simple or followers is None or other is not None:
            line, _ = self.analysis.position(mover)
            why = f", as line {self.analysis.position(other)[0]} does more than print, log or name a path only they read" if other is not None else ""
            self.left(call, SAVE_ON_EVERY_PROCESS, f"saved, then moved, copied or removed at line {line}: every process runs both{why}")
            return
        if not self.rewrite_allowed(call):
            return
        waits = self._decided_per_process(call) is None
        save_statement = self.analysis.tree.statement(call)

        def guarded(updated: cst.SimpleStatementLine):
            moved = [statement.with_changes(leading_lines=()) if statement is followers[0] else statement for statement in followers]
            return cst.FlattenSentinel(on_the_main_process([updated, *moved], waits))

        self.edits.replace(save_statement, guarded)
        for follower in followers:
            self.edits.replace(follower, lambda _: cst.RemovalSentinel.REMOVE)
        self.edits.need_import(RUNTIME)
        self.rewrote(
            call,
            f"saved, then moved, copied or removed (line {self.analysis.position(mover)[0]}), on the main process "
            f"only (`if {RUNTIME}.is_main_process():`)"
            + (", then every process waits for it" if waits else ""),
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
        if not self.program.runs_distributed:
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
