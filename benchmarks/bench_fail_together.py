"""The cost of ``mgpu_runtime.fail_together()`` (MGP141): the exchange each forward ends with, alone.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=W benchmarks/bench_fail_together.py

Rank 0 prints the time of one exchange when no replica raised (a flag and the lockstep counts, one all-reduce on
the host-side gloo group), the least of 5 runs of 500. Its share of a step is measured side by side with
``bench_contract.py --fail-together``.
"""

import time

import mgpu_runtime
from mgpu_runtime.distributed.process_group import job


def main() -> None:
    mgpu_runtime.setup()
    group = job().group
    for _ in range(50):
        group.first_failure(None)
    times = []
    for _ in range(5):
        mgpu_runtime.barrier()
        started = time.perf_counter()
        for _ in range(500):
            group.first_failure(None)
        times.append((time.perf_counter() - started) / 500)
    if mgpu_runtime.is_main_process():
        runs = ", ".join(f"{value * 1e6:.0f}" for value in times)
        print(f"W={mgpu_runtime.world_size()}: one exchange {min(times) * 1e6:.0f} us (runs of 500: {runs} us)")


if __name__ == "__main__":
    main()
