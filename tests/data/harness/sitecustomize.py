"""The test harness's, for every Python process the suite starts (``tests/conftest.py`` puts this folder on
``PYTHONPATH``): at its exit, after every ``atexit`` handler of the script, the runtime and torch (this one is
registered first, so it runs last), the objects still alive are frozen out of the garbage collector's reach
(``gc.freeze``). The interpreter's last collections then skip torch's object graph, which a process that built a
DistributedDataParallel holds (``torch._dynamo`` and sympy among it): 0.9 CPU-s of each such process's 3, and a
quarter of a second in one that only imported torch, on a machine whose two cores the suite keeps busy.

What this skips is only the collection of reference cycles still alive at the exit; module globals are still
cleared and what they alone hold is still released (a file a script never closed is flushed and closed as
before). A file held only by a cycle would stay unflushed and fail its test: the harness can make a test fail
that would pass, never the reverse."""

import atexit
import gc

atexit.register(gc.freeze)
