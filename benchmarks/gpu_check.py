"""The GPU check, in one go on a CUDA machine: ``python benchmarks/gpu_check.py [--out results.json]``.

Runs the balanced half (``gpu_balanced.py``: DataParallelModel/DataParallelCriterion on ``device_ids=[0, 0]``
against the bare module, step-time overhead with one device, peak memory of a large-vocabulary step) and the
distributed half (``gpu_ddp.py``: two processes on one GPU with gloo against one process, wrapper overhead
over bare DDP with a world of 1). Prints one JSON document; exits 0 without CUDA after saying so.

``--rehearse`` runs both halves on the CPU with toy sizes (no timing or memory verdicts): the test suite
does this, so the few minutes a GPU is lent are not lost to a mistake in these scripts.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the results to this JSON file")
    parser.add_argument("--rehearse", action="store_true", help="run the scripts' code on the CPU, toy sizes")
    args = parser.parse_args()

    import torch

    if not args.rehearse and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to check (run it on a machine with a GPU).")
        return 0

    import gpu_balanced
    import gpu_ddp

    device = "CPU rehearsal" if args.rehearse else torch.cuda.get_device_name(0)
    results: dict = {"device": device, "torch": torch.__version__}
    runs = (
        ("balanced", lambda part: gpu_balanced.run(part, gpu_balanced.REHEARSAL if args.rehearse else gpu_balanced.GPU)),
        ("ddp", lambda part: gpu_ddp.run(part, rehearse=args.rehearse)),
    )
    for name, run in runs:
        started = time.perf_counter()
        part: dict = {}
        try:
            run(part)
        except Exception as error:  # one half failing must not hide the other's numbers
            part["error"] = f"{type(error).__name__}: {error}"
        part["seconds"] = round(time.perf_counter() - started, 1)
        results[name] = part
    text = json.dumps(results, indent=2, default=str)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")
    failed = any("error" in results[name] for name in ("balanced", "ddp"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
