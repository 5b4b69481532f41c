"""``python -m mgpu_runtime env`` (also the ``mgpu_runtime`` command): the runtime's report of this machine."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mgpu_runtime", description="The runtime of scripts migrated by mgpu-migrate.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "env",
        help="print torch's, CUDA's and NCCL's versions, the devices, the launcher variables and what setup() would do",
    )
    parser.parse_args(argv)
    from mgpu_runtime.env_report import report

    sys.stdout.write(report(os.environ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
