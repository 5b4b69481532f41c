"""The GPUs a DataParallel chose go to mgpu_runtime.setup(devices=...) under --to ddp (issue 23, item 2; MGP150),
when they hold there what they hold at the wrap; otherwise the file is left, saying what they are (MGP283).

On the CPU the runtime ignores the devices, so the end-to-end run (test_project_shapes_e2e's chosen_gpus) cannot
tell whether they were passed: here the set-up's text is pinned for each way a wrap names its GPUs, and the
migrated fixture is run to see the ids the set-up is given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from mgpu_migrate.engine import migrate_source
from mgpu_migrate.options import TORCH_STYLE, Options
from tests.fixture_cases import FIXTURES

CHOSEN = "MGP283"


def _migrated(source: str, path: str = "train.py"):
    result = migrate_source(textwrap.dedent(source).lstrip("\n"), "ddp", path)
    assert result.error is None
    return result


def _setups(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines() if "mgpu_runtime.setup(" in line]


_FLAT = """
    import argparse
    import torch.nn as nn
    {imports}

    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--ngpu", type=int, default=2)
    args = parser.parse_args()
    model = nn.DataParallel(nn.Linear(2, 2), {chosen})
    for x in batches:
        model(x).sum().backward()
"""


@pytest.mark.parametrize(
    ("chosen", "imports", "passed"),
    [
        ("device_ids=args.gpus", "", "args.gpus"),
        ("args.gpus", "", "args.gpus"),  # positional
        ("device_ids=[cfg.GPU_ID]", "from config import cfg", "[cfg.GPU_ID]"),
        ("device_ids=range(args.ngpu)", "", "range(args.ngpu)"),
        ("device_ids=[int(g) for g in args.gpus]", "", "[int(g) for g in args.gpus]"),
        ("device_ids=[2, 3]", "", "[2, 3]"),
    ],
)
def test_the_set_up_is_given_the_gpus_the_wrap_chose(chosen, imports, passed):
    result = _migrated(_FLAT.format(chosen=chosen, imports=imports))
    assert _setups(result.output) == [f"mgpu_runtime.setup(devices={passed})"]
    assert "device_ids" not in result.output and "args.gpus)" not in result.output.split("DistributedDataParallel")[1]
    assert CHOSEN not in {d.code for d in result.diagnostics}
    assert any(d.code == "MGP150" and "moved to `mgpu_runtime.setup(devices=...)`" in d.message for d in result.diagnostics)
    again = migrate_source(result.output, "ddp", "train.py")
    assert again.output == result.output


def test_every_visible_gpu_needs_no_devices():
    result = _migrated(_FLAT.format(chosen="device_ids=list(range(torch.cuda.device_count()))", imports="import torch"))
    assert _setups(result.output) == ["mgpu_runtime.setup()"]
    assert not [d for d in result.diagnostics if d.code in ("MGP150", CHOSEN)]


def test_gpus_parsed_in_main_move_the_set_up_after_the_parsing():
    result = _migrated(
        """
        import torch.nn as nn
        from opts import parser


        def main():
            global args
            args = parser.parse_args()
            model = nn.DataParallel(nn.Linear(2, 2), device_ids=args.gpus).cuda()
            for x in loader:
                model(x).sum().backward()


        if __name__ == "__main__":
            main()
        """
    )
    lines = result.output.splitlines()
    setup = lines.index("    mgpu_runtime.setup(devices=args.gpus)")
    assert lines[setup - 1] == "    args = parser.parse_args()"
    assert lines[-1] == "    main()" and lines[-2] == 'if __name__ == "__main__":'


_HANDED = """
    import argparse
    import torch.nn as nn

    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, nargs="+")


    def main(args):
        {in_main}
        model = nn.DataParallel(nn.Linear(2, 2), device_ids=args.gpus)
        for x in loader:
            model(x).sum().backward()


    if __name__ == "__main__":
        args = parser.parse_args()
        main(args)
"""


def test_gpus_parsed_in_the_main_block_and_handed_to_main_go_to_the_set_up():
    result = _migrated(_HANDED.format(in_main="pass"))
    lines = result.output.splitlines()
    assert lines[-3:] == ["    args = parser.parse_args()", "    mgpu_runtime.setup(devices=args.gpus)", "    main(args)"]


def test_gpus_handed_to_main_and_changed_there_leave_the_file():
    result = _migrated(_HANDED.format(in_main="args.gpus = args.gpus[:1]"))
    (message,) = [d.message for d in result.diagnostics if d.code == CHOSEN]
    assert "but `args.gpus` is set again at line 9, after the set-up" in message


def test_without_devices_to_keep_the_set_up_stays_in_the_main_block():
    result = _migrated(
        """
        import torch.nn as nn


        def main():
            args = parser.parse_args()
            model = nn.DataParallel(nn.Linear(2, 2))
            for x in loader:
                model(x).sum().backward()


        if __name__ == "__main__":
            main()
        """
    )
    assert result.output.splitlines()[-2:] == ["    mgpu_runtime.setup()", "    main()"]


@pytest.mark.parametrize(
    ("source", "said"),
    [
        # A library's method: what the set-up must be given, and that this file has none.
        (
            """
            import torch.nn as nn


            class BaseModel(nn.Module):
                def __init__(self, device="cpu", gpus=None):
                    super().__init__()
                    self.gpus = gpus

                def fit(self, x):
                    model = self.train()
                    if self.gpus:
                        model = nn.DataParallel(model, device_ids=self.gpus)
                    for batch in x:
                        model(batch).sum().backward()
            """,
            "but `self.gpus` is the `gpus` given to BaseModel(), and no set-up here takes them",
        ),
        (
            """
            import torch.nn as nn


            def fit(model, batches, gpus):
                model = nn.DataParallel(model, device_ids=gpus)
                for x in batches:
                    model(x).sum().backward()
            """,
            "but `gpus` is a parameter of fit(), and no set-up here takes them",
        ),
        # A processor class with a main block: the attribute is set in a method, after the set-up.
        (
            """
            import torch.nn as nn


            class Processor:
                def load_gpu(self, device):
                    gpus = list(device)
                    self.gpus = gpus

                def train(self, model, batches):
                    model = nn.DataParallel(model, device_ids=self.gpus)
                    for x in batches:
                        model(x).sum().backward()


            if __name__ == "__main__":
                Processor().train(model, batches)
            """,
            "but `self.gpus` is an attribute set in load_gpu() (line 7)",
        ),
        # Changed by a call after the set-up (a config merged in main()).
        (
            """
            import torch.nn as nn
            from config import cfg, update_config


            def main():
                update_config(cfg)
                model = nn.DataParallel(nn.Linear(2, 2), device_ids=[cfg.GPU_ID])
                for x in loader:
                    model(x).sum().backward()


            if __name__ == "__main__":
                main()
            """,
            "but `cfg.GPU_ID` may change at line 6, after the set-up",
        ),
        # Parsed at module level, but changed in main().
        (
            """
            import argparse
            import torch.nn as nn

            args = argparse.ArgumentParser().parse_args()


            def main():
                args.gpus = [int(g) for g in args.gpus.split(",")]
                model = nn.DataParallel(nn.Linear(2, 2), device_ids=args.gpus)
                for x in loader:
                    model(x).sum().backward()


            if __name__ == "__main__":
                main()
            """,
            "but `args.gpus` is set again at line 8, after the set-up",
        ),
        # Two wraps on two choices: one set of processes cannot keep both.
        (
            """
            import torch.nn as nn

            args = parser.parse_args()
            encoder = nn.DataParallel(nn.Linear(2, 2), device_ids=args.gpus)
            decoder = nn.DataParallel(nn.Linear(2, 2))
            for x in loader:
                decoder(encoder(x)).sum().backward()
            """,
            "but the wraps (lines 4, 5) choose different GPUs or every visible one",
        ),
        # A function of the script's own picks them: not followed.
        (
            """
            import torch.nn as nn

            model = nn.DataParallel(nn.Linear(2, 2), device_ids=free_gpus(2))
            for x in loader:
                model(x).sum().backward()
            """,
            "but `free_gpus(...)` chooses them",
        ),
    ],
)
def test_gpus_the_set_up_cannot_be_given_leave_the_file_saying_what_they_are(source, said):
    result = _migrated(source)
    assert result.output == textwrap.dedent(source).lstrip("\n")
    messages = [d.message for d in result.diagnostics if d.code == CHOSEN]
    assert messages and all(said in message for message in messages), messages
    assert all(len(message) <= 160 for message in messages)


def test_a_file_that_gives_the_set_up_its_gpus_itself_is_migrated():
    """The fix MGP283's page asks for: the set-up called with the GPUs, the wrap left to the tool."""
    result = _migrated(
        """
        import argparse
        import mgpu_runtime
        import torch.nn as nn

        args = argparse.ArgumentParser().parse_args()
        mgpu_runtime.setup(devices=args.gpus)
        model = nn.DataParallel(nn.Linear(2, 2), device_ids=args.gpus)
        for x in loader:
            model(x).sum().backward()
        """
    )
    assert "mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))" in result.output
    assert _setups(result.output) == ["mgpu_runtime.setup(devices=args.gpus)"]
    assert CHOSEN not in {d.code for d in result.diagnostics}


def test_under_the_torch_style_named_gpus_still_leave_the_file():
    source = textwrap.dedent(_FLAT.format(chosen="device_ids=args.gpus", imports="")).lstrip("\n")
    result = migrate_source(source, "ddp", "train.py", Options(style=TORCH_STYLE))
    assert result.output == source
    assert [d.code for d in result.diagnostics if d.code == CHOSEN] == [CHOSEN]


# Runs the migrated script plainly (a world of one) with the real runtime, the set-up recorded as it is called:
# what the script hands it, and the CUDA_VISIBLE_DEVICES it had set by then.
_RECORDED = """
import json, os, runpy, sys
import mgpu_runtime

real = mgpu_runtime.setup
given = []

def recorded(devices=None):
    given.append({"devices": devices, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")})
    real(devices=devices)

mgpu_runtime.setup = recorded
script, output = sys.argv[1], sys.argv[2]
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
with open(output, "w") as written:
    json.dump(given, written)
"""


@pytest.mark.parametrize(("config", "ids"), [("two_gpus", [0, 1]), ("three_gpus", [0, 1, 2])])
def test_the_migrated_project_gives_the_set_up_the_gpus_its_config_chose(tmp_path, config, ids):
    project = FIXTURES / "projects" / "chosen_gpus"
    for name in ("trainer.py", "utils/__init__.py", "utils/tools.py", f"configs/{config}.json"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text((project / name).read_text())
    (tmp_path / "train.py").write_text((project / "train.ddp.py").read_text())
    (tmp_path / "recorded.py").write_text(_RECORDED)
    environment = {key: value for key, value in os.environ.items() if key not in ("CUDA_VISIBLE_DEVICES", "MGPU_NPROC")}
    environment["FIXTURE_OUTPUT"] = str(tmp_path / "weights.pt")
    command = [sys.executable, "recorded.py", "train.py", str(tmp_path / "given.json"), "--config", config]
    done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # The config's GPUs, made visible and renumbered by the script, are the ones the set-up is given.
    visible = ",".join(map(str, json.loads((project / "configs" / f"{config}.json").read_text())["gpu_ids"]))
    assert json.loads((tmp_path / "given.json").read_text()) == [{"devices": ids, "visible": visible}]
    assert (tmp_path / "weights.pt").exists()


# st-gcn's IO (issue 23, item 2): the constructor calls a method that chooses the GPUs and keeps them on self,
# then the method that wraps the model on them.
_METHOD = """
    import torch.nn as nn


    class Processor:
        def __init__(self, argv=None):
            self.load_arg(argv)
            {first}
            {second}

        def init_environment(self):
            {choose}
            self.dev = "cpu"

        def gpu(self):
            self.model = nn.Linear(2, 2)
            if len(self.gpus) > 1:
                self.model = nn.DataParallel(self.model, device_ids=self.gpus)

        def start(self):
            for x in loader:
                self.model(x).sum().backward()


    if __name__ == "__main__":
        Processor().start()
"""
_CHOOSES = "gpus = visible_gpus(self.arg.device)\n            self.gpus = gpus"


@pytest.mark.parametrize(
    ("choose", "setup", "after"),
    [
        # The local the GPUs are chosen into: the set-up right after it, given it.
        (_CHOOSES, "mgpu_runtime.setup(devices=gpus)", "gpus = visible_gpus(self.arg.device)"),
        # Kept on self from an expression: the set-up right after, given the attribute.
        ("self.gpus = list(self.arg.device)", "mgpu_runtime.setup(devices=self.gpus)", "self.gpus = list(self.arg.device)"),
        # Inside the method's `if`, as st-gcn's `if self.arg.use_gpu:`.
        (
            "if self.arg.use_gpu:\n                gpus = visible_gpus(self.arg.device)\n                self.gpus = gpus",
            "mgpu_runtime.setup(devices=gpus)",
            "gpus = visible_gpus(self.arg.device)",
        ),
    ],
)
def test_gpus_a_method_chooses_go_to_the_set_up_in_that_method(choose, setup, after):
    source = _METHOD.format(first="self.init_environment()", second="self.gpu()", choose=choose)
    result = _migrated(source)
    lines = [line.strip() for line in result.output.splitlines()]
    assert _setups(result.output) == [setup]
    assert lines[lines.index(setup) - 1] == after
    assert "mgpu_runtime.DistributedDataParallel(self.model)" in result.output
    assert CHOSEN not in {d.code for d in result.diagnostics}
    assert any(d.code == "MGP120" and "in init_environment(), where it chooses the GPUs" in d.message for d in result.diagnostics)
    assert migrate_source(result.output, "ddp", "train.py").output == result.output


@pytest.mark.parametrize(
    ("first", "second", "choose", "said"),
    [
        # The model is wrapped before the GPUs are chosen.
        ("self.gpu()", "self.init_environment()", _CHOOSES, "an attribute set in init_environment() (line 13)"),
        # The constructor touches CUDA before it chooses them: the set-up would come too late.
        ("self.x = torch.zeros(1).cuda()", "self.init_environment()", _CHOOSES, "an attribute set in init_environment()"),
        # The method that chooses them touches CUDA first.
        (
            "self.init_environment()",
            "self.gpu()",
            "torch.zeros(1).cuda()\n            self.gpus = list(self.arg.device)",
            "an attribute set in init_environment()",
        ),
        # Chosen twice: which one holds at the wrap is not known.
        (
            "self.init_environment()",
            "self.gpu()",
            _CHOOSES + "\n            self.gpus = self.gpus[:1]",
            "`self.gpus` is an attribute",
        ),
    ],
)
def test_gpus_a_method_chooses_too_late_or_twice_leave_the_file(first, second, choose, said):
    source = "import torch\n" + textwrap.dedent(_METHOD.format(first=first, second=second, choose=choose)).lstrip("\n")
    result = migrate_source(source, "ddp", "train.py")
    assert result.output == source
    messages = [d.message for d in result.diagnostics if d.code == CHOSEN]
    assert messages and all(said in message for message in messages), messages


@pytest.mark.parametrize(("device", "ids"), [(["2", "3"], [0, 1]), (["1", "4", "5"], [0, 1, 2])])
def test_the_migrated_processor_gives_the_set_up_the_gpus_its_method_chose(tmp_path, device, ids):
    (tmp_path / "train.py").write_text((FIXTURES / "projects" / "method_chosen_gpus" / "train.ddp.py").read_text())
    (tmp_path / "recorded.py").write_text(_RECORDED)
    environment = {key: value for key, value in os.environ.items() if key not in ("CUDA_VISIBLE_DEVICES", "MGPU_NPROC")}
    environment["FIXTURE_OUTPUT"] = str(tmp_path / "weights.pt")
    command = [sys.executable, "recorded.py", "train.py", str(tmp_path / "given.json"), "--device", *device, "--epochs", "1"]
    done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # The --device GPUs, made visible and renumbered by the method, are the ones the set-up is given.
    assert json.loads((tmp_path / "given.json").read_text()) == [{"devices": ids, "visible": ",".join(device)}]
    assert (tmp_path / "weights.pt").exists()


def test_the_held_model_project_sets_up_once_where_its_class_chooses_the_gpus(tmp_path):
    """st-gcn's shape: the entry script hands the command line to a processor whose base class (another module)
    chooses the GPUs; the set-up runs there, once, given them, and the script sets up nothing before."""
    _held_project(tmp_path, migrated=True)
    assert "mgpu_runtime" not in (tmp_path / "main.py").read_text()
    (tmp_path / "recorded.py").write_text(_RECORDED)
    environment = {key: value for key, value in os.environ.items() if key not in ("CUDA_VISIBLE_DEVICES", "MGPU_NPROC")}
    environment["FIXTURE_OUTPUT"] = str(tmp_path / "weights.pt")
    command = [sys.executable, "recorded.py", "main.py", str(tmp_path / "given.json"), "train", "--device", "2", "3", "--epochs", "1"]
    done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "given.json").read_text()) == [{"devices": [0, 1], "visible": "2,3"}]


def _held_project(tmp_path, migrated: bool):
    project = FIXTURES / "projects" / "held_chosen_gpus"
    for name in ("main.py", "pyproject.toml", "processors/__init__.py", "processors/base.py", "processors/demo.py", "processors/trainer.py"):
        chosen = project / name.replace(".py", ".ddp.py")
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text((chosen if migrated and chosen.exists() else project / name).read_text())


def test_the_demo_that_reads_what_a_wrap_lacks_still_runs_as_one_process_on_its_gpu(tmp_path):
    """st-gcn's demos only infer, and read `self.model.extract_feature` (here `intensity`), which DataParallel does
    not have: the original ran them with one --device, unwrapped. The migrated one runs as one process there."""
    environment = {key: value for key, value in os.environ.items() if key not in ("CUDA_VISIBLE_DEVICES", "MGPU_NPROC")}
    printed = {}
    for migrated in (False, True):
        home = tmp_path / ("migrated" if migrated else "original")
        _held_project(home, migrated)
        (home / "recorded.py").write_text(_RECORDED)
        command = [sys.executable, "recorded.py", "main.py", str(home / "given.json"), "demo", "--device", "3"]
        done = subprocess.run(command, cwd=home, env=environment, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        printed[migrated] = done.stdout
    assert printed[True] == printed[False] and "intensity" in printed[True]
    assert json.loads((tmp_path / "migrated" / "given.json").read_text()) == [{"devices": [0], "visible": "3"}]


def test_a_demo_that_dataparallel_could_run_keeps_the_class_that_holds_the_model(tmp_path):
    """Without such a read, the original could run the demo on several GPUs; migrated, it would run once per
    process: the class holding the model is left (MGP320), as before."""
    _held_project(tmp_path, migrated=False)
    demo = tmp_path / "processors" / "demo.py"
    demo.write_text(demo.read_text().replace("self.model.intensity(data)", "scores.pow(2).sum().sqrt()"))
    base = tmp_path / "processors" / "base.py"
    result = migrate_source(base.read_text(), "ddp", str(base))
    assert not result.changed
    assert [d.message for d in result.diagnostics if d.code == "MGP320"] == [
        "`Base` hands the model to its subclasses: `Demo` (demo.py:9) does not train it: every process would run it; "
        "file left as it is"
    ]


def test_a_script_that_trains_the_held_model_itself_leaves_the_set_up_to_the_class(tmp_path):
    """The subclass that trains is the script (a main block of its own): it still sets up nothing before the
    class it derives from chooses the GPUs and sets up there."""
    _held_project(tmp_path, migrated=False)
    trainer = (tmp_path / "processors" / "trainer.py").read_text()
    script = trainer + '\n\nif __name__ == "__main__":\n    Trainer(["--device", "0", "1"]).start()\n'
    (tmp_path / "train.py").write_text(script)
    (tmp_path / "processors" / "trainer.py").unlink()
    (tmp_path / "main.py").unlink()
    (tmp_path / "processors" / "demo.py").unlink()
    result = migrate_source((tmp_path / "train.py").read_text(), "ddp", str(tmp_path / "train.py"))
    assert result.changed and "distribute_loader" in result.output
    assert "mgpu_runtime.setup(" not in result.output
    base = tmp_path / "processors" / "base.py"
    lines = migrate_source(base.read_text(), "ddp", str(base)).output.splitlines()
    assert "        mgpu_runtime.setup(devices=gpus)" in lines


def test_gpus_read_from_a_config_in_the_main_block_are_given_to_a_set_up_placed_after_them():
    """face.evoLVe's trainer: `GPU_ID = cfg['GPU_ID']` is the one assignment of the GPUs, and the main block only
    computes up to it: the set-up goes right after it, given them (MGP150), and the wraps on it, the first handing
    GPU_ID to the second wrap's DataParallel (which copies it), migrate."""
    source = textwrap.dedent(
        """
        import torch.nn as nn
        from config import configurations

        if __name__ == '__main__':
            cfg = configurations[1]
            GPU_ID = cfg['GPU_ID']
            print(cfg)
            model = nn.DataParallel(nn.Linear(2, 2), device_ids=GPU_ID)
            head = nn.DataParallel(nn.Linear(2, 2), device_ids=GPU_ID)
            for x in loader:
                head(model(x)).sum().backward()
        """
    )
    result = migrate_source(source, "ddp", "train.py")
    assert result.changed and not [d for d in result.diagnostics if d.code == CHOSEN], result.diagnostics
    assert "    GPU_ID = cfg['GPU_ID']\n    mgpu_runtime.setup(devices=GPU_ID)\n    print(cfg)\n" in result.output, result.output


def test_gpus_read_from_a_config_once_after_the_set_up_are_said_to_be_set_there_not_to_change():
    """The same with a print before the assignment (which would print again in every process before a set-up
    after it): the set-up stays at the top, and the message says the GPUs are set after it (before, "may change",
    a reassignment that is not in the file)."""
    source = textwrap.dedent(
        """
        import torch.nn as nn
        from config import configurations

        if __name__ == '__main__':
            cfg = configurations[1]
            print(cfg)
            GPU_ID = cfg['GPU_ID']
            model = nn.DataParallel(nn.Linear(2, 2), device_ids=GPU_ID)
            for x in loader:
                model(x).sum().backward()
        """
    )
    result = migrate_source(source, "ddp", "train.py")
    (message,) = [d.message for d in result.diagnostics if d.code == CHOSEN]
    assert "but `GPU_ID` is set at line 8, after the set-up" in message and not result.changed


def _console_project(tmp_path, migrated: bool):
    project = FIXTURES / "projects" / "console_trainer"
    for path in project.rglob("*"):
        if path.is_file() and ".ddp." not in path.name and ".balanced." not in path.name:
            target = tmp_path / path.relative_to(project)
            target.parent.mkdir(parents=True, exist_ok=True)
            chosen = path.with_name(f"{path.stem}.ddp.py") if path.suffix == ".py" else path
            target.write_text((chosen if migrated and chosen.exists() else path).read_text())


def test_gpus_handed_to_a_class_by_a_console_command_go_to_its_set_up(tmp_path):
    """BERT-pytorch's shape: `bert = bert_pytorch.__main__:train` (setup.py's console script) parses --cuda_devices
    and gives them to `BERTTrainer(...)`, whose constructor wraps on them: the command's function sets up right
    after its parse, given them, and the constructor's wrap is the runtime's (MGP150 names the call that hands them)."""
    _console_project(tmp_path, migrated=False)
    main = tmp_path / "bertlike" / "__main__.py"
    pretrain = tmp_path / "bertlike" / "trainer" / "pretrain.py"
    script = migrate_source(main.read_text(), "ddp", str(main))
    lines = script.output.splitlines()
    assert [line for line in lines if line.strip().startswith("mgpu_runtime.setup(")] == [
        "    mgpu_runtime.setup(devices=args.cuda_devices)"
    ]
    assert lines[lines.index("    mgpu_runtime.setup(devices=args.cuda_devices)") - 1] == "    args = parser.parse_args()"
    trainer = migrate_source(pretrain.read_text(), "ddp", str(pretrain))
    assert "mgpu_runtime.DistributedDataParallel(self.model)" in trainer.output
    assert [d.message for d in trainer.diagnostics if d.code == "MGP150"] == [
        "`device_ids=cuda_devices` dropped: ../__main__.py:58 hands them to `mgpu_runtime.setup(devices=...)`, one "
        "process on each"
    ]
    # Without the console script, the module has no main function: nothing sets up, the class's wrap is left.
    (tmp_path / "setup.py").write_text("from setuptools import setup\n\nsetup(name='bertlike')\n")
    from mgpu_migrate import started

    started._CONSOLE.clear()
    trainer = migrate_source(pretrain.read_text(), "ddp", str(pretrain))
    assert not trainer.changed
    assert [d.code for d in trainer.diagnostics if d.code == CHOSEN] == [CHOSEN]


def test_the_migrated_console_command_gives_the_set_up_the_gpus_it_parsed(tmp_path):
    _console_project(tmp_path, migrated=True)
    recorded = _RECORDED.replace(
        'runpy.run_path(script, run_name="__main__")',
        'try:\n    runpy.run_path(script, run_name="__main__")\nexcept SystemExit as stop:\n    assert not stop.code',
    )
    (tmp_path / "recorded.py").write_text(recorded)
    environment = {key: value for key, value in os.environ.items() if key not in ("CUDA_VISIBLE_DEVICES", "MGPU_NPROC")}
    environment["FIXTURE_OUTPUT"] = str(tmp_path / "weights.pt")
    command = [sys.executable, "recorded.py", "bertlike_command", str(tmp_path / "given.json"), "--cuda_devices", "2", "3", "--epochs", "1"]
    done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "given.json").read_text()) == [{"devices": [2, 3], "visible": None}]
    assert (tmp_path / "weights.pt").exists()


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("setup.py", "setup(entry_points={'console_scripts': ['tool = pkg.cli:run', 'other=pkg.other:go']})\n"),
        ("setup.py", 'setup(entry_points={"console_scripts": """\n    tool = pkg.cli:run\n"""})\n'),
        ("setup.cfg", "[options.entry_points]\nconsole_scripts =\n    tool = pkg.cli:run\n"),
        ("pyproject.toml", '[project]\nname = "pkg"\n\n[project.scripts]\ntool = "pkg.cli:run"\n'),
        ("pyproject.toml", '[tool.poetry.scripts]\ntool = "pkg.cli:run"\n'),
    ],
)
def test_a_console_script_names_its_module_s_main_function(tmp_path, name, text):
    from mgpu_migrate import started

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "cli.py").write_text("def run():\n    pass\n")
    (tmp_path / name).write_text(text)
    started._CONSOLE.clear()
    assert started.console_function(str(tmp_path / "pkg" / "cli.py")) == "run"
    assert started.is_script(b"def run():\n    pass\n", str(tmp_path / "pkg" / "cli.py"))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        # A plugin's entry point and a GUI script are not the program's start.
        ("setup.py", "setup(entry_points={'pytest11': ['tool = pkg.cli:run']})\n"),
        ("pyproject.toml", '[project.entry-points."pytest11"]\ntool = "pkg.cli:run"\n'),
        ("setup.cfg", "[options.entry_points]\ngui_scripts =\n    tool = pkg.cli:run\n"),
    ],
)
def test_other_entry_points_are_no_commands(tmp_path, name, text):
    from mgpu_migrate import started

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "cli.py").write_text("def run():\n    pass\n")
    (tmp_path / name).write_text(text)
    started._CONSOLE.clear()
    assert started.console_function(str(tmp_path / "pkg" / "cli.py")) is None


_HANDED_NAMESPACE = """
    import argparse
    import torch.nn as nn


    class Trainer(object):
        def __init__(self, args):
            self.args = args
            self.model = nn.Linear(2, 2)
            if args.cuda:
                self.model = nn.DataParallel(self.model, device_ids=self.args.gpu_ids)
{in_class}
        def training(self, loader):
            for x in loader:
                self.model(x).sum().backward()


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument('--gpu-ids', type=str, default='0')
        args = parser.parse_args()
        args.cuda = True
{chosen}
        trainer = Trainer(args)
        trainer.training(loader)


    if __name__ == '__main__':
        main()
"""
_PARSED = """        if args.cuda:
            try:
                args.gpu_ids = [int(s) for s in args.gpu_ids.split(',')]
            except ValueError:
                raise ValueError('Argument --gpu_ids must be a comma-separated list of integers only')
"""


@pytest.mark.parametrize(
    "in_class, chosen, setup",
    [
        # pytorch-deeplab-xception: the namespace's list, parsed under `if args.cuda: try:`
        ("", _PARSED, "mgpu_runtime.setup(devices=args.gpu_ids)"),
        # the string as parsed, handed on as it is
        ("", "", "mgpu_runtime.setup(devices=args.gpu_ids)"),
        # something that prints before the GPUs are chosen: the set-up cannot go after it (the launching process
        # would print it too)
        ("", "        print(args)\n" + _PARSED, None),
        # the class changes them itself
        ("            self.args.gpu_ids = [0]\n", _PARSED, None),
        # the class is built twice
        ("", _PARSED + "        Trainer(args)\n", None),
    ],
)
def test_gpus_a_main_function_hands_a_class_in_its_namespace_go_to_the_set_up_there(in_class, chosen, setup):
    result = _migrated(_HANDED_NAMESPACE.format(in_class=in_class, chosen=chosen))
    if setup is None:
        assert CHOSEN in [d.code for d in result.diagnostics] and not result.changed
        return
    assert _setups(result.output) == [setup]
    lines = result.output.splitlines()
    placed = lines.index("    " + setup)
    assert lines[placed - 1].strip() == ("raise ValueError('Argument --gpu_ids must be a comma-separated list of integers only')" if chosen else "args = parser.parse_args()")
    assert "mgpu_runtime.DistributedDataParallel(self.model)" in result.output
