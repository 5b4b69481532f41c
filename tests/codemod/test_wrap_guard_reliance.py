"""MGP121/MGP254: a GPU guard is extended only when the rest of its body runs where its condition is false."""

import pytest

from mgpu_migrate.codes import CODES
from mgpu_migrate.engine import migrate_source

HEAD = "import logging\nimport torch\nimport torch.nn as nn\n\n\ndef build(model, args, device, gpu_ids, use_cuda, n_gpu):\n"


def _migrate(body: str):
    source = HEAD + "".join(f"    {line}\n" for line in body.splitlines()) + "    return model\n"
    result = migrate_source(source, "ddp", "build.py")
    assert result.error is None
    return result.output, {d.code: d.message for d in result.diagnostics}


@pytest.mark.parametrize(
    "body, reason",
    [
        ("if len(gpu_ids) > 0:\n    model.to(gpu_ids[0])\n    model = nn.DataParallel(model)", "uses `gpu_ids`"),
        ("if len(args.gpu_ids) > 1:\n    init(model, args.gpu_ids)\n    model = nn.DataParallel(model)", "uses `args.gpu_ids`"),
        ("if use_cuda:\n    model = nn.DataParallel(model.cuda())", "calls `.cuda()`"),
        ("if use_cuda:\n    model = nn.DataParallel(model).cuda()", "calls `.cuda()`"),
        ("if args.multi_gpu:\n    torch.cuda.set_device(0)\n    model = nn.DataParallel(model)", "torch.cuda.set_device"),
        ("if n_gpu > 1:\n    assert torch.cuda.is_available()\n    model = nn.DataParallel(model)", "asserts that CUDA"),
        ("if use_cuda:\n    model = nn.DataParallel(model)\n    device = 'cuda:0'", "names the GPU 'cuda:0'"),
        ("if use_cuda:\n    if n_gpu > 1:\n        model = nn.DataParallel(model)\n    model.cuda()", "calls `.cuda()`"),
    ],
)
def test_guard_whose_body_needs_the_condition_is_left(body, reason):
    output, diagnostics = _migrate(body)
    assert f"\n    {body.splitlines()[0]}\n" in output  # the outer guard as it was
    assert "mgpu_runtime.DistributedDataParallel(" in output
    assert reason in diagnostics["MGP254"]
    assert "UnsynchronizedTrainingError" in CODES["MGP254"].page  # the detail is on the code's page


@pytest.mark.parametrize(
    "body",
    [
        # The ids and the count go with the wrap's device_ids, which the rewrite drops.
        "if len(gpu_ids) > 1:\n    model = nn.DataParallel(model, device_ids=gpu_ids, output_device=gpu_ids[0])  # noqa: MGP283",
        "if n_gpu > 1:\n    model = nn.DataParallel(model, list(range(n_gpu)))",
        # Only shown, or a device the condition does not test.
        "if n_gpu > 1:\n    print('using', n_gpu, 'GPUs')\n    logging.info('%d GPUs', n_gpu)\n    model = nn.DataParallel(model)",
        "if torch.cuda.device_count() > 1:\n    model = nn.DataParallel(model)\n    model.to(device)",
        # An attribute of the same name on something else is not what the condition tests.
        "if args.n_gpu > 1:\n    model = nn.DataParallel(model)\n    other.n_gpu = 2\n    log(args.lr)",
    ],
)
def test_guard_whose_body_runs_anywhere_is_extended(body):
    output, diagnostics = _migrate(body)
    assert "MGP254" not in diagnostics
    assert "MGP121" in diagnostics
    assert "or mgpu_runtime.world_size() > 1:" in output


def test_nested_guards_are_judged_each_on_its_own():
    output, diagnostics = _migrate("if use_cuda:\n    if n_gpu > 1:\n        model = nn.DataParallel(model)\n    model.cuda()")
    assert "    if use_cuda:\n" in output
    assert "        if n_gpu > 1 or mgpu_runtime.world_size() > 1:\n" in output
    assert {"MGP121", "MGP254"} <= diagnostics.keys()
