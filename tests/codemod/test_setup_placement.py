"""Where --to ddp puts mgpu_runtime.setup(): before anything at module level touches a GPU, else at the top of
the main block (MGP120)."""

import textwrap

import pytest

from mgpu_migrate.engine import migrate_source

MAIN = """
    import torch
    import torch.nn as nn

    {module_level}

    def main():
        model = nn.DataParallel(nn.Linear(4, 4))
        for x in loader:
            model(x).mean().backward()


    if __name__ == "__main__":
        main()
"""


def _setup_line(module_level: str) -> tuple[int, str]:
    result = migrate_source(textwrap.dedent(MAIN.format(module_level=module_level)), "ddp", "train.py")
    assert result.error is None
    lines = result.output.splitlines()
    return _set_up_at(lines), lines


def _set_up_at(lines: list[str]) -> int:
    """The index of the line that calls ``mgpu_runtime.setup()``."""
    return next(index for index, line in enumerate(lines) if "mgpu_runtime.setup()" in line)


@pytest.mark.parametrize(
    "module_level",
    [
        'MASK = torch.ones(4, device="cuda")',
        "NOISE = torch.randn(4, device=0)",
        "WEIGHTS = torch.tensor([1.0, 2.0]).to(0)",
        "torch.cuda.set_device(0)",
    ],
)
def test_module_level_gpu_work_gets_setup_after_the_imports(module_level):
    index, lines = _setup_line(module_level)
    statement = module_level.split(" ")[0].split("(")[0]  # the name it binds, or the function it calls
    assert index < next(i for i, line in enumerate(lines) if line.startswith(statement))


@pytest.mark.parametrize("module_level", ['DEVICE = torch.device("cuda")', "SIZE = 4"])
def test_module_level_code_that_touches_no_gpu_leaves_setup_in_the_main_block(module_level):
    index, lines = _setup_line(module_level)
    assert lines[index - 1].startswith('if __name__ == "__main__":')


def test_setup_comes_after_a_conditional_cuda_visible_devices_in_the_main_block():
    source = textwrap.dedent(
        """
        import os
        import torch.nn as nn


        def main(args):
            model = nn.DataParallel(nn.Linear(4, 4))
            for x in loader:
                model(x).mean().backward()


        if __name__ == "__main__":
            args = parser.parse_args()
            if args.gpus:
                os.environ["CUDA_VISIBLE_DEVICES"] = args.gpus  # choose the GPUs before any is bound
            main(args)
        """
    )
    result = migrate_source(source, "ddp", "train.py")
    lines = result.output.splitlines()
    setup = _set_up_at(lines)
    chosen = next(index for index, line in enumerate(lines) if "CUDA_VISIBLE_DEVICES" in line)
    assert chosen < setup < next(index for index, line in enumerate(lines) if line.strip() == "main(args)")
    assert lines[setup] == "    mgpu_runtime.setup()"
    codes = {(d.code, d.message.split(" (")[0]) for d in result.diagnostics}
    assert ("MGP120", 'mgpu_runtime.setup() inserted after CUDA_VISIBLE_DEVICES is set in the `if __name__ == "__main__":` block') in codes
    assert all(code != "MGP245" for code, _ in codes)  # the assignment runs before setup(): nothing to say


def test_module_level_code_that_asks_the_runtime_leaves_setup_in_the_main_block():
    """darts's module-level set-up: its run directory named by the clock and made on the main process. The set-up
    stays where the program starts (one line, after what only parses the command line, as before): the runtime
    answers the module-level calls after relaunching a plain start there (test_distributed_launches.py)."""
    source = textwrap.dedent(
        """
        import os
        import time

        import torch.nn as nn

        args = parser.parse_args()
        args.save = "eval-{}".format(time.strftime("%Y%m%d"))
        os.makedirs(args.save)


        def main():
            model = nn.DataParallel(nn.Linear(4, 4))
            for x in loader:
                model(x).mean().backward()


        if __name__ == "__main__":
            main()
        """
    )
    lines = migrate_source(source, "ddp", "train.py").output.splitlines()
    index = _set_up_at(lines)
    assert lines[index - 1].startswith('if __name__ == "__main__":')
    asks = [i for i, line in enumerate(lines) if "mgpu_runtime.main_process_value(" in line or "is_main_process()" in line]
    assert len(asks) == 2 and max(asks) < index


def test_a_path_computed_among_the_parsers_declarations_stays_before_the_set_up():
    """open-reid's examples: ``working_dir = osp.dirname(osp.abspath(__file__))`` between ``add_argument`` calls
    touches nothing, so the set-up goes after the whole parser, and the message says where it is."""
    source = textwrap.dedent(
        """
        import argparse
        import os.path as osp

        import torch.nn as nn


        def main(args):
            model = nn.DataParallel(nn.Linear(4, 4))
            for x in loader:
                model(x).mean().backward()


        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--lr", type=float, default=0.1)
            working_dir = osp.dirname(osp.abspath(__file__))
            parser.add_argument("--data-dir", default=osp.join(working_dir, "data"))
            main(parser.parse_args())
        """
    )
    result = migrate_source(source, "ddp", "train.py")
    lines = result.output.splitlines()
    at = _set_up_at(lines)
    assert lines[at - 1].strip().startswith('parser.add_argument("--data-dir"') and lines[at + 1].strip() == "main(parser.parse_args())"
    (message,) = [d.message for d in result.diagnostics if d.code == "MGP120"]
    assert message.endswith('inserted in the `if __name__ == "__main__":` block, after its command-line parser')


def test_a_string_heading_a_group_of_arguments_stays_among_them_before_the_set_up():
    """deep-text-recognition's train.py heads each group of ``add_argument`` calls with a bare string
    (``\"\"\" Data processing \"\"\"``): the set-up goes after the whole parser, not among its arguments."""
    source = textwrap.dedent(
        """
        import argparse

        import torch.nn as nn


        def train(opt):
            model = nn.DataParallel(nn.Linear(4, 4))
            for x in loader:
                model(x).mean().backward()


        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--lr", type=float, default=1)
            \"\"\" Data processing \"\"\"
            parser.add_argument("--batch_max_length", type=int, default=25)
            opt = parser.parse_args()
            \"\"\" Seed \"\"\"
            train(opt)
        """
    )
    lines = migrate_source(source, "ddp", "train.py").output.splitlines()
    at = _set_up_at(lines)
    assert lines[at - 1].strip() == "opt = parser.parse_args()", lines[at - 3 : at + 2]


def test_an_entry_script_names_the_training_it_starts_apart_from_the_distributed_program(tmp_path):
    """ncsn's shape: main.py picks a runner by name. Its set-up makes every runner N processes, so MGP239 names
    the runner that trains without DataParallel (toy.py), not the helper the migrated runner trains through
    (steps.py), nor the migrated runner itself."""
    files = {
        "pyproject.toml": "[project]\nname = 'p'\n",
        "main.py": """
            import sys
            from runners import *

            def main():
                runner = eval(sys.argv[1])()
                runner.train()

            if __name__ == "__main__":
                main()
            """,
        "runners/__init__.py": "from runners.anneal import *\nfrom runners.toy import *\nfrom runners.steps import *\n",
        "runners/steps.py": """
            def train_epoch(model, optimizer, loader):
                for x in loader:
                    loss = model(x).pow(2).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
        "runners/anneal.py": """
            import torch
            from torch.utils.data import DataLoader
            from runners.steps import train_epoch

            class AnnealRunner:
                def train(self):
                    model = torch.nn.DataParallel(torch.nn.Linear(2, 2))
                    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                    loader = DataLoader(torch.randn(8, 2), batch_size=4)
                    train_epoch(model, optimizer, loader)
            """,
        "runners/toy.py": """
            import torch

            class ToyRunner:
                def train(self):
                    model = torch.nn.Linear(2, 2)
                    loss = model(torch.randn(4, 2)).sum()
                    loss.backward()
            """,
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    main = tmp_path / "main.py"
    result = migrate_source(main.read_text(), "ddp", str(main))
    said = [d.message for d in result.diagnostics if d.code == "MGP239"]
    assert len(said) == 1 and "runners/toy.py" in said[0] and "steps.py" not in said[0] and "anneal" not in said[0], said
    assert "mgpu_runtime.setup()" in result.output


def test_a_version_check_that_only_raises_stays_before_the_set_up_with_the_parser_after_it():
    """first-order-model's run.py: `if sys.version_info[0] < 3: raise ...` opens the main block, then the parser;
    the set-up comes after both (a bad argument stops before any process starts)."""
    source = textwrap.dedent(
        """
        import argparse
        import sys
        import torch.nn as nn

        if __name__ == "__main__":
            if sys.version_info[0] < 3:
                raise Exception("Python 3 or higher")
            parser = argparse.ArgumentParser()
            parser.add_argument("--lr", type=float)
            args = parser.parse_args()
            model = nn.DataParallel(nn.Linear(4, 4))
            for x in loader:
                model(x).mean().backward()
        """
    )
    result = migrate_source(source, "ddp", "train.py")
    lines = result.output.splitlines()
    index = _set_up_at(lines)
    assert lines[index - 1].strip() == "args = parser.parse_args()"


_CLICK = """
    import click
    import torch.nn as nn


    @click.group()
    {passed}def cli({context}):
        '''Commands'''
        print("starting")


    @cli.command({name})
    def fit_model():
        model = nn.DataParallel(nn.Linear(4, 4))
        for x in loader:
            model(x).mean().backward()


    @cli.command()
    def make_report():
        print("report")


    if __name__ == "__main__":
        cli()
"""


@pytest.mark.parametrize(
    "passed, context, name, test",
    [
        # deeplab-pytorch: the group is given its context
        ("@click.pass_context\n", "ctx", "", "ctx.invoked_subcommand in (\"fit-model\",)"),
        # no context passed: click's current one; a command named by its decorator
        ("", "", "'fit'", "click.get_current_context().invoked_subcommand in ('fit',)"),
        ("", "", "name='fit'", "click.get_current_context().invoked_subcommand in ('fit',)"),
    ],
)
def test_a_click_group_sets_up_for_the_commands_that_wrap(passed, context, name, test):
    """deeplab-pytorch's `main` group (issue 23): the set-up goes at the top of the group, under a test of the
    command invoked, so `crf` (no model) stays one process (setup(processes=1)) and what the group prints comes
    once; click names a command after its function, `_` as `-`, unless its decorator names it. The names are
    quoted as most of the file's strings are."""
    source = textwrap.dedent(_CLICK.format(passed=passed.replace("\n", "\n    "), context=context, name=name))
    result = migrate_source(source, "ddp", "train.py")
    expected = (
        f"    '''Commands'''\n    if {test}:\n        mgpu_runtime.setup()\n    else:\n"
        "        mgpu_runtime.setup(processes=1)\n    print(\"starting\")\n"
    )
    assert expected in result.output, result.output
    assert "__main__\":\n    cli()" in result.output
    assert migrate_source(result.output, "ddp", "train.py").output == result.output


def test_a_click_group_whose_commands_all_wrap_is_set_up_in_the_main_block():
    source = textwrap.dedent(_CLICK.format(passed="", context="", name="")).replace(
        '    print("report")', "    nn.DataParallel(nn.Linear(2, 2))(x).sum().backward()"
    )
    result = migrate_source(source, "ddp", "train.py")
    assert 'if __name__ == "__main__":\n    mgpu_runtime.setup()\n    cli()' in result.output, result.output
    assert "invoked_subcommand" not in result.output


def test_what_prints_or_writes_before_the_set_up_is_said():
    """YOLOv4: `logging = init_logger(log_dir='log')` prints its log file's path and opens it (named by the clock)
    before `os.environ["CUDA_VISIBLE_DEVICES"] = cfg.gpu`, after which the set-up goes: it runs in the process that
    relaunches and again in each process (MGP337). The parser before it is not said."""
    source = textwrap.dedent(
        """\
        import logging
        import os
        import torch
        import torch.nn as nn


        def init_logger(log_dir):
            print('log file path:' + log_dir)
            logging.basicConfig(filename=os.path.join(log_dir, 'log.txt'))
            return logging


        if __name__ == "__main__":
            logging = init_logger(log_dir='log')
            cfg = get_args()
            os.environ["CUDA_VISIBLE_DEVICES"] = cfg.gpu
            model = nn.DataParallel(net)
            for x in torch.utils.data.DataLoader(data, batch_size=4):
                model(x).sum().backward()
        """
    )
    result = migrate_source(source, "ddp", "train.py")
    said = [(d.line, d.code, d.message) for d in result.diagnostics if d.code == "MGP337"]
    assert said == [(14, "MGP337", "`init_logger(...)` prints before mgpu_runtime.setup() (line 16): again in every process")], result.diagnostics
    assert '    os.environ["CUDA_VISIBLE_DEVICES"] = cfg.gpu\n    mgpu_runtime.setup()\n' in result.output
