"""How a rank of a multi-process job ends when it fails or is interrupted.

* An uncaught exception is recorded as torch's ``@record`` records it: the rank writes the exception and its
  traceback to the error file its torchrun agent gave it (``TORCHELASTIC_ERROR_FILE``), so the agent's
  failure block names the rank, the exception and the line instead of ``error_file: <N/A>``. A migrated
  script is a module, not a function to decorate, so the process's excepthook does it (its traceback is
  still printed as before).
* Ctrl-C reaches every process of the job at once; each rank ends without a traceback of its own (one per
  rank, of whatever line it was at, says nothing), and the launcher says it once (``agent.py``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from types import TracebackType

ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"


def install() -> None:
    """Put the rank's own excepthook in front of the ones before it (torch's rank prefix, the lockstep's)."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            return  # Python still ends the process by SIGINT, as an interrupted process should
        record(value, trace)
        previous(kind, value, trace)

    sys.excepthook = hook


def record(value: BaseException, trace: TracebackType | None) -> None:
    """Write ``value`` to the agent's error file, in the layout of torch's ``ErrorHandler.record_exception``
    (which reads the exception being handled, and an excepthook has none); no file outside torchrun."""
    path = os.environ.get(ERROR_FILE_VARIABLE)
    if not path:
        return
    error = {
        "message": {
            "message": f"{type(value).__name__}: {value}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(type(value), value, trace)),
                "timestamp": str(int(time.time())),
            },
        }
    }
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(error, handle)
    except OSError:
        pass  # the traceback on stderr still says it all
