"""--to balanced keeps every spelling of DataParallel's arguments, and the migrated code runs on CPU replicas.

The migrated snippet is executed in this process with ``MGPU_CPU_REPLICAS=3``: each wrapper must split the
batch over the replicas it names and give the bare module's output, on which the plain criterion gives its loss.
"""

import textwrap

import pytest

from mgpu_migrate.engine import migrate_source

torch = pytest.importorskip("torch")

SOURCE = textwrap.dedent(
    """
    import torch
    from torch import nn
    from torch.nn.parallel import data_parallel

    torch.manual_seed(0)
    net = nn.Linear(4, 3)
    gpus = [0, 1, 2]
    wrapped = {
        "positional": nn.DataParallel(net, [0, 1], 0),
        "range": nn.DataParallel(net, device_ids=range(2)),
        "comprehension": nn.DataParallel(net, device_ids=[i for i in range(len(gpus))], output_device=gpus[0]),
        "generator": torch.nn.DataParallel(net, device_ids=(g for g in gpus)),
        "multi-line": torch.nn.parallel.DataParallel(
            net,  # the module
            device_ids=gpus,
        ),
    }
    criterion = nn.CrossEntropyLoss()
    x = torch.randn(7, 4)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    losses = {name: criterion(model(x), y) for name, model in wrapped.items()}
    losses["functional"] = criterion(data_parallel(net, x, gpus), y)
    reference = criterion(net(x), y)
    """
)


def test_every_argument_spelling_runs_on_cpu_replicas(monkeypatch):
    result = migrate_source(SOURCE, "balanced", "snippet.py")
    assert result.error is None
    assert "nn.DataParallel" not in result.output and "mgpu_runtime.data_parallel(net, x, gpus)" in result.output
    assert "criterion = nn.CrossEntropyLoss()" in result.output  # the loss on the replicas' outputs needs no wrapper
    monkeypatch.setenv("MGPU_CPU_REPLICAS", "3")
    namespace: dict = {}
    exec(compile(result.output, "snippet.py", "exec"), namespace)
    reference = namespace["reference"]
    for name, loss in namespace["losses"].items():
        assert torch.allclose(loss, reference, atol=1e-6), name
    assert [model.device_ids for model in namespace["wrapped"].values()] == [[0, 1], [0, 1], [0, 1, 2], [0, 1, 2], [0, 1, 2]]
