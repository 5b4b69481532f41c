"""ignite 0.1's ModelCheckpoint: called by an engine, it saves each object's state every ``save_interval`` calls
and removes the oldest files past ``n_saved``. Files are created exclusively: a second process saving the same
file fails, as does one removing a file another process removed."""

import os

import torch


class ModelCheckpoint:
    def __init__(self, dirname, filename_prefix, save_interval=None, n_saved=1, require_empty=True, **kwargs):
        self._dirname = dirname
        self._prefix = filename_prefix
        self._save_interval = save_interval
        self._n_saved = n_saved
        self._iteration = 0
        self._saved = []
        if not os.path.exists(dirname):
            os.makedirs(dirname)

    def __call__(self, engine, to_save):
        self._iteration += 1
        if self._iteration % self._save_interval != 0:
            return
        paths = []
        for name, obj in to_save.items():
            path = os.path.join(self._dirname, f"{self._prefix}_{name}_{self._iteration}.pth")
            with open(path, "xb") as file:
                torch.save(obj.state_dict(), file)
            paths.append(path)
        self._saved.append(paths)
        if len(self._saved) > self._n_saved:
            for path in self._saved.pop(0):
                os.remove(path)
