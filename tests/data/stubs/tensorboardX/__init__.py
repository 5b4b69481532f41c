"""tensorboardX's SummaryWriter, as far as the fixtures use it: one event file per writer, scalars as lines."""

import itertools
import os

_made = itertools.count()


class SummaryWriter:
    def __init__(self, log_dir=None, **kwargs):
        self.log_dir = log_dir or "runs"
        os.makedirs(self.log_dir, exist_ok=True)
        # Named by the order of construction (the real one adds the time, host and process id): the same in the
        # original and its migration, and a second process building it fails on the exclusive creation.
        self._file = open(os.path.join(self.log_dir, f"events.out.tfevents.{next(_made)}"), "x")  # noqa: SIM115
        self.file_writer = _FileWriter(self.log_dir)

    def get_logdir(self):
        return self.log_dir

    def add_scalar(self, tag, scalar_value, global_step=None, **kwargs):
        value = scalar_value.detach().cpu().numpy() if hasattr(scalar_value, "detach") else scalar_value
        self._file.write(f"{tag} {global_step} {float(value):.6f}\n")
        self._file.flush()

    def flush(self):
        self._file.flush()

    def close(self):
        self._file.close()


class _FileWriter:
    """The writer's event-file writer, as far as pytorch-semseg reads it (``writer.file_writer.get_logdir()``)."""

    def __init__(self, log_dir):
        self._log_dir = log_dir

    def get_logdir(self):
        return self._log_dir
