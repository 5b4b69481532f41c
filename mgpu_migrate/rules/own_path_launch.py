"""MGP139: a plain start of a file with its own distributed path runs that path, with the original's global batch
(``--to ddp``)."""

from __future__ import annotations

import os
from typing import Callable, cast

import libcst as cst

from mgpu_migrate.analysis.own_path import launched, own_path_gradient_sums, own_path_launch, own_path_writes, rank_namespace
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, PROGRAM, RUNTIME_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, runtime_call, with_keyword

OWN_PATH_WRITES = Review(
    "MGP325",
    name="own-path-writes-on-every-process",
    summary="the file's own distributed path writes this on every process, where the original wrote it once",
    why=(
        "A plain start of this file now runs its own distributed path as one process per GPU (MGP139). The "
        "original, started the same way, ran its DataParallel branch in one process, which wrote this file or "
        "directory once. The own path is the script's code: it runs this call on every process (no "
        "`if args.local_rank in [-1, 0]:` around it), so each process writes it, at the same time, into the same "
        "path. The tool puts a statement that only writes under the script's own main-process test (`if "
        "args.local_rank in [-1, 0]:`, MGP139) where the parsed command line that holds `--local_rank` is bound "
        "there; this write is not such a statement (a writer kept in a variable, a result used), or no such "
        "name is bound where it runs."
    ),
    todo=(
        "Put the call under the script's own main-process test (`if args.local_rank in [-1, 0]:`), or under "
        "`not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0`."
    ),
    kept_when_left=True,
)


OWN_PATH_GRADIENT_SUM = Review(
    "MGP327",
    name="own-path-sums-gradients",
    summary="the file's own distributed path adds up the processes' gradients by hand, where DataParallel averaged them",
    why=(
        "A plain start of this file now runs its own distributed path as one process per GPU (MGP139). That path "
        "reduces the gradients itself (an all-reduce of the parameters' `.grad`) without dividing by the number of "
        "processes, while each process's loss is the mean over its own rows: each step's gradient is W times the one "
        "the DataParallel branch took (the mean of the devices' means). SGD then takes W times the step; Adam nearly "
        "the same step, but clipping (`clip_grad_norm_`) and `eps` see W times the gradient. The original run and "
        "the migrated one train differently unless the script divides by the number of processes."
    ),
    todo=(
        "Divide the summed gradients by the number of processes (`torch.distributed.get_world_size()`) in the "
        "script's own reduction, or start the script with `MGPU_NPROC=1` to keep its DataParallel branch."
    ),
    kept_when_left=True,
)


class OwnPathLaunch(Rule):
    """
    ## What it does
    In a file that sets up distributed training of its own beside a DataParallel fallback, where a launcher's
    variables choose that path (``LOCAL_RANK``, ``RANK`` or ``WORLD_SIZE`` read, or a ``--local_rank``
    argument, which defaults to ``LOCAL_RANK``: MGP131) and a command-line option sets the batch its
    ``DistributedSampler`` loader loads per process (a call given ``sampler=`` a ``DistributedSampler`` and
    ``batch_size=args.<option>``: torch's ``DataLoader``, or the project's own builder that hands both on to one,
    ``train_data.get_loader(batch_size=args.batch_size, sampler=train_sampler)``; or a loader class of the project's own named
    ``Distributed...Loader`` that takes the rank or the number of processes, given the option by keyword or at
    the position of its ``__init__``'s batch parameter), inserts ``mgpu_runtime.launch_own_path(option, default)``
    where the program starts: at the top of the ``if __name__ == "__main__":`` block, or after the imports of a
    script that parses its command line at module level; in both, before the command line is parsed and before
    anything touches CUDA. The option's spellings and its declared default are read from the parser.

    Where a configuration file overrides the parsed options (``setattr(args, k, v)`` for each key of a loaded
    JSON, ``vars(args).update(...)``, or ``parser.set_defaults(**config)`` followed, in the same block, by a
    second ``args = parser.parse_args()``), the batch the script uses is known only after that block: the call goes
    right after it, given that value (``launch_own_path("--train_batch_size", batch=args.train_batch_size)``),
    and the relaunched processes get their share on their command line (a script that lets its command line
    override the file then uses it; each process checks that it does). What runs before the call may only read
    (the file, the environment, the command line): a call that may write, print, log or touch CUDA there leaves
    the file (MGP231, naming it).

    The DataParallel fallback may be a builder's of another module of the project that this script calls
    (DialoGPT's ``load_model``, which wraps the model when ``args.n_gpu > 1``, never on the own path): the
    script is migrated the same way, and that module stays as it is (no MGP320) when every script that trains
    the model it returns launches its own path so; otherwise both are left. A class of another module whose
    ``__init__`` wraps the model on ``self`` is such a fallback too, built by name or through
    ``getattr(trainers, args.trainer)(...)`` (any class the module exports).

    The fallback must run on every visible GPU (``nn.DataParallel(model)``, ``device_ids=range(
    torch.cuda.device_count())``), which is what a plain start launches. One given the GPUs it runs on
    (``device_ids=args.gpus``, a trainer's ``self.device_ids`` from a ``--device-ids 0`` option: one GPU, no
    DataParallel, by default) leaves the file (MGP231, naming them): a plain start would run one process per
    visible GPU, several where the original ran one.

    Started plainly (``python train.py --train_batch_size 12``) on W devices (the visible GPUs, or
    ``MGPU_NPROC``), the call relaunches the same command line under torchrun as W processes, each given the
    option at the original's value over W (``--train_batch_size 6`` at W = 2): the file's own path then trains
    on the global batch its DataParallel fallback was given, the same rows each step (with an unshuffled
    ``DistributedSampler``: rank r loads rows r, r + W, ... of each global batch). The main process alone
    prints, as under ``mgpu_runtime.setup()`` (``MGPU_LOG``). The DataParallel fallback stays for what the
    own path cannot keep: on one device, under a launcher of the user's own (torchrun, SLURM), or with a batch
    that does not split evenly over W (or an abbreviated option, which the call cannot read), the call does
    nothing (the last two say so on stderr, once) and the script runs its DataParallel branch as before.

    What the own path writes on every process, outside its own main-process tests, the original wrote once: a
    directory made with ``os.makedirs`` gets ``exist_ok=True`` (no process fails where another made it); a
    statement that only writes (``torch.save(...)``, ``model.save_pretrained(...)``, ``json.dump(obj, open(path,
    "w"))``, a ``with open(path, "w")`` block) goes under the script's own main-process test,
    ``if args.local_rank in [-1, 0]:`` (one ``if`` for neighbours), where ``args`` is the parsed command line
    that holds ``--local_rank``, bound where the write runs. That test holds in the DataParallel branch too
    (``local_rank`` is -1), so the fallback writes as before. A write the tool cannot guard that way (no such
    ``args`` there, a writer kept in a variable, a result used) is named at its site (MGP325).

    Where the batch cannot be set that way (no such option, a default that is not a whole number, no place
    that runs first), the file is left as it is (MGP231), with the ``torchrun`` command that runs its own path
    when there is one. Under ``--style torch`` the file is left the same way: that style has no runtime to
    relaunch a plain start.

    ## Why is this bad?
    Left as it is, a plain start of such a file runs DataParallel, with its memory and speed costs; its own
    path, which is what the maintainers wrote for several GPUs, runs only under a command the user must write,
    with the per-process batch computed by hand.

    ## Example
    ```python
    parser.add_argument("--train_batch_size", type=int, default=12)
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    ...
    loader = DataLoader(data, sampler=DistributedSampler(data), batch_size=args.train_batch_size)
    if n_gpu > 1:
        model = nn.DataParallel(model)
    ```

    ## Use instead
    ```python
    mgpu_runtime.launch_own_path("--train_batch_size", 12)
    parser.add_argument("--train_batch_size", type=int, default=12)
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
    ...
    ```

    ## Fix safety
    The own path is the script's: the tool proves only that it is given the original's global batch. It trains
    as the original did where that path does (torch's DDP averages the processes' gradients, which is the
    global batch's mean loss when every process has an equal share: a dataset whose length W divides, with a
    ``DistributedSampler`` that does not shuffle, or shuffles as the original's sampler did). ``mgpu-migrate
    verify`` runs the migrated file plainly, at W processes on the CPU, against the original under
    DataParallel. A write put under the main-process test is not waited for: as in the script's own guarded
    writes, the other processes go on (a file another process reads next needs the script's own barrier). What
    the own path prints or logs of its own values is the main process's, as the script wrote it: its
    per-process batch (BERT-NER's "Batch size = 16" at W = 2, where the original logged 32), a loss of its rows.
    """

    CODE = Rewrite("MGP139", kept_when_left=True)
    PHASE = PROGRAM
    USES = ()
    STYLES = (RUNTIME_STYLE,)
    TARGETS = (DDP,)
    REVIEW_CODES = (OWN_PATH_WRITES, OWN_PATH_GRADIENT_SUM)
    DESCRIPTION = "a plain start runs the file's own distributed path, each process with its share of the batch"
    EXAMPLES = (
        Example(
            """
            import argparse
            import torch.distributed as dist
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler

            parser = argparse.ArgumentParser()
            parser.add_argument("--batch_size", type=int, default=32)
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            if args.local_rank != -1:
                dist.init_process_group("nccl")
            sampler = DistributedSampler(data) if args.local_rank != -1 else None
            loader = DataLoader(data, sampler=sampler, batch_size=args.batch_size)
            if args.local_rank == -1:
                model = nn.DataParallel(model)
            for x in loader:
                model(x).mean().backward()
                if args.local_rank != -1:
                    for p in model.parameters():
                        dist.all_reduce(p.grad.data)
                optimizer.step()
            """,
            """
            import argparse
            import torch.distributed as dist
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler
            import mgpu_runtime

            mgpu_runtime.launch_own_path("--batch_size", 32)

            parser = argparse.ArgumentParser()
            parser.add_argument("--batch_size", type=int, default=32)
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            if args.local_rank != -1:
                dist.init_process_group("nccl")
            sampler = DistributedSampler(data) if args.local_rank != -1 else None
            loader = DataLoader(data, sampler=sampler, batch_size=args.batch_size)
            if args.local_rank == -1:
                model = nn.DataParallel(model)
            for x in loader:
                model(x).mean().backward()
                if args.local_rank != -1:
                    for p in model.parameters():
                        dist.all_reduce(p.grad.data)
                optimizer.step()
            """,
            DDP,
            ("MGP139", "MGP327"),
            message="`dist.all_reduce(p.grad.data)` adds up the processes' gradients: W times DataParallel's average",
            line=20,
            name="an own path that sums the gradients by hand",
        ),
        Example(
            """
            import argparse
            import torch.distributed as dist
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler

            parser = argparse.ArgumentParser()
            parser.add_argument("--batch_size", type=int, default=32)
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            if args.local_rank != -1:
                dist.init_process_group("nccl")
            sampler = DistributedSampler(data) if args.local_rank != -1 else None
            loader = DataLoader(data, sampler=sampler, batch_size=args.batch_size)
            if args.local_rank == -1:
                model = nn.DataParallel(model)
            for x in loader:
                model(x).mean().backward()
                if args.local_rank != -1:
                    for p in model.parameters():
                        dist.all_reduce(p.grad.data)
                        p.grad.data /= dist.get_world_size()
                optimizer.step()
            """,
            """
            import argparse
            import torch.distributed as dist
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler
            import mgpu_runtime

            mgpu_runtime.launch_own_path("--batch_size", 32)

            parser = argparse.ArgumentParser()
            parser.add_argument("--batch_size", type=int, default=32)
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            if args.local_rank != -1:
                dist.init_process_group("nccl")
            sampler = DistributedSampler(data) if args.local_rank != -1 else None
            loader = DataLoader(data, sampler=sampler, batch_size=args.batch_size)
            if args.local_rank == -1:
                model = nn.DataParallel(model)
            for x in loader:
                model(x).mean().backward()
                if args.local_rank != -1:
                    for p in model.parameters():
                        dist.all_reduce(p.grad.data)
                        p.grad.data /= dist.get_world_size()
                optimizer.step()
            """,
            DDP,
            ("MGP139",),
            name="an own path that averages the gradients by hand",
        ),
        Example(
            """
            import argparse
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler

            parser = argparse.ArgumentParser()
            parser.add_argument("-b", "--batch-size", type=int, default=32)
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            sampler = DistributedSampler(data) if args.local_rank != -1 else None
            loader = DataLoader(data, sampler=sampler, batch_size=args.batch_size)
            if args.local_rank == -1:
                model = nn.DataParallel(model)
            else:
                model = nn.parallel.DistributedDataParallel(model)
            """,
            """
            import argparse
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler
            import mgpu_runtime

            mgpu_runtime.launch_own_path(("-b", "--batch-size"), 32)

            parser = argparse.ArgumentParser()
            parser.add_argument("-b", "--batch-size", type=int, default=32)
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            sampler = DistributedSampler(data) if args.local_rank != -1 else None
            loader = DataLoader(data, sampler=sampler, batch_size=args.batch_size)
            if args.local_rank == -1:
                model = nn.DataParallel(model)
            else:
                model = nn.parallel.DistributedDataParallel(model)
            """,
            DDP,
            ("MGP139",),
            message="own distributed path (line 9) on each GPU, --batch-size 32/W per process",
            line=5,
        ),
        Example(
            """
            import os
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler


            def main(args):
                if "LOCAL_RANK" in os.environ:
                    torch.distributed.init_process_group("gloo")
                    sampler = DistributedSampler(data)
                    model = nn.parallel.DistributedDataParallel(model)
                else:
                    sampler = None
                    model = nn.DataParallel(model)
                loader = DataLoader(data, sampler=sampler, batch_size=args.train_batch_size)
                train(model, loader)
                torch.save(model.state_dict(), "model.pt")


            if __name__ == "__main__":
                parser.add_argument("--train_batch_size", type=int, default=8)
                main(parser.parse_args())
            """,
            """
            import os
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler
            import mgpu_runtime


            def main(args):
                if "LOCAL_RANK" in os.environ:
                    torch.distributed.init_process_group("gloo")
                    sampler = DistributedSampler(data)
                    model = nn.parallel.DistributedDataParallel(model)
                else:
                    sampler = None
                    model = nn.DataParallel(model)
                loader = DataLoader(data, sampler=sampler, batch_size=args.train_batch_size)
                train(model, loader)
                torch.save(model.state_dict(), "model.pt")


            if __name__ == "__main__":
                mgpu_runtime.launch_own_path("--train_batch_size", 8)
                parser.add_argument("--train_batch_size", type=int, default=8)
                main(parser.parse_args())
            """,
            DDP,
            ("MGP139", OWN_PATH_WRITES),
            message="torch.save runs on every process of the own path",
            line=17,
            name="a save the own path makes on every process is named",
        ),
        # Its writes happen once: a directory made by every process that none fails on, saves on the main one.
        Example(
            """
            import argparse
            import os
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler

            parser = argparse.ArgumentParser()
            parser.add_argument("--batch_size", type=int, default=16)
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            if args.local_rank != -1:
                torch.distributed.init_process_group("gloo")
                model = nn.parallel.DistributedDataParallel(model)
                loader = DataLoader(data, sampler=DistributedSampler(data), batch_size=args.batch_size)
            else:
                model = nn.DataParallel(model)
                loader = DataLoader(data, batch_size=args.batch_size)
            train(model, loader)
            os.makedirs("out")
            # the weights, then the optimizer
            torch.save(model.state_dict(), "out/model.pt")
            torch.save(optimizer.state_dict(), "out/optimizer.pt")
            """,
            """
            import argparse
            import os
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler
            import mgpu_runtime

            mgpu_runtime.launch_own_path("--batch_size", 16)

            parser = argparse.ArgumentParser()
            parser.add_argument("--batch_size", type=int, default=16)
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            if args.local_rank != -1:
                torch.distributed.init_process_group("gloo")
                model = nn.parallel.DistributedDataParallel(model)
                loader = DataLoader(data, sampler=DistributedSampler(data), batch_size=args.batch_size)
            else:
                model = nn.DataParallel(model)
                loader = DataLoader(data, batch_size=args.batch_size)
            train(model, loader)
            os.makedirs("out", exist_ok=True)
            # the weights, then the optimizer
            if args.local_rank in [-1, 0]:
                torch.save(model.state_dict(), "out/model.pt")
                torch.save(optimizer.state_dict(), "out/optimizer.pt")
            """,
            DDP,
            ("MGP139",),
            message="torch.save: written once, by the own path's main process (`if args.local_rank in [-1, 0]:`)",
            line=22,
            name="the own path's writes happen once",
        ),
        # The own path divides the option by the processes itself: a share of it would be divided twice.
        Example(
            """
            import argparse
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler

            parser = argparse.ArgumentParser()
            parser.add_argument("--batch_size", type=int, default=16)
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            if args.local_rank != -1:
                torch.distributed.init_process_group("gloo")
                args.batch_size = int(args.batch_size / torch.distributed.get_world_size())
                model = nn.parallel.DistributedDataParallel(model)
                loader = DataLoader(data, sampler=DistributedSampler(data), batch_size=args.batch_size)
            else:
                model = nn.DataParallel(model)
            """,
            None,
            DDP,
            (),
        ),
        # `-b` beside `-b1`: a plain start could not tell `-b12` (the batch) from `-b1 2`, so the file is left.
        Example(
            """
            import argparse
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler

            parser = argparse.ArgumentParser()
            parser.add_argument("-b", "--batch_size", type=int, default=16)
            parser.add_argument("-b1", type=float, default=0.5)
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            if args.local_rank != -1:
                torch.distributed.init_process_group("gloo")
                model = nn.parallel.DistributedDataParallel(model)
                loader = DataLoader(data, sampler=DistributedSampler(data), batch_size=args.batch_size)
            else:
                model = nn.DataParallel(model)
            """,
            None,
            DDP,
            (),
        ),
        # A configuration file overrides the parsed options (`--config`): the batch is known after it, where the
        # launch goes, given the batch the script then holds.
        Example(
            """
            import argparse
            import json
            import sys
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler

            parser = argparse.ArgumentParser()
            parser.add_argument("--batch_size", type=int, default=16)
            parser.add_argument("--local_rank", type=int, default=-1)
            parser.add_argument("--config")
            args = parser.parse_args()
            if args.config:
                with open(args.config) as handle:
                    for key, value in json.load(handle).items():
                        setattr(args, key, value)
                argv = sys.argv[1:]
                given, _ = parser.parse_known_args(argv)
                for key, value in vars(given).items():
                    if f"--{key}" in argv:
                        setattr(args, key, value)
            if args.local_rank != -1:
                torch.distributed.init_process_group("gloo")
                loader = DataLoader(data, sampler=DistributedSampler(data), batch_size=args.batch_size)
            else:
                model = nn.DataParallel(model)
            """,
            """
            import argparse
            import json
            import sys
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler
            import mgpu_runtime

            parser = argparse.ArgumentParser()
            parser.add_argument("--batch_size", type=int, default=16)
            parser.add_argument("--local_rank", type=int, default=-1)
            parser.add_argument("--config")
            args = parser.parse_args()
            if args.config:
                with open(args.config) as handle:
                    for key, value in json.load(handle).items():
                        setattr(args, key, value)
                argv = sys.argv[1:]
                given, _ = parser.parse_known_args(argv)
                for key, value in vars(given).items():
                    if f"--{key}" in argv:
                        setattr(args, key, value)

            mgpu_runtime.launch_own_path("--batch_size", batch=args.batch_size)
            if args.local_rank != -1:
                torch.distributed.init_process_group("gloo")
                loader = DataLoader(data, sampler=DistributedSampler(data), batch_size=args.batch_size)
            else:
                model = nn.DataParallel(model)
            """,
            DDP,
            ("MGP139",),
            message="own path (line 23) per GPU, args.batch_size/W each after the config file; DataParallel for one GPU",
            line=13,
            name="the launch follows a configuration file that overrides the command line",
        ),
        # The own path's loader is a class of the project's own that says it is distributed and takes the rank and
        # the number of processes: its batch keyword is the option.
        Example(
            """
            import argparse
            import torch
            import torch.nn as nn
            from data import DistributedShardLoader, ShardLoader

            parser = argparse.ArgumentParser()
            parser.add_argument("--bs", type=int, default=8)
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            if args.local_rank != -1:
                torch.distributed.init_process_group("gloo")
                rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
                loader = DistributedShardLoader(rank, world, "rows.db", batch_size=args.bs)
            else:
                loader = ShardLoader("rows.db", batch_size=args.bs)
                model = nn.DataParallel(model)
            """,
            """
            import argparse
            import torch
            import torch.nn as nn
            from data import DistributedShardLoader, ShardLoader
            import mgpu_runtime

            mgpu_runtime.launch_own_path("--bs", 8)

            parser = argparse.ArgumentParser()
            parser.add_argument("--bs", type=int, default=8)
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            if args.local_rank != -1:
                torch.distributed.init_process_group("gloo")
                rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
                loader = DistributedShardLoader(rank, world, "rows.db", batch_size=args.bs)
            else:
                loader = ShardLoader("rows.db", batch_size=args.bs)
                model = nn.DataParallel(model)
            """,
            DDP,
            ("MGP139",),
            name="the batch of a distributed loader class of the project's own",
        ),
        # Its batch given by position to a class that cannot be read (no project here): the option is not known.
        Example(
            """
            import argparse
            import torch
            import torch.nn as nn
            from data import DistributedShardLoader

            parser = argparse.ArgumentParser()
            parser.add_argument("--bs", type=int, default=8)
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            if args.local_rank != -1:
                torch.distributed.init_process_group("gloo")
                loader = DistributedShardLoader(args.local_rank, 2, args.bs)
            else:
                model = nn.DataParallel(model)
            """,
            None,
            DDP,
            (),
        ),
        # The per-process batch is no option: no plain start can give the own path the original's batch.
        Example(
            """
            import os
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader, DistributedSampler

            if "LOCAL_RANK" in os.environ:
                torch.distributed.init_process_group("gloo")
                model = nn.parallel.DistributedDataParallel(model)
                loader = DataLoader(data, sampler=DistributedSampler(data), batch_size=16)
            else:
                model = nn.DataParallel(model)
            """,
            None,
            DDP,
            (),
        ),
    )

    def apply(self) -> None:
        program = self.program
        if not program.own_path:
            return
        launch = own_path_launch(self.analysis)
        if launch is None or launched(self.analysis):
            return  # left, with the command that launches the own path where there is one (MGP231)
        batch, point = launch.batch, launch.point
        if not self.rewrite_allowed(point.anchor):
            return
        spelled = [f'"{option}"' for option in batch.options]
        options = spelled[0] if len(spelled) == 1 else f"({', '.join(spelled)})"
        arguments: list[cst.BaseExpression] = [cst.parse_expression(options)]
        if launch.held is None and batch.default is not None:
            arguments.append(cst.Integer(str(batch.default)))
        call = runtime_call("launch_own_path", *arguments)
        if launch.held is not None:
            call = with_keyword(call, "batch", cst.parse_expression(launch.held))
        statement = cst.SimpleStatementLine([cst.Expr(call)])
        if launch.held is not None:  # after the block that reads the configuration file: a blank line between
            statement = statement.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        if point.after:
            self.edits.insert_after(point.anchor, statement)
        else:
            leading = getattr(point.anchor, "leading_lines", ())
            if leading and not leading[0].comment:
                statement = statement.with_changes(leading_lines=[leading[0]])
            self.edits.insert_before(point.anchor, statement)
        self.edits.need_import(RUNTIME)
        self.edits.keep_if_left(statement, RUNTIME)
        line, _ = self.analysis.position(program.existing[0])
        default = batch.default if batch.default is not None else "B"
        given = f"{launch.held}/W per process once the config file is read" if launch.held else f"{default}/W per process"
        fallback = "DataParallel"
        if program.fallback and not program.wraps:
            held = program.fallback[0]
            here = os.path.dirname(os.path.abspath(self.analysis.path))
            fallback = f"DataParallel ({os.path.relpath(held.module, here)}:{held.wrap_line})"
        said = (
            f"a plain start runs the own distributed path (line {line}) on each GPU, {batch.name} {given}; {fallback} "
            "stays for one GPU or an uneven split"
        )
        if len(said) > 160:  # a batch read after the config file, a fallback in another module: the short form
            given = f"{shorten(launch.held, 40)}/W each after the config file" if launch.held else given
            said = f"plain start: own path (line {line}) per GPU, {given}; {fallback} for one GPU"
            if len(said) > 160:
                said = f"plain start: own path (line {line}) per GPU, {given}; DataParallel for one GPU"
        self.rewrote(point.anchor, said)
        self._write_once()
        for call in own_path_gradient_sums(self.analysis):
            self.left(
                call,
                OWN_PATH_GRADIENT_SUM,
                f"`{shorten(self.analysis.code_of(call), 60)}` adds up the processes' gradients: W times DataParallel's "
                "average each step",
            )

    def _write_once(self) -> None:
        """What the own path writes on every process: a directory made with ``exist_ok=True``; statements that
        only write put under the script's own main-process test (one ``if`` for adjacent ones); the rest named
        (MGP325)."""
        analysis = self.analysis
        guarded: list[tuple[cst.CSTNode, str, str]] = []
        for call, what in own_path_writes(analysis):
            statement = analysis.tree.statement(call)
            taken = {id(node) for node, _, _ in guarded}
            if statement is None or any(id(node) in taken for node in (statement, *analysis.tree.ancestors(statement))):
                continue
            if what == "os.makedirs" and self.rewrite_allowed(call):
                self.edits.replace(call, _exist_ok)
                self.edits.keep_if_left(call)
                self.rewrote(call, "os.makedirs(..., exist_ok=True): each process of the own path makes the directory, none fails")
                continue
            namespace = rank_namespace(analysis, call)
            if namespace is None or not _only_writes(statement, call) or not self.rewrite_allowed(statement):
                self.left(
                    call,
                    OWN_PATH_WRITES,
                    f"{shorten(what, 40)} runs on every process of the own path (the original wrote it once): put it "
                    "under the script's main-process test",
                )
                continue
            guarded.append((statement, what, f"{namespace}.local_rank in [-1, 0]"))
        for group in self._adjacent(guarded):
            first, *rest = [node for node, _, _ in group]
            test = group[0][2]
            self.edits.replace(first, _guard(rest, test))
            self.edits.keep_if_left(first)
            for node in rest:
                self.edits.replace(node, _removed)
                self.edits.keep_if_left(node)
            for node, what, _ in group:
                self.rewrote(node, f"{shorten(what, 40)}: written once, by the own path's main process (`if {test}:`)")

    def _adjacent(self, guarded: list[tuple[cst.CSTNode, str, str]]) -> list[list[tuple[cst.CSTNode, str, str]]]:
        """The statements to guard, in runs of neighbours in one block under one test."""
        groups: list[list[tuple[cst.CSTNode, str, str]]] = []
        previous: tuple[object, int, str] | None = None
        for entry in guarded:
            statement, _, test = entry
            parent = self.analysis.tree.parent(statement)
            body = list(getattr(parent, "body", ()))
            index = next((i for i, node in enumerate(body) if node is statement), -1)
            if previous is not None and previous[0] is parent and previous[1] + 1 == index and previous[2] == test:
                groups[-1].append(entry)
            else:
                groups.append([entry])
            previous = (parent, index, test)
        return groups


def _guard(rest: list[cst.CSTNode], test: str) -> Callable[[cst.CSTNode], cst.CSTNode]:
    """The replacement of the first of adjacent writes: it and the ``rest`` under ``if <test>:``."""
    return lambda updated: _under([updated, *rest], test)


def _removed(_: cst.CSTNode) -> cst.RemovalSentinel:
    return cst.RemovalSentinel.REMOVE


def _exist_ok(updated: cst.CSTNode) -> cst.CSTNode:
    return with_keyword(cast(cst.Call, updated), "exist_ok", cst.Name("True"))


def _only_writes(statement: cst.CSTNode, call: cst.Call) -> bool:
    """A statement whose only effect is the write: an expression statement, or a ``with`` that opens the file."""
    if type(statement) is cst.SimpleStatementLine:
        return len(statement.body) == 1 and type(statement.body[0]) is cst.Expr
    return type(statement) is cst.With and any(item.item is call for item in statement.items)


def _under(statements: list[cst.CSTNode], test: str) -> cst.CSTNode:
    """``statements`` under ``if <test>:``, the first one's leading lines and comments above the ``if``."""
    first = statements[0]
    inner = [cast(cst.BaseStatement, first.with_changes(leading_lines=())), *(cast(cst.BaseStatement, s) for s in statements[1:])]
    return cst.If(cst.parse_expression(test), cst.IndentedBlock(inner), leading_lines=getattr(first, "leading_lines", ()))
