"""``fail_together()``: a training step that fails on one process fails on every process, as it did in DataParallel's one.

A script that catches an error around its step (``try: ... except Exception: continue``, EfficientDet's train.py) meant
"skip this step". Under DataParallel the step ran in one process: an error raised by any replica in the forward (one
GPU out of memory, a loss that meets an image without boxes) was re-raised in that process, the step was skipped
once, and training went on. Under DDP the error is raised in one process only. That process skips the step; the
others go on into the step's collectives, where they wait for it, or meet the next step's.

After ``fail_together()``, every forward of the job's wrappers (``DistributedDataParallel``, the functional
``data_parallel``, a frozen module's) ends with one exchange: whether any rank's replica raised. If one did, every
rank raises the error of the lowest rank that did, as DataParallel re-raised the first failing replica's error:
the same type, with torch's message ``Caught <type> in replica <r> on device <r>.`` and the original traceback. So
every process takes the same ``except`` branch, at the same place, and skips the same step.

Only the forward needs the exchange. Outside it every rank computes the same global values (the runtime contract,
``mgpu_runtime.sharded``), so an error there is raised on every rank alike. What it costs: one host-side all-reduce
of a flag per forward, and the forward's outputs are not used before every rank has finished its forward. A world of
one process exchanges nothing.

Not covered: an error raised inside ``backward()`` on one process only (a GPU out of memory in the backward pass).
DDP's gradient reduction has started on the other ranks by then; the lockstep check stops the job and names it.
"""

from __future__ import annotations

from mgpu_runtime.distributed.process_group import job, setup


def fail_together() -> None:
    """From now on, an error raised in one rank's replica forward is raised on every rank (see the module doc).
    A migrated script calls it at the start of a ``try:`` around its training step (MGP141); calling it again
    changes nothing."""
    setup()
    job().fail_together = True
