"""The test harness's, for every Python process the suite starts (``tests/conftest.py`` puts this folder on
``PYTHONPATH``). Two settings of the garbage collector, none of the program's behaviour:

- The youngest generation is collected after 50,000 allocations, not 700. Importing torch (and ``torch._dynamo``,
  which torch's DistributedDataParallel imports when it is built) allocates millions of objects, and the
  collector walked them again and again: 0.3 CPU-s of each such process.
- At the exit, after every ``atexit`` handler of the script, the runtime and torch (this one is registered first,
  so it runs last), the objects still alive are frozen out of the collector's reach (``gc.freeze``). The
  interpreter's last collections then skip torch's object graph: 0.9 CPU-s of a process that built a
  DistributedDataParallel, a quarter of a second in one that only imported torch.

Together 30% of the CPU time of a short two-process torchrun job (7.5 -> 5.3 CPU-s, agent included), on a
machine whose two cores the suite keeps busy. Reference cycles are still collected during the run, later; only
those still alive at the exit are no longer collected then. Module globals are still cleared at the exit and
what they alone hold is still released (a file a script never closed is flushed and closed as before); a file
held only by a cycle would stay unflushed and fail its test: the harness can make a test fail that would pass,
not the reverse."""

import atexit
import gc

gc.set_threshold(50_000)
atexit.register(gc.freeze)
