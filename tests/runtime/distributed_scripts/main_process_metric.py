"""A migrated loop that computes a metric of the batch on the main process only (a collective only rank 0 makes).

    torchrun --nproc_per_node=2 main_process_metric.py

The metric is a reduction of a global value, so rank 0 waits in it while rank 1 goes on to the next forward's
collective: the lockstep check must stop both within seconds, naming the two statements, not MGPU_TIMEOUT.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import mgpu_runtime

mgpu_runtime.setup()
torch.manual_seed(0)
x, y = torch.randn(60, 4), torch.randn(60, 2)
model = mgpu_runtime.DistributedDataParallel(nn.Linear(4, 2))
loader = mgpu_runtime.distribute_loader(DataLoader(TensorDataset(x, y), batch_size=6))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (inputs, targets) in enumerate(loader):
    output = model(inputs)  # THE FORWARD
    loss = ((output - targets) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if mgpu_runtime.is_main_process() and step == 3:
        print("metric", (output - targets).abs().mean().item())  # THE METRIC
print("finished", mgpu_runtime.rank())
