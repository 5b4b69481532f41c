"""Training through the functional ``data_parallel``, as WaveRNN's step does it: the module is never wrapped,
each step calls ``data_parallel(model, (x, m))``, and the module is also called directly (an evaluation, a
``generate`` method). Float64, BatchNorm and dropout in ``forward``, 11 rows a batch (uneven chunks: 6+5, 4+4+3).

    python functional_job.py OUTPUT reference W     # torch's functional form, DataParallel emulated on W devices
    torchrun --nproc_per_node=W functional_job.py OUTPUT migrated W   # mgpu_runtime.data_parallel over W ranks

Writes (rank 0) the losses, the evaluation's and ``generate``'s outputs, and the final state, as a ``torch.save``;
``migrated`` also writes whether the job still held the module after the script dropped it.
"""

from __future__ import annotations

import gc
import sys
import weakref

import torch
from torch import nn

output, mode, devices = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "reference":
    from mgpu_runtime.emulation import install

    install(devices)
    from torch.nn.parallel import data_parallel
else:
    import mgpu_runtime
    from mgpu_runtime.distributed.process_group import current_job

    mgpu_runtime.setup()
    data_parallel = mgpu_runtime.data_parallel

torch.set_default_dtype(torch.float64)
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(5, 8)
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.3)
        self.out = nn.Linear(8 + 2, 3)

    def forward(self, x, m):
        h = self.drop(torch.relu(self.norm(self.inp(x))))
        return self.out(torch.cat([h, m], dim=1))

    def generate(self, x):
        with torch.no_grad():
            return self(x, torch.zeros(len(x), 2)).argmax(1)


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
data = torch.randn(4, 11, 5)
extra = torch.randn(4, 11, 2)
targets = torch.randn(4, 11, 3)
losses, evaluations = [], []
for step in range(4):
    model.train()
    x, m, y = data[step], extra[step], targets[step]
    if torch.cuda.device_count() > 1:
        y_hat = data_parallel(model, (x, m))
    else:
        y_hat = model(x, m)
    loss = (y_hat - y).pow(2).sum() / y.ne(0).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        evaluations.append(model(data[0], extra[0]).sum().item())  # the module called as it is, on its own
generated = model.generate(data[1])
result = {
    "losses": torch.tensor(losses),
    "evaluations": torch.tensor(evaluations),
    "generated": generated,
    "state": {name: value.detach().clone() for name, value in model.state_dict().items()},
}
if mode != "reference":
    held = weakref.ref(model)
    wrappers = current_job().functional_wrappers
    result["wrappers"] = len(wrappers)
    del model, optimizer
    gc.collect()
    result["kept"] = held() is not None
    result["wrappers_after_drop"] = len(wrappers)
    if mgpu_runtime.is_main_process():
        torch.save(result, output)
else:
    torch.save(result, output)
