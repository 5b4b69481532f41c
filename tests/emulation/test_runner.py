"""``python -m mgpu_runtime.emulation``: a script run as ``python script.py`` runs it, on emulated devices,
stopped after N optimizer steps, with its wrapped models' state written. Two runs of one script, started
together: W=3 stopped after 3 steps, and W=2 to the end."""

import subprocess
import sys
import textwrap

import pytest
import torch

SCRIPT = textwrap.dedent(
    """
    import os
    import sys
    import torch
    from torch import nn

    print("name", __name__, "argv", sys.argv[1:], "path0", sys.path[0] == os.path.dirname(__file__) == os.getcwd())
    torch.manual_seed(0)
    trunk = nn.Sequential(nn.Linear(3, 4), nn.Tanh())
    head = nn.Linear(4, 2)
    model = nn.Sequential(trunk, head)
    if torch.cuda.device_count() > 1:
        print("devices", torch.cuda.device_count(), "cuda available", torch.cuda.is_available())
        model = nn.DataParallel(model)
        again = nn.DataParallel(model.module)  # a second wrapper of the same module
    tail = nn.Sequential(nn.Linear(2, 2))
    tail[0] = nn.DataParallel(tail[0])  # a sub-module wrapped
    optimizer = torch.optim.SGD([*model.parameters(), *tail.parameters()], lr=0.1)
    for step in range(5):
        try:
            optimizer.zero_grad()
            tail(model(torch.randn(5, 3))).pow(2).sum().backward()
            optimizer.step()
        except Exception:
            print("a script's own except Exception")
        print("step", step)
    """
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("runner")
    (directory / "train.py").write_text(SCRIPT)
    commands = {
        "stopped": ["--devices", "3", "--float64", "--steps", "3", "--state", "stopped.pt"],
        "whole": ["--devices", "2", "--state", "whole.pt"],
    }
    started = {
        name: subprocess.Popen(
            [sys.executable, "-m", "mgpu_runtime.emulation", *options, "train.py", "--lr", "0.1"],
            cwd=directory,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, options in commands.items()
    }
    results = {name: (process.communicate(timeout=240), process.returncode) for name, process in started.items()}
    return directory, results


@pytest.mark.slow
@pytest.mark.xdist_group("emulation_runner")
def test_the_script_runs_as_main_with_its_argv_and_directory_and_sees_the_devices(runs):
    directory, results = runs
    for name, ((stdout, stderr), status) in results.items():
        assert status == 0, stderr
        lines = stdout.splitlines()
        assert lines[0] == "name __main__ argv ['--lr', '0.1'] path0 True"
        assert lines[1] == f"devices {3 if name == 'stopped' else 2} cuda available False"


@pytest.mark.slow
@pytest.mark.xdist_group("emulation_runner")
def test_the_run_stops_right_after_the_nth_step_even_through_except_exception(runs):
    directory, results = runs
    (stdout, _), _ = results["stopped"]
    assert stdout.splitlines()[2:] == ["step 0", "step 1"]
    assert torch.load(directory / "stopped.pt")["steps"] == 3
    (stdout, _), _ = results["whole"]
    assert stdout.splitlines()[-1] == "step 4" and torch.load(directory / "whole.pt")["steps"] == 5


@pytest.mark.slow
@pytest.mark.xdist_group("emulation_runner")
def test_the_state_holds_each_wrapped_module_once_in_order_without_the_module_prefix(runs):
    directory, _ = runs
    for name, dtype in (("stopped", torch.float64), ("whole", torch.float32)):
        state = torch.load(directory / f"{name}.pt")
        assert [model["wrapper"] for model in state["models"]] == ["DataParallel", "DataParallel"]
        first, second = (model["state"] for model in state["models"])
        assert list(first) == ["0.0.weight", "0.0.bias", "1.weight", "1.bias"] and list(second) == ["weight", "bias"]
        assert first["0.0.weight"].dtype == dtype
        assert state["outside"] == {}  # the optimizer steps only wrapped parameters
