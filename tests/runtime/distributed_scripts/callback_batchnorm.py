"""A synchronized BatchNorm with the Synchronized-BatchNorm package's protocol (written here for the tests: a master
copy that collects its copies' sums through pipes, ``_compute_mean_std`` that assigns the running statistics),
wrapped by a DataParallelWithCallback.

``python callback_batchnorm.py original OUT`` is the DataParallel original (run it under the emulation);
``python callback_batchnorm.py migrated OUT`` wraps with ``mgpu_runtime.DistributedDataParallel(...,
replication_callbacks=True)`` and loads with ``distribute_loader`` (run it with MGPU_NPROC=W); ``migrated-unlinked``
the same without the option. Each prints the loss of each epoch and saves the model's state to OUT."""

import collections
import queue
import sys
import threading

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

_ChildMessage = collections.namedtuple("_ChildMessage", ["sum", "ssum", "sum_size"])


class _Pipe:
    def __init__(self, master, identifier):
        self.master, self.identifier = master, identifier

    def run_slave(self, message):
        self.master.incoming.put((self.identifier, message))
        return self.master.results[self.identifier].get()


class _Master:
    """Collects every copy's message, computes once, answers each copy."""

    def __init__(self, callback):
        self.callback = callback
        self.copies = 0
        self.incoming = queue.Queue()
        self.results = {}

    def register_slave(self, identifier):
        self.copies += 1
        self.results[identifier] = queue.Queue()
        return _Pipe(self, identifier)

    def run_master(self, message):
        messages = [(0, message)] + [self.incoming.get() for _ in range(self.copies)]
        answers = self.callback(sorted(messages, key=lambda item: item[0]))
        for identifier, answer in answers[1:]:
            self.results[identifier].put(answer)
        return answers[0][1]

    def __getstate__(self):
        return {"callback": self.callback}

    def __setstate__(self, state):
        self.__init__(state["callback"])


class SynchronizedBatchNorm1d(nn.BatchNorm1d):
    def __init__(self, num_features):
        super().__init__(num_features)
        self._sync_master = _Master(self._data_parallel_master)
        self._is_parallel = False
        self._parallel_id = None
        self._slave_pipe = None

    def forward(self, x):
        if not (self._is_parallel and self.training):
            return super().forward(x)
        message = _ChildMessage(x.sum(0), (x * x).sum(0), x.shape[0])
        if self._parallel_id == 0:
            mean, inv_std = self._sync_master.run_master(message)
        else:
            mean, inv_std = self._slave_pipe.run_slave(message)
        return (x - mean) * (inv_std * self.weight) + self.bias

    def __data_parallel_replicate__(self, ctx, copy_id):
        self._is_parallel = True
        self._parallel_id = copy_id
        if copy_id == 0:
            ctx.sync_master = self._sync_master
            self._sync_master.__init__(self._data_parallel_master)  # a new forward: no copies registered yet
        else:
            self._slave_pipe = ctx.sync_master.register_slave(copy_id)

    def _data_parallel_master(self, messages):
        total = sum(message.sum for _, message in messages)
        squares = sum(message.ssum for _, message in messages)
        rows = sum(message.sum_size for _, message in messages)
        mean, inv_std = self._compute_mean_std(total, squares, rows)
        return [(identifier, (mean, inv_std)) for identifier, _ in messages]

    def _compute_mean_std(self, total, squares, rows):
        mean = total / rows
        centred = squares - total * mean
        self.running_mean = (1 - self.momentum) * self.running_mean + self.momentum * mean.detach()
        self.running_var = (1 - self.momentum) * self.running_var + self.momentum * (centred / (rows - 1)).detach()
        return mean, (centred / rows).clamp(self.eps) ** -0.5


class _Context:
    pass


class DataParallelWithCallback(nn.DataParallel):
    def replicate(self, module, device_ids):
        modules = super().replicate(module, device_ids)
        contexts = [_Context() for _ in module.modules()]
        for copy_id, replica in enumerate(modules):
            for context, layer in zip(contexts, replica.modules()):
                if hasattr(layer, "__data_parallel_replicate__"):
                    layer.__data_parallel_replicate__(context, copy_id)
        return modules


mode, out = sys.argv[1], sys.argv[2]
if mode.startswith("migrated"):
    import mgpu_runtime

    mgpu_runtime.setup()
torch.set_default_dtype(torch.float64)
torch.manual_seed(3)
features = torch.randn(26, 6)
labels = (features[:, 0] - features[:, 2] > 0).long()
loader = DataLoader(TensorDataset(features, labels), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(6, 8), SynchronizedBatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2))
if mode.startswith("migrated"):
    loader = mgpu_runtime.distribute_loader(loader)
    wrapped = mgpu_runtime.DistributedDataParallel(model, replication_callbacks=mode == "migrated")
else:
    wrapped = DataParallelWithCallback(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
for epoch in range(3):
    for x, y in loader:
        loss = nn.functional.cross_entropy(wrapped(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss {loss.item():.12f}")
model.eval()
print(f"evaluated: {wrapped(features[:5]).sum().item():.12f}")
if mode == "original" or mgpu_runtime.is_main_process():
    torch.save(model.state_dict(), out)
