"""MGP120: call ``mgpu_runtime.setup()`` once, where the program starts (``--to ddp``).

With its ``--style torch`` twin, ``TorchSetup`` (MGP161): the process group is set up from the torchrun
environment, and torn down.
"""

from __future__ import annotations

import ast
import os
from dataclasses import replace
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis.entrypoint import EntryPoint, parses_arguments, script_start
from mgpu_migrate.analysis.guards import main_process_blocks
from mgpu_migrate.analysis.held import set_up_where_chosen
from mgpu_migrate.analysis.own_path import own_path_batch, own_path_launch, own_path_refusal
from mgpu_migrate.analysis.project import importers_through_packages, project_of
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.program import SETUP, SPAWNS, on_own_path
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, TORCH_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, both, runtime_call
from mgpu_migrate.started import is_script, trained_apart
from mgpu_migrate.rules.torch_style import (
    DIST_IMPORT,
    NEEDS_RUNTIME,
    NO_TORCH_FORM,
    TORCH_OPTIONS,
    dist_taken,
    statement,
)

NO_ENTRY_POINT = Review(
    "MGP230",
    name="no-entry-point",
    summary="the file trains, but no place that runs first was found for mgpu_runtime.setup()",
    why=(
        "The file trains, but it has no `if __name__ == \"__main__\":` block or `main()` where "
        "`mgpu_runtime.setup()` could run first. The runtime's wrapper calls `setup()` when it is built, so "
        "the other processes start late (after any work done before the wrap). Where a script with a main block "
        "and no DataParallel of its own imports this module (directly, or through its package's `__init__`), the "
        "message names it: that script is the program's entry point, and its migration (the same run, over the "
        "project) calls `setup()` there and makes its side effects happen once."
    ),
    todo="Call `mgpu_runtime.setup()` where your program starts: migrate the script the message names with this file.",
)

EXISTING_DISTRIBUTED_SETUP = Review(
    "MGP231",
    name="existing-distributed-setup",
    summary="the file runs distributed training of its own: its DataParallel fallback is left as it is",
    why=(
        "The file sets up distributed training itself (`init_process_group`, torch's or apex's DDP, "
        "`DistributedSampler`, `mp.spawn`), beside a DataParallel fallback. Processes relaunched from the "
        "fallback would not provably take the file's own path with the original's global batch, so the file is "
        "left as it is, unless a plain start can launch that path with the original's batch (MGP139: a launcher "
        "chooses it, an option with a whole-number default sets its per-process batch, the fallback runs on "
        "every visible GPU, and the program has a place that runs first; not under `--style torch`). A fallback "
        "that runs on GPUs it chooses (`device_ids=args.gpus`, or a trainer's `self.device_ids` from a "
        "`--device-ids 0` option, one GPU and no DataParallel by default) is said in the message: a plain start "
        "would run one process per visible GPU, not on those. When the file's own path is chosen by `LOCAL_RANK`, `RANK` or `WORLD_SIZE` (read from "
        "the environment, or a `--local_rank` argument, which now defaults to `LOCAL_RANK`: MGP131), the message "
        "gives the command that runs it on the GPUs the fallback used: `torchrun --nproc_per_node=N` with "
        "N the number of GPUs, and the option that sets its per-process batch (the training loader's with a "
        "`DistributedSampler`) at the fallback's batch divided by N, so that the global batch is the original's. "
        "That path is the maintainers' own: what it computes per process (a loss divided by the tokens or rows "
        "that process counted, its own sampler's order) is not made DataParallel's. A file that starts its own path "
        "itself under a condition (`mp.spawn` under `if args.nodes > 1:`, `else` the fallback) migrates its fallback "
        "beside it (MGP120) unless the message says why not: a call of its own path under another condition, a "
        "print before that `if` (the set-up in its `else` would relaunch after it), or a call of the runtime the "
        "migration would make before it. So does a file whose own path an option chooses and which only joins its "
        "group under an `if` (`if args.distributed: dist.init_process_group(...)` with `--world-size`, each process "
        "launched by hand), where the file reads no launcher's variable: the set-up goes after that `if`. That "
        "`if` may be in a function the main block calls once."
    ),
    todo=(
        "Launch the file's own distributed path with the command in the message (B: the batch the fallback was "
        "given; on chosen GPUs, name them in CUDA_VISIBLE_DEVICES and make N their number)."
    ),
    veto=True,
)
BEFORE_THE_SET_UP = Review(
    "MGP337",
    name="runs-before-the-set-up",
    summary="a statement before mgpu_runtime.setup() prints or writes: it does so again in every process",
    why=(
        "The set-up goes after the statements that choose the GPUs (`os.environ['CUDA_VISIBLE_DEVICES'] = "
        "cfg.gpu`) or parse the command line, since a plain start relaunches there as one process per GPU. What "
        "runs before it runs in the process that relaunches and again in each process it starts, before the "
        "runtime keeps the other ranks' output quiet: YOLOv4's `init_logger()` printed its log path three times and "
        "left a log file named by the clock per process. The original printed and wrote it once."
    ),
    todo=(
        "Move the statement after `mgpu_runtime.setup()` (its output then comes once, from the main process), or "
        "guard its write with `if mgpu_runtime.is_main_process():` after the set-up."
    ),
)
TRAINED_ALONE = Review(
    "MGP239",
    name="entry-point-starts-one-device-training",
    summary="the script also starts training its migration does not make distributed: under the set-up each process runs it",
    why=(
        "The script is migrated as the entry point of the distributed training of the modules it imports (ncsn's "
        "`main.py` picks a runner of `runners/` by name), so `mgpu_runtime.setup()` at its start makes the "
        "program one process per GPU, whichever training it then runs. The modules the message names also train "
        "(they run a backward pass), but their migration does not make them distributed programs: they hold no "
        "DataParallel (the original ran them on one device), or keep theirs (their own diagnostics say why). "
        "Started that way, each of the N processes runs that training whole, writes its files and prints its lines."
    ),
    todo=(
        "Start the training of those modules as one process, as the original ran it: `MGPU_NPROC=1 python main.py "
        "...` (the set-up then keeps one process and changes nothing the script sees)."
    ),
)
FILE_KEEPS_A_WRAP = Review(
    "MGP232",
    name="file-keeps-a-wrap",
    summary=(
        "the file keeps a DataParallel wrap, so it is left as it is: --to ddp migrates a file entirely or not at all"
    ),
    why=(
        "`--to ddp` migrates a file entirely or not at all: a file that ran some wraps as one process per GPU "
        "and others as DataParallel, without the set-up and data of a distributed program, would work neither "
        "way. Another wrap in this file stays DataParallel (its own diagnostic says why)."
    ),
    todo="Migrate the wrap named in the message by hand first (or make it migratable), then run the tool again.",
)


class EntryPointSetup(Rule):
    """
    ## What it does
    Inserts ``mgpu_runtime.setup()`` once, where it runs before any model or tensor touches CUDA: at the top
    of the ``if __name__ == "__main__":`` block; in the function that block calls first when that function
    sets ``CUDA_VISIBLE_DEVICES`` (right after it does, also inside an ``if``), or when a wrap's
    ``device_ids`` reads what that function's command-line parsing binds (right after it); in the method of the
    wraps' class that chooses their ``device_ids=self.gpus`` (right where it does, MGP150); after the imports
    of a flat script; or at the top of ``def main()`` in a module without a main block. When the main block runs
    a click group some of whose commands wrap no model (deeplab-pytorch's ``crf`` beside ``train`` and ``test``),
    at the top of the group, under a test of the command invoked: ``if ctx.invoked_subcommand in ("train",
    "test"): mgpu_runtime.setup()``, else ``mgpu_runtime.setup(processes=1)``, so those commands stay one
    process and nothing the group prints comes twice. The GPUs the wraps
    chose go with it when they hold there what they hold at the wraps (``setup(devices=args.gpus)``, MGP150).

    It also decides whether the file becomes a distributed program at all: a file that already sets up
    distributed training itself (``init_process_group``, torch's or apex's ``DistributedDataParallel``,
    ``DistributedSampler``, ``mp.spawn``) does not get it: where a launcher chooses its own path and an option
    sets that path's per-process batch, a plain start is made to launch that path (MGP139); otherwise the file is
    left as it is, its DataParallel fallback too (MGP231: processes relaunched from the fallback would not
    provably take the file's own path with the same global batch), with the command that runs its own path. A file that
    keeps a DataParallel wrap (``dim != 0``, ``# noqa``, part of a model: MGP250) is left as it is, its other
    wraps included (MGP232): ``--to ddp`` migrates a file entirely or not at all.

    A script that starts its own distributed path itself under a condition, its DataParallel fallback in the
    ``else`` (SimCLR: ``if args.nodes > 1: mp.spawn(main, ...)``, ``else: main(0, args)``), where every call of that
    path runs under the same condition, migrates its fallback beside it: the set-up goes first in that ``else``
    (so the main block before the ``if`` must print nothing, and no call of the runtime may run there), and
    ``mgpu_runtime.leave_to_own_path()`` right before the spawn makes the runtime stand aside in that path's
    processes, where the migrated wrap is the original's DataParallel. No rewrite touches a site under that
    condition (and the fallback's ``dist.is_initialized()`` asks for the script's own group, MGP142). The same
    holds where an option chooses the own path and the file only joins its group under an ``if`` (pytorch/examples'
    ImageNet trainer, mobilenetv2: ``args.distributed = args.world_size > 1``, ``if args.distributed:
    dist.init_process_group(...)``, each process launched by hand), when no launcher's variable is read anywhere
    in the file (every relaunched process then takes the fallback again): ``leave_to_own_path()`` goes before the
    join and the set-up right after that ``if`` (what printed before it is said, MGP337). That ``if`` may be in a
    function the main block calls once (``main()``). Beside an own path, the script's own tests of its main
    process (``if not args.distributed or args.rank == 0:``, ``if main_process():``) hold on every process of
    the fallback, whose rank variables stay the original's: each gains ``and mgpu_runtime.is_main_process()``,
    True on the own path.

    A script with a main block and no DataParallel of its own that imports a module of the project whose
    migration makes it a distributed program with no entry point of its own (ncsn's ``main.py``, whose
    runner in ``runners/`` wraps the model and trains) is that program's entry point: it gets the set-up, and
    the rules of side effects (directories, files, writers) make what it does happen once.

    ## Why is this bad?
    One process per GPU needs each process bound to its own GPU before CUDA is first used, and a process
    group. ``setup()`` reads the launch environment (torchrun, SLURM, or none), binds the GPU, joins the
    group, and relaunches a plainly started ``python train.py`` under torchrun when it should use several
    GPUs, so the script keeps running the way it always did.

    ## Example
    ```python
    if __name__ == "__main__":
        main()
    ```

    ## Use instead
    ```python
    if __name__ == "__main__":
        mgpu_runtime.setup()
        main()
    ```

    ## Fix safety
    Safe: ``setup()`` is idempotent, and in a single process (world of one) changes nothing the script can
    see. In a module of helpers nothing is inserted: the runtime's wrapper calls ``setup()`` when it is built.
    A file that trains but has no place that runs first (MGP230) is left the same way, with a note, since
    the other processes then start late (after any work done before the wrap).
    """

    CODE = SETUP
    # A plain start of a file with its own distributed path runs that path (MGP139), under the runtime's style.
    LAUNCHES_OWN_PATH = True
    PHASE = PROGRAM
    USES = ("bindings", "entry_point", "handed", "loaders")
    STYLES = (RUNTIME_STYLE,)
    REVIEW_CODES = (NO_ENTRY_POINT, EXISTING_DISTRIBUTED_SETUP, FILE_KEEPS_A_WRAP, TRAINED_ALONE, BEFORE_THE_SET_UP)
    DESCRIPTION = "mgpu_runtime.setup() inserted where the program starts"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn


            def main():
                a = nn.DataParallel(nn.Linear(2, 2), dim=1)
                b = nn.DataParallel(nn.Linear(2, 2))


            if __name__ == '__main__':
                main()
            """,
            None,
            DDP,
            ("MGP201", "MGP232"),
        ),
        Example(
            """
            import torch.nn as nn


            def main():
                model = nn.DataParallel(nn.Linear(2, 2))


            if __name__ == "__main__":
                main()
            """,
            """
            import torch.nn as nn
            import mgpu_runtime


            def main():
                model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))


            if __name__ == "__main__":
                mgpu_runtime.setup()
                main()
            """,
            DDP,
            ("MGP101", "MGP120"),
        ),
        Example(
            """
            import os
            import torch.nn as nn


            def main():
                os.environ['CUDA_VISIBLE_DEVICES'] = '0,1'
                model = nn.DataParallel(nn.Linear(2, 2))


            if __name__ == '__main__':
                main()
            """,
            """
            import os
            import torch.nn as nn
            import mgpu_runtime


            def main():
                os.environ['CUDA_VISIBLE_DEVICES'] = '0,1'
                mgpu_runtime.setup()
                model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))


            if __name__ == '__main__':
                main()
            """,
            DDP,
            ("MGP101", "MGP120"),
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(nn.Linear(2, 2))
            for x in batches:
                model(x).mean().backward()
            """,
            """
            import torch.nn as nn
            import mgpu_runtime

            mgpu_runtime.setup()

            model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))
            for x in batches:
                model(x).mean().backward()
            """,
            DDP,
            ("MGP101", "MGP120"),
        ),
        Example(
            """
            import torch.nn as nn


            def build(model):
                return nn.DataParallel(model)
            """,
            """
            import mgpu_runtime


            def build(model):
                return mgpu_runtime.DistributedDataParallel(model)
            """,
            DDP,
            ("MGP101",),
        ),
        Example(
            """
            import torch.nn as nn


            def fit(model, batches):
                model = nn.DataParallel(model)
                for x in batches:
                    model(x).mean().backward()
            """,
            """
            import mgpu_runtime


            def fit(model, batches):
                model = mgpu_runtime.DistributedDataParallel(model)
                for x in batches:
                    model(x).mean().backward()
            """,
            DDP,
            ("MGP101", "MGP230"),
        ),
        Example(
            """
            import torch.distributed as dist
            import torch.nn as nn
            from torch.nn.parallel import DistributedDataParallel as DDP

            if args.distributed:
                dist.init_process_group('nccl')
                model = DDP(model)
            else:
                model = nn.DataParallel(model)
            """,
            None,
            DDP,
            ("MGP231",),
        ),
        # A configuration file sets the options after parsing, and the script prints before it does: a launch that
        # follows the file would print twice, so the own path is left to the command that runs it.
        Example(
            """
            import argparse
            import json
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler

            parser = argparse.ArgumentParser()
            parser.add_argument("--batch_size", type=int, default=16)
            parser.add_argument("--local_rank", type=int, default=-1)
            parser.add_argument("--config")
            args = parser.parse_args()
            print("options:", args)
            if args.config:
                for key, value in json.load(open(args.config)).items():
                    setattr(args, key, value)
            if args.local_rank != -1:
                torch.distributed.init_process_group("gloo")
                loader = DataLoader(data, sampler=DistributedSampler(data), batch_size=args.batch_size)
            else:
                model = nn.DataParallel(model)
            """,
            None,
            DDP,
            ("MGP231",),
            message="own path (line 17) left, `print` (line 12) runs before the config file (line 15): `torchrun",
            line=20,
            name="a launch cannot follow a configuration file when the script prints before it",
        ),
        # The GPUs parsed in main() go to the set-up, which comes right after the parsing.
        Example(
            """
            import torch.nn as nn


            def main():
                global args
                args = parser.parse_args()
                model = nn.DataParallel(nn.Linear(2, 2), device_ids=args.gpus)
                for x in batches:
                    model(x).mean().backward()


            if __name__ == "__main__":
                main()
            """,
            """
            import torch.nn as nn
            import mgpu_runtime


            def main():
                global args
                args = parser.parse_args()
                mgpu_runtime.setup(devices=args.gpus)
                model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))
                for x in batches:
                    model(x).mean().backward()


            if __name__ == "__main__":
                main()
            """,
            DDP,
            ("MGP101", "MGP120"),
            message="setup(devices=args.gpus) inserted in main(), after its command-line parser",
            line=7,
        ),
        # CUDA_VISIBLE_DEVICES set under an `if`: the set-up follows that `if`, with the GPUs renumbered in it.
        Example(
            """
            import os
            import torch.nn as nn


            def main():
                device_ids = config["gpu_ids"]
                if config["cuda"]:
                    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in device_ids)
                    device_ids = list(range(len(device_ids)))
                model = nn.DataParallel(nn.Linear(2, 2), device_ids=device_ids)
                for x in batches:
                    model(x).mean().backward()


            if __name__ == "__main__":
                main()
            """,
            """
            import os
            import torch.nn as nn
            import mgpu_runtime


            def main():
                device_ids = config["gpu_ids"]
                if config["cuda"]:
                    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in device_ids)
                    device_ids = list(range(len(device_ids)))
                mgpu_runtime.setup(devices=device_ids)
                model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))
                for x in batches:
                    model(x).mean().backward()


            if __name__ == "__main__":
                main()
            """,
            DDP,
            ("MGP101", "MGP120"),
            message="setup(devices=device_ids) inserted after CUDA_VISIBLE_DEVICES is set in main()",
            line=7,
        ),
        Example(
            """
            import argparse

            import torch.nn as nn


            def parse_args():
                parser = argparse.ArgumentParser()
                args = parser.parse_args()
                print(args)
                return args


            if __name__ == "__main__":
                args = parse_args()
                model = nn.DataParallel(nn.Linear(2, 2))
            """,
            """
            import argparse

            import torch.nn as nn
            import mgpu_runtime


            def parse_args():
                parser = argparse.ArgumentParser()
                args = parser.parse_args()
                print(args)
                return args


            if __name__ == "__main__":
                mgpu_runtime.setup()
                args = parse_args()
                model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))
            """,
            DDP,
            ("MGP101", "MGP120"),
            message="mgpu_runtime.setup() inserted at the top of the",
            name="a parse_args() that also prints runs after the set-up",
        ),
    )

    def apply(self) -> None:
        program = self.program
        if program.own_path and not program.wraps:
            # Its DataParallel fallback is a builder's of another module (DialoGPT's `load_model`).
            if not (self.LAUNCHES_OWN_PATH and own_path_launch(self.analysis) is not None):
                self._leave_to_own_path(program.fallback[0].call)
            return
        if not program.wraps:
            # A module that trains a model a project class holds is set up where it starts: in it when it is a
            # script, else (a module of classes) in the script that imports it, the entry point of what it starts.
            script = is_script(self.analysis.source.encode("utf-8", "surrogateescape"), self.analysis.path)
            if program.runs_distributed and not program.already_set_up and (program.starts or script):
                self._start(program.holds or program.starts)
            return
        first = program.wraps[0]
        if program.beside is not None:
            self._set_up_beside(program.beside)
            return
        if program.existing:
            if self.LAUNCHES_OWN_PATH and own_path_launch(self.analysis) is not None:
                return  # a plain start runs the own path (MGP139)
            self._leave_to_own_path(first)
            return
        if program.kept:
            line, _ = self.analysis.position(program.kept[0])
            for wrap in program.wraps:
                self.left(
                    wrap,
                    FILE_KEEPS_A_WRAP,
                    f"the DataParallel wrap at line {line} stays, so this file is left as it is; migrate that wrap "
                    "first",
                )
            return
        if program.already_set_up:
            return
        entry = self.analysis.entry_point
        if entry is None:
            if not self.analysis.loaders.training_loops and not self.analysis.handed.training_calls:
                return  # a module of helpers: the program starts elsewhere, the wrapper sets up when built
            starter = self._starter(first)
            self.left(
                first,
                NO_ENTRY_POINT,
                f"no entry point here: {starter} starts this program; migrated with this file, it calls {RUNTIME}.setup()"
                if starter
                else f"no entry point here (no main block or main()): call {RUNTIME}.setup() where your program starts",
            )
            return
        if not self.rewrite_allowed(entry.anchor):
            return
        if entry.devices is None and self._built_elsewhere_only(program.wraps):
            return  # CMC's models/alexnet.py: its main block tries a network; the scripts that build the class set up
        otherwise = program.one_process
        if otherwise is not None:
            test = self.analysis.code_of(otherwise.test)
            entry = replace(entry, when=test, place=f"{entry.place}, for `{shorten(test, 24)}` (its `else` wraps nothing: one process)")
        self._set_up(entry)

    def _built_elsewhere_only(self, wraps: list[cst.Call]) -> bool:
        """Whether every wrap is in a class that nothing in this file builds or names outside its own body, and the
        file trains nothing: the class is for the modules importing it, which build and train it and set up (the
        wrapper sets up when built), so a main block here (a quick try of a network) stays one process."""
        if self.analysis.loaders.training_loops or self.analysis.handed.training_calls:
            return False
        classes = []
        for wrap in wraps:
            holder = next((a for a in self.analysis.tree.ancestors(wrap) if type(a) is cst.ClassDef), None)
            if holder is None:
                return False
            classes.append(holder)
        tree = self.analysis.tree
        for holder in dict.fromkeys(classes):
            for node in tree.nodes(cst.Name):
                if node.value == holder.name.value and node is not holder.name and not any(a is holder for a in tree.ancestors(node)):
                    return False
        return True

    def _starter(self, wrap: cst.Call) -> Optional[str]:
        """The script (``path:line`` of its import) that imports this module, directly or through its package's
        ``__init__``, and is a script (a main block, or a flat script that parses its command line): the program's
        entry point, which its own migration sets up."""
        holder = next((a for a in self.analysis.tree.ancestors(wrap) if type(a) in (cst.ClassDef, cst.FunctionDef)), None)
        uses = holder.name.value if holder is not None else ""
        here = os.path.dirname(os.path.abspath(self.analysis.path))
        for importer in importers_through_packages(self.analysis.path, uses):
            try:
                with open(importer.path, "rb") as handle:
                    if is_script(handle.read(), importer.path):
                        return importer.where(here)
            except OSError:
                continue
        return None

    def _start(self, modules: tuple[str, ...]) -> None:
        """A script with no wrap of its own that starts the distributed programs of ``modules``: the set-up goes
        at its entry point, before anything it does runs on every process: a flat script's is after its imports."""
        entry = self.analysis.entry_point or script_start(self.analysis)
        if entry is None or not self.rewrite_allowed(entry.anchor):
            return
        if set_up_where_chosen(modules, self.options) is not None:
            return  # the class holding the model sets up where it chooses the GPUs (its MGP120 says where)
        here = os.path.dirname(os.path.abspath(self.analysis.path))
        trained = ", ".join(os.path.relpath(module, here) for module in modules[:2]) + (" ..." if len(modules) > 2 else "")
        if set(modules) <= set(self.program.holds):
            self._set_up(entry, f"; it trains the model held in {trained}")
        else:
            self._set_up(entry, f"; it starts the training of {trained}")
        data = self.analysis.source.encode("utf-8", "surrogateescape")
        alone = trained_apart(self.analysis.path, data, modules)
        if alone:
            named = ", ".join(os.path.relpath(module, here) for module in alone[:2]) + (" ..." if len(alone) > 2 else "")
            self.left(
                entry.anchor,
                TRAINED_ALONE,
                f"also imports training that this migration does not make distributed ({named}): started so, every "
                "process runs it whole; start it with MGPU_NPROC=1",
            )

    def _set_up_beside(self, starting: cst.If) -> None:
        """The set-up in the ``else`` of the ``if`` that starts the file's own distributed path (``Program.beside``),
        and ``leave_to_own_path()`` right before that path's start: its processes run it as the original did."""
        condition = shorten(self.analysis.code_of(starting.test), 28)
        spawn = next((call for call in self.program.existing if self.analysis.resolve(call.func) in SPAWNS), None)
        if spawn is None:
            # An option chooses the own path, which joins its group in ``starting`` (no start of its own): the set-up
            # goes after that ``if``, and stands aside in the own path's processes (leave_to_own_path before the join).
            join = next(call for call in self.program.existing if on_own_path(self.analysis, starting, call))
            started = self.analysis.tree.statement(join)
            if not self.rewrite_allowed(starting, self.CODE) or started is None:
                return
            entry = EntryPoint(starting, True, f"after the own distributed path's `if {condition}:` (it stands aside there)")
        else:
            assert type(starting.orelse) is cst.Else and type(starting.orelse.body) is cst.IndentedBlock
            first = starting.orelse.body.body[0]
            started = self.analysis.tree.statement(spawn)
            if not self.rewrite_allowed(first) or started is None:
                return
            entry = EntryPoint(first, False, f"where the file does not start its own distributed path (`else` of `{condition}`)")
        self._set_up(entry)
        self._main_process_of_the_fallback()
        leave = cst.SimpleStatementLine([cst.Expr(runtime_call("leave_to_own_path"))])
        self.edits.insert_before(started, leave)
        own, _ = self.analysis.position(self.program.existing[0])
        self.rewrote(
            started,
            f"{RUNTIME}.leave_to_own_path() inserted: the own distributed path (line {own}) that the file "
            f"{'starts' if spawn is not None else 'joins'} here stays its own, as it was",
        )

    def _main_process_of_the_fallback(self) -> None:
        """Beside an own path, the script's tests of its own main process (``if args.rank == 0:``, pytorch/examples'
        ``not args.multiprocessing_distributed or args.rank % ngpus_per_node == 0``, semseg's ``main_process()``)
        hold on every process of the runtime's job, whose fallback keeps the original's rank variables: each gains
        ``and mgpu_runtime.is_main_process()``, which the own path's processes answer True (the runtime stands
        aside there), so that path's test is its own, as it was."""
        for guard in main_process_blocks(self.analysis):
            test = guard.test
            code = self.analysis.code_of(test)
            if f"{RUNTIME}." in code or not self.rewrite_allowed(test):
                continue
            self.edits.replace(test, lambda test: both(test, runtime_call("is_main_process")))
            self.rewrote(
                test,
                f"`{shorten(code, 40)}` holds on every process of the fallback: and {RUNTIME}.is_main_process() added "
                "(True on the own path)",
            )

    def _leave_to_own_path(self, site: cst.CSTNode) -> None:
        """MGP231 at ``site``: the file's own distributed path stays to be launched, with the command that runs it
        and, where a configuration file overrides the parsed command line, why no plain start can."""
        line, _ = self.analysis.position(self.program.existing[0])
        command = self._own_path_command()
        why = own_path_refusal(self.analysis)
        if command and why:
            message = f"own path (line {line}) left, {why}: `{command}`"
            if len(message) > 160:
                message = f"own distributed path (line {line}) left, {why}: launch it with torchrun"
        elif command:
            message = f"own distributed path (line {line}), DataParallel fallback left: launch that path with `{command}`"
        elif self._own_start():
            message = f"own distributed path (line {line}), DataParallel fallback left: the file starts it{self._own_start()}"
        elif self.program.beside_refused:
            message = f"own distributed path (line {line}), DataParallel fallback left: the file joins it, and {self.program.beside_refused}"
        else:
            message = (
                f"this file sets up distributed training itself (line {line}): its DataParallel fallback is left; "
                "launch its own distributed path"
            )
        self.left(site, EXISTING_DISTRIBUTED_SETUP, message)

    def _own_start(self) -> str:
        """Where the file starts its own processes itself (SimCLR's ``mp.spawn(main, ..., nprocs=args.gpus)`` under
        ``if args.nodes > 1:``), and under which condition, for MGP231's message; "" when it does not."""
        for call in self.analysis.calls:
            if self.analysis.resolve(call.func) not in SPAWNS:
                continue
            line, _ = self.analysis.position(call)
            guard = next(iter(self.analysis.tree.enclosing_ifs(call)), None)
            if guard is None:
                return f" (line {line})"
            test, orelse = guard
            why = f", and {self.program.beside_refused}" if self.program.beside_refused else ""
            # (MGP231's message, 160 characters at most: about 100 of them are its own words and lines)
            condition = shorten(self.analysis.code_of(test.test), max(12, 58 - len(why)))
            return f" (line {line}) when {'not ' if orelse else ''}`{condition}`{why}"
        return ""

    def _own_path_command(self) -> Optional[str]:
        """The torchrun command that runs the file's own distributed path, when the launch environment chooses it
        (``LOCAL_RANK``, ``RANK`` or ``WORLD_SIZE`` read, or a ``--local_rank`` argument) and a command-line option
        sets its per-process batch: that option at the fallback's batch ``B`` over the ``N`` processes."""
        batch = own_path_batch(self.analysis)
        return f"torchrun --nproc_per_node=N {os.path.basename(self.analysis.path)} {batch.name} B/N" if batch else None

    def _set_up(self, entry: EntryPoint, why: str = "") -> None:
        """Insert the set-up at the entry point, given the GPUs the wraps chose when it can be (MGP150)."""
        self.edits.need_import(RUNTIME)
        setup, given = runtime_call("setup"), ""
        chosen = self.program.chosen_devices(self.analysis)
        if chosen is not None and chosen.passed is not None:
            setup = setup.with_changes(args=[cst.Arg(chosen.passed.deep_clone(), keyword=cst.Name("devices"), equal=_EQUAL)])
            given = f"devices={shorten(self.analysis.code_of(chosen.passed))}"
        statement: cst.BaseStatement = cst.SimpleStatementLine([cst.Expr(setup)])
        if entry.when is not None:
            # The commands that run no model stay one process, whatever MGPU_NPROC or the GPUs say.
            alone = runtime_call("setup").with_changes(args=[cst.Arg(cst.Integer("1"), keyword=cst.Name("processes"), equal=_EQUAL)])
            statement = cst.If(
                test=cst.parse_expression(entry.when),
                body=cst.IndentedBlock([statement]),
                orelse=cst.Else(cst.IndentedBlock([cst.SimpleStatementLine([cst.Expr(alone)])])),
            )
        if entry.after:
            self.edits.insert_after(entry.anchor, statement)
        else:
            leading = entry.anchor.leading_lines
            if leading and not leading[0].comment:
                statement = statement.with_changes(leading_lines=[leading[0]])
            self.edits.insert_before(entry.anchor, statement)
        self.rewrote(entry.anchor, f"{RUNTIME}.setup({given}) inserted {entry.place}{why}")
        if entry.after:
            self._said_before(entry.anchor)

    def _said_before(self, anchor: cst.BaseStatement) -> None:
        """MGP337 for each statement of the set-up's block above it that prints or writes (``print``, a function
        of the project or of this file that does, ``logging.basicConfig(filename=...)``): YOLOv4's ``logging =
        init_logger(log_dir='log')`` before ``os.environ['CUDA_VISIBLE_DEVICES'] = cfg.gpu``, after which the set-up
        goes."""
        block = self.analysis.tree.parent(anchor)
        body = list(block.body) if type(block) in (cst.IndentedBlock, cst.Module) else []
        if anchor not in body:
            return
        project = project_of(self.analysis.path)
        line = self.analysis.position(anchor)[0]
        for before in body[: body.index(anchor) + 1]:
            if parses_arguments(self.analysis, before):
                continue
            inside = set(map(id, contains(before, lambda node: type(node) is cst.Call)))
            for call in (node for node in self.analysis.calls if id(node) in inside):
                what = self._shows_or_writes(call, project)
                if what is not None:
                    self.left(
                        call,
                        BEFORE_THE_SET_UP,
                        f"`{shorten(self.analysis.code_of(call.func), 30)}(...)` {what} before {RUNTIME}.setup() (line {line}): "
                        "again in every process",
                    )
                    break

    def _shows_or_writes(self, call: cst.Call, project, depth: int = 0) -> Optional[str]:
        qualified = self.analysis.resolve(call.func) or ""
        if qualified == "builtins.print" or (type(call.func) is cst.Name and call.func.value == "print"):
            return "prints"
        if qualified == "warnings.warn":
            return "warns"
        if qualified == "logging.basicConfig" and any(arg.keyword is not None and arg.keyword.value == "filename" for arg in call.args):
            return "opens a log file"
        if type(call.func) is cst.Name and call.func.value in self.analysis.bindings.local and depth < 3:
            own = next((s for s in self.analysis.module.body if type(s) is cst.FunctionDef and s.name.value == call.func.value), None)
            inner = contains(own, lambda node: type(node) is cst.Call) if own is not None else []
            shown = [self._shows_or_writes(node, None, depth + 1) for node in inner]
            if any(shown):
                return next(what for what in shown if what)
        if project is None or qualified.startswith(("torch.", "builtins.", "os.", "logging.")):
            return None
        found = project.find(qualified) if qualified else None
        if found is None or not isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        if project.writes(found) is not None:
            return "writes"
        calls = [node for node in ast.walk(found.node) if isinstance(node, ast.Call)]
        if any(isinstance(node.func, ast.Name) and node.func.id == "print" for node in calls):
            return "prints"
        return None


_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
_SET_UP = (
    "if torch.cuda.is_available():\n    torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n",
    "dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')\n",
)
_TEAR_DOWN = "dist.destroy_process_group()\n"


class TorchSetup(EntryPointSetup):
    """
    ## What it does
    Under ``--to ddp --style torch``, inserts the textbook set-up where the default style would call
    ``mgpu_runtime.setup()`` (the top of the main block, after the imports of a flat script ...): the
    process's GPU bound from torchrun's ``LOCAL_RANK`` on CUDA, then
    ``dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')`` (rank, world size and
    address from the torchrun environment); and ``dist.destroy_process_group()`` after the last statement of
    the same block. The files it cannot write that way are left whole (see the codes below).

    ## Why is this bad?
    One process per GPU needs a process group, and each process bound to its own GPU before CUDA is first
    used. The plain form needs nothing beyond PyTorch, and is the one reviewers know.

    ## Example
    ```python
    if __name__ == "__main__":
        main()
    ```

    ## Use instead
    ```python
    if __name__ == "__main__":
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ['LOCAL_RANK']))
        dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')
        main()
        dist.destroy_process_group()
    ```

    ## Fix safety
    The script must now be launched by ``torchrun`` (``torchrun --nproc_per_node=N train.py``), or any
    launcher that sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``MASTER_ADDR``: unlike the runtime it does
    not relaunch a plain ``python train.py``. A rewrite that only the runtime makes (an explicit device, a
    loss weighted by its targets, a loader the tool cannot rebuild) leaves the whole file as it is, with
    MGP295 or MGP296: the default style migrates it. So does a file that trains but has no place that runs
    first (no main block, no ``main()``): torch's wrapper needs the process group before it is built (MGP296).
    """

    CODE = Rewrite("MGP161")
    LAUNCHES_OWN_PATH = False
    STYLES = (TORCH_STYLE,)
    REVIEW_CODES = (NEEDS_RUNTIME, NO_TORCH_FORM)
    DESCRIPTION = "process group set up from the torchrun environment, and destroyed at the end (--style torch)"
    EXAMPLES = (
        Example(
            EntryPointSetup.EXAMPLES[1].before,  # the default style's main block, in this style
            """
            import torch.nn as nn
            import torch
            import torch.distributed as dist
            import os


            def main():
                model = torch.nn.parallel.DistributedDataParallel(nn.Linear(2, 2), device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None)


            if __name__ == "__main__":
                if torch.cuda.is_available():
                    torch.cuda.set_device(int(os.environ['LOCAL_RANK']))
                dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')
                main()
                dist.destroy_process_group()
            """,
            DDP,
            ("MGP160", "MGP161"),
            TORCH_OPTIONS,
        ),
        Example(
            """
            import torch.nn as nn

            dist = None
            model = nn.DataParallel(nn.Linear(2, 2))
            for x in batches:
                model(x).mean().backward()
            """,
            None,
            DDP,
            ("MGP296",),
            TORCH_OPTIONS,
        ),
        Example(EntryPointSetup.EXAMPLES[5].before, None, DDP, ("MGP296",), TORCH_OPTIONS),  # trains, no entry point
    )

    def apply(self) -> None:
        super().apply()
        program = self.program
        if (
            program.migrates
            and not program.already_set_up
            and self.analysis.entry_point is None
            and (self.analysis.loaders.training_loops or self.analysis.handed.training_calls)
        ):
            # The runtime's wrapper would set up when built; torch's needs the process group before.
            self.left(program.wraps[0], NO_TORCH_FORM, "it trains, but has no main block or main() for init_process_group; file left")

    def _set_up(self, entry: EntryPoint, why: str = "") -> None:
        if dist_taken(self.analysis):
            self.left(entry.anchor, NO_TORCH_FORM, "this file binds `dist` itself: the scaffold's `dist.` calls would clash; left")
            return
        for module in ("torch", DIST_IMPORT, "os"):
            self.edits.need_import(module)
        set_up = [statement(code) for code in _SET_UP]
        leading = entry.anchor.leading_lines
        if entry.after:
            for new in set_up:
                self.edits.insert_after(entry.anchor, new)
        else:
            if leading and not leading[0].comment:
                set_up[0] = set_up[0].with_changes(leading_lines=[leading[0]])
            for new in set_up:
                self.edits.insert_before(entry.anchor, new)
        self.rewrote(entry.anchor, f"process group from the torchrun environment {entry.place}; launch with torchrun")
        block = self.analysis.tree.parent(entry.anchor)
        last = block.body[-1] if type(block) in (cst.Module, cst.IndentedBlock) and block.body else None
        ends = type(last) is cst.SimpleStatementLine and any(
            type(small) in (cst.Return, cst.Raise) for small in last.body
        )
        if last is not None and not ends:
            self.edits.insert_after(last, statement(_TEAR_DOWN))

