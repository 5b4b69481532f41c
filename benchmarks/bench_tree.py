"""Wall-clock benchmarks of ``mgpu-migrate --check`` against two anchors, as ratios measured in one run.

(a) A tree of ~1,000 real files of which a handful use DataParallel (standard-library modules plus the
    training scripts of fixtures/scripts/): ``mgpu-migrate --check --to ddp TREE`` against
    ``ruff check`` of the same tree (the speed anchor).
(b) A hundred training scripts that all use DataParallel (variants of fixtures/scripts/ and fixtures/shapes/
    grown to a realistic length with the helpers real scripts carry): ``mgpu-migrate --check --to ddp``
    against one process that imports libcst and parses the same files (the floor).

Each command runs ``--runs`` times, interleaved, and the medians are compared. Every command is a fresh
process, timed from outside: start-up and imports count, as they do for a user.

    python benchmarks/bench_tree.py [--runs 7] [--jobs N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
TARGET_SUFFIXES = (".balanced.py", ".ddp.py")

# Ruff's default rule selection, fixed here so a configuration file cannot change the work it does.
# ruff as installed beside this Python (pip's bin/), not through a version manager's shim (see ``tool``).
_RUFF_HERE = Path(sys.executable).with_name("ruff")
RUFF = [
    str(_RUFF_HERE) if _RUFF_HERE.is_file() else "ruff",
    "check", "--no-cache", "--isolated", "--select", "E4,E7,E9,F", "--exit-zero", "--quiet",
]

BARE_PARSE = """
import sys
from pathlib import Path
import libcst
for path in sorted(Path(sys.argv[1]).rglob("*.py")):
    libcst.parse_module(path.read_text())
"""

# What real training scripts carry besides the model and the loop: meters, metrics, checkpoints,
# schedules, argument parsing. ``{i}`` makes every script's names its own.
HELPERS = '''

class AverageMeter{i}:
    """Computes and stores the average and current value."""

    def __init__(self, name, fmt=":f"):
        self.name = name
        self.fmt = fmt
        self.reset()

    def reset(self):
        self.val = 0
        self.avg = 0
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self):
        fmtstr = "{{name}} {{val" + self.fmt + "}} ({{avg" + self.fmt + "}})"
        return fmtstr.format(**self.__dict__)


def accuracy_{i}(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k."""
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        res = []
        for k in topk:
            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res


def adjust_learning_rate_{i}(optimizer, epoch, base_lr, schedule=(30, 60, 90), gamma=0.1):
    lr = base_lr
    for milestone in schedule:
        if epoch >= milestone:
            lr *= gamma
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    return lr


def save_checkpoint_{i}(state, is_best, directory="checkpoints", filename="checkpoint.pth.tar"):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, filename)
    torch.save(state, path)
    if is_best:
        torch.save(state, os.path.join(directory, "model_best.pth.tar"))


def count_parameters_{i}(model, trainable_only=True):
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def build_parser_{i}():
    import argparse

    parser = argparse.ArgumentParser(description="training options")
    parser.add_argument("--epochs", default=90, type=int, metavar="N", help="number of total epochs to run")
    parser.add_argument("-b", "--batch-size", default=256, type=int, metavar="N", help="mini-batch size")
    parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, metavar="LR", dest="lr")
    parser.add_argument("--momentum", default=0.9, type=float, metavar="M", help="momentum")
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, metavar="W", dest="weight_decay")
    parser.add_argument("-p", "--print-freq", default=10, type=int, metavar="N", help="print frequency")
    parser.add_argument("--resume", default="", type=str, metavar="PATH", help="latest checkpoint")
    parser.add_argument("--seed", default=None, type=int, help="seed for initializing training")
    parser.add_argument("--workers", default=4, type=int, help="data loading workers")
    return parser


class WarmupSchedule{i}:
    def __init__(self, optimizer, warmup_steps, total_steps):
        self.optimizer = optimizer
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.step_count = 0
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]

    def step(self):
        self.step_count += 1
        if self.step_count < self.warmup_steps:
            scale = self.step_count / max(1, self.warmup_steps)
        else:
            progress = (self.step_count - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
            scale = max(0.0, 1.0 - progress)
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base_lr * scale


def wrap_for_devices_{i}(model, gpu_ids):
    if len(gpu_ids) > 1:
        model = torch.nn.DataParallel(model, device_ids=gpu_ids)
    return model

'''


def scripts(directory: Path) -> list[Path]:
    """The before-migration inputs under a fixtures folder."""
    return sorted(p for p in directory.glob("*.py") if not p.name.endswith(TARGET_SUFFIXES))


def with_helpers(source: str, index: int) -> str:
    """``source`` with the helpers inserted after its imports, where real scripts keep them."""
    tree = ast.parse(source)
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    last_import = max((node.end_lineno for node in imports), default=0)
    lines = source.splitlines(keepends=True)
    return "".join(lines[:last_import]) + HELPERS.format(i=index) + "".join(lines[last_import:])


def build_dp_scripts(destination: Path, count: int = 100) -> list[Path]:
    bases = scripts(FIXTURES / "scripts") + scripts(FIXTURES / "shapes")
    made = []
    for index in range(count):
        base = bases[index % len(bases)]
        path = destination / f"{base.stem}_{index:03d}.py"
        path.write_text(with_helpers(base.read_text(), index))
        made.append(path)
    return made


def build_tree(destination: Path, size: int = 1000) -> tuple[int, int]:
    """~``size`` standard-library modules in their packages, plus every fixture training script."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chosen = []
    for directory, subdirectories, names in os.walk(stdlib):
        subdirectories[:] = sorted(d for d in subdirectories if d != "site-packages")
        chosen += [Path(directory, name) for name in sorted(names) if name.endswith(".py")]
    dp_scripts = scripts(FIXTURES / "scripts")
    chosen = chosen[: size - len(dp_scripts)]
    for path in chosen:
        target = destination / "stdlib" / path.relative_to(stdlib)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    (destination / "training").mkdir()
    for path in dp_scripts:
        shutil.copyfile(path, destination / "training" / path.name)
    return len(chosen), len(dp_scripts)


def tool(*args: str) -> list[str]:
    """The command line as an installed copy runs it: the console script that ``pip install`` wrote beside this
    Python (a virtual environment's ``bin/``), not the first one on PATH, which may be a version manager's shim
    (pyenv's costs a shell and 0.1 s of CPU per run, which no installed copy pays)."""
    script = Path(sys.executable).with_name("mgpu-migrate")
    if script.is_file():
        return [str(script), *args]
    found = shutil.which("mgpu-migrate")
    return [found, *args] if found else [sys.executable, "-m", "mgpu_migrate", *args]


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if completed.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} exited {completed.returncode}:\n{completed.stderr.decode()[-2000:]}")
    return elapsed


def medians(commands: dict[str, list[str]], runs: int) -> dict[str, float]:
    """Median wall time of each command, the commands interleaved so that load affects them alike."""
    for command in commands.values():
        timed(command)  # warm the file cache
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, command in commands.items():
            times[name].append(timed(command))
    return {name: statistics.median(values) for name, values in times.items()}


def lines_in(directory: Path) -> int:
    return sum(path.read_bytes().count(b"\n") for path in directory.rglob("*.py"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--jobs", type=int, help="passed to mgpu-migrate --jobs (default: its own default)")
    parser.add_argument("--keep", type=Path, help="build the trees here and keep them")
    args = parser.parse_args()
    jobs = ["--jobs", str(args.jobs)] if args.jobs else []

    workdir = args.keep or Path(tempfile.mkdtemp(prefix="mgpu-bench-"))
    try:
        tree, dp = workdir / "tree", workdir / "dp_scripts"
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(dp, ignore_errors=True)
        tree.mkdir(parents=True)
        dp.mkdir(parents=True)
        plain, training = build_tree(tree)
        made = build_dp_scripts(dp)
        print(f"cores: {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()}; "
              f"ruff: {subprocess.run(['ruff', '--version'], capture_output=True, text=True).stdout.strip()}; "
              f"runs: {args.runs} (medians)")

        a = medians(
            {"mgpu-migrate": tool("--check", "--to", "ddp", "-q", *jobs, str(tree)), "ruff": [*RUFF, str(tree)]},
            args.runs,
        )
        print(f"\n(a) tree: {plain} stdlib modules + {training} DataParallel scripts, {lines_in(tree):,} lines")
        print(f"    mgpu-migrate --check --to ddp: {a['mgpu-migrate']:.3f} s")
        print(f"    {' '.join(RUFF)}: {a['ruff']:.3f} s")
        print(f"    ratio: {a['mgpu-migrate'] / a['ruff']:.2f}x ruff (target <= 4x, stretch <= 2x)")

        b = medians(
            {
                "mgpu-migrate": tool("--check", "--to", "ddp", "-q", *jobs, str(dp)),
                "bare parse": [sys.executable, "-c", BARE_PARSE, str(dp)],
            },
            args.runs,
        )
        print(f"\n(b) {len(made)} DataParallel training scripts, {lines_in(dp):,} lines")
        print(f"    mgpu-migrate --check --to ddp: {b['mgpu-migrate']:.3f} s")
        print(f"    one process, import libcst + parse_module each file: {b['bare parse']:.3f} s")
        print(f"    ratio: {b['mgpu-migrate'] / b['bare parse']:.2f}x bare parse (target <= 3x, stretch <= 1.5x)")
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
