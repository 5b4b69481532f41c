"""tensorboard_logger's Logger, as far as the fixtures use it: one event file per logger, values as lines."""

import itertools
import os

_made = itertools.count()


class Logger:
    def __init__(self, logdir, flush_secs=2, **kwargs):
        os.makedirs(logdir, exist_ok=True)
        # Named by the order of construction (the real one, by the second and the host): the same in the original
        # and its migration, and a second process building it fails on the exclusive creation.
        self._file = open(os.path.join(logdir, f"events.out.tfevents.{next(_made)}"), "x")  # noqa: SIM115

    def log_value(self, name, value, step=None):
        self._file.write(f"{name} {step} {float(value):.6f}\n")
        self._file.flush()
