"""The torchrun agent of a relaunched script (``python train.py`` on several GPUs): torchrun itself, in this
process, with an ending a person can read.

torchrun ends a failed job with its own traceback (the agent's frames, some forty lines) around the failure
block, and a Ctrl-C with the traceback of the signal in the agent; both exit 1. Run here instead, the job
ends with one line: which rank failed, with which exception at which line (from the error file the rank
wrote, ``failures.py``), and the rank's exit status; or, on Ctrl-C, that every process stopped, and 130.
The ranks' own output (a failing rank's traceback) is untouched. The agent's progress messages (a banner on
``OMP_NUM_THREADS``, each closing signal it sends) are left out: the relaunch notice has said what starts.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.run import get_args_parser, run

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)', re.M)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    arguments = get_args_parser().parse_args(argv)
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.ERROR + 1)
    try:
        run(arguments)
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        print(failure_line(rank, failure), file=sys.stderr)
        sys.exit(exit_status(failure.exitcode))
    except (SignalException, KeyboardInterrupt) as stopped:
        number = getattr(stopped, "sigval", signal.SIGINT)
        how = "Ctrl-C" if number == signal.SIGINT else signal.Signals(number).name
        print(f"mgpu_runtime: stopped by {how}: every process of the job has ended", file=sys.stderr)
        sys.exit(128 + number)
    sys.exit(0)


def failure_line(rank: int, failure: ProcessFailure) -> str:
    """``mgpu_runtime: rank 1 failed with ValueError: ... (train.py, line 12); exit status 1``."""
    recorded = failure.error_file_data.get("message") if isinstance(failure.error_file_data, dict) else None
    if isinstance(recorded, dict) and recorded.get("message"):
        frames = _FRAME.findall(recorded.get("extraInfo", {}).get("py_callstack", ""))
        where = f" ({frames[-1][0]}, line {frames[-1][1]})" if frames else ""
        cause = f"failed with {recorded['message']}{where}"
    elif failure.exitcode < 0:
        cause = f"was killed by {failure.signal_name()}"
    else:
        cause = "failed (its output above says why)"
    return f"mgpu_runtime: rank {rank} {cause}; exit status {exit_status(failure.exitcode)}; the other processes were stopped"


def exit_status(exitcode: int) -> int:
    """A process's exit code as a shell reports it: a death by signal N is 128 + N."""
    return 128 - exitcode if exitcode < 0 else exitcode


if __name__ == "__main__":
    main()
