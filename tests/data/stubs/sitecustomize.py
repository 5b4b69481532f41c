"""A clock the test controls (README.md): with FIXTURE_CLOCK=SECONDS, ``time.strftime(fmt)`` reads SECONDS plus
1.1 s per rank (``RANK``), so ranks whose clocks are apart name things apart unless they share the main one's."""
import atexit
import gc
import os
import time

# This folder, first on PYTHONPATH, shadows the harness's sitecustomize (tests/data/harness): its two lines here too.
gc.set_threshold(50_000)
atexit.register(gc.freeze)

_SECONDS = os.environ.get("FIXTURE_CLOCK")
if _SECONDS:
    _strftime = time.strftime
    _reading = float(_SECONDS) + 1.1 * int(os.environ.get("RANK", "0"))

    def strftime(format, *moment):
        return _strftime(format, *(moment or (time.localtime(_reading),)))

    time.strftime = strftime
