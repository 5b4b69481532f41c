"""End to end, --to ddp, against the contract's reference: the shapes of real projects (issue 23) that train.

Each case is a fixture script (``fixtures/scripts/NAME.py``) or a fixture project (``fixtures/projects/DIR/``,
its entry script), with the committed migration beside each file (``NAME.ddp.py``). The original runs under
DataParallel emulated on W devices (``mgpu_runtime.emulation``), the migration under ``torchrun
--nproc_per_node=W`` (gloo on the CPU), W = 2 and 3, both in float64; every tensor the script saves
(``FIXTURE_OUTPUT``: the model, a head outside the wrap, logged numbers) must agree within 1e-9. A file with
its own distributed path (``own_path``, MGP139) is launched plainly, ``python train.py`` with
``MGPU_NPROC=W``, as its user would: the runtime relaunches it on that path with the batch over W, or runs its
DataParallel branch where W does not divide the batch.

One interpreter runs every original in turn, and one torchrun job per W runs every migration in turn in its
workers, so torch is imported and the process group set up once per job (a script that sets up its own
process group runs in a job of its own). A project runs from a copy whose files are its migrations (a file the
tool leaves is copied as it is).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.codemod.e2e_runs import EXIT_ABORT
from tests.codemod.e2e_runs import environment as _environment
from tests.codemod.e2e_runs import job_past_the_exit_abort
from tests.fixture_cases import FIXTURES, is_input

torch = pytest.importorskip("torch")

WORLD_SIZES = (2, 3)
# name -> (directory under fixtures/, the entry script, its arguments at each W)
# (chosen_gpus is given the config that chooses W GPUs, method_chosen_gpus the --device list of W, and the original
# runs on exactly those.)
# (A fixture script that runs with no arguments is not a case here: tests/codemod/test_ddp_e2e.py runs every runnable
# script at W = 2 and 3 against the same reference, its printed lines too; REAL_PROJECT_SCRIPTS there lists those
# that reduce a real project's shape. The projects of tests/codemod/test_side_effects_e2e.py, utils_writers among them,
# are run there at W = 2 and 3 against the same reference, their weights and every file they write compared.)
NO_ARGUMENTS = {processes: [] for processes in WORLD_SIZES}
CASES = {
    "frozen_after_wrap": ("projects/frozen_after_wrap", "train.py", NO_ARGUMENTS),
    "directories": ("projects/directories", "train.py", NO_ARGUMENTS),
    "star_imports": ("projects/star_imports", "train.py", NO_ARGUMENTS),
    "random_transforms": ("projects/random_transforms", "train.py", NO_ARGUMENTS),
    # pytorch-semseg: augmentations drawing from Python's random, composed by a builder of another module
    "built_augmentations": ("projects/built_augmentations", "train.py", NO_ARGUMENTS),
    # Person_reID: a flat script makes its GPU list from `--gpu_ids` and stores it back on the options; the set-up goes
    # after that, given it (MGP150), and the loaders are `dataloaders[phase]` of a dict comprehension
    "gpu_list_flat": ("scripts", "gpu_list_flat.py", {2: ["--gpu_ids", "0,1"], 3: ["--gpu_ids", "0,1,2"]}),
    # faster-rcnn: `import _init_paths` puts lib/ on sys.path; the dataset there draws numpy randoms per item, and
    # the checkpoint helper there writes (whole batches, MGP122; written once, MGP132); every test of `--mGPUs`
    # is extended with the wrap's (MGP121); its roidb builder pickles caches it reads back (main process first)
    "init_paths": ("projects/init_paths", "train.py", {processes: ["--mGPUs"] for processes in WORLD_SIZES}),
    "flat_entry": ("projects/flat_entry", "run.py", NO_ARGUMENTS),
    # pytorch_classifiers: the dict of loaders handed to another module's train_model, which reads dataloaders[phase]
    "handed_phases": ("projects/handed_phases", "train.py", NO_ARGUMENTS),
    # ... and the dict built by the project's builder (a tuple of it, the sizes and the class names), its train
    # transform drawing per sample: each loader split in whole batches (distribute_loaders)
    "built_phases": ("projects/built_phases", "train.py", NO_ARGUMENTS),
    # ... and one loader a builder returns alone, the loop in the script
    "built_loader": ("projects/built_phases", "loader.py", NO_ARGUMENTS),
    # ... its dataset a class of another module that draws through a transform of a third (deeplab's pascal.py)
    "built_faces": ("projects/built_phases", "loader.py", {processes: ["--faces"] for processes in WORLD_SIZES}),
    # ... the loaders a builder returns from each dataset's branch (deeplab's make_data_loader), each branch's
    # dataset drawing per sample
    "built_branches": ("projects/built_phases", "branches.py", NO_ARGUMENTS),
    "built_branches_points": ("projects/built_phases", "branches.py", {processes: ["--points"] for processes in WORLD_SIZES}),
    "evaluate_helper": ("projects/evaluate_helper", "train.py", NO_ARGUMENTS),
    "chosen_gpus": ("projects/chosen_gpus", "train.py", {2: ["--config", "two_gpus"], 3: ["--config", "three_gpus"]}),
    # st-gcn's IO: a method chooses the GPUs (`--device`) and keeps them on self; the set-up is given them there.
    "method_chosen_gpus": (
        "projects/method_chosen_gpus",
        "train.py",
        {2: ["--device", "0", "1"], 3: ["--device", "0", "1", "2"]},
    ),
    # The wrap held by a base class, trained by a subclass of another module, run from an entry script.
    "held_model": ("projects/held_model", "main.py", NO_ARGUMENTS),
    # st-gcn's IO in its own module: the GPUs it chooses go to the set-up there; the entry script sets up nothing.
    "held_chosen_gpus": (
        "projects/held_chosen_gpus",
        "main.py",
        {2: ["train", "--device", "0", "1"], 3: ["train", "--device", "0", "1", "2"]},
    ),
    # first-order-model: DataParallelWithCallback over synchronized BatchNorm, GPUs chosen in run.py (MGP109, MGP150).
    "keypoint_gan": ("projects/keypoint_gan", "run.py", {2: ["--device_ids", "0,1"], 3: ["--device_ids", "0,1,2"]}),
    # BERT-pytorch: the `bertlike` command (setup.py's console script, a function of a __main__.py with no main block)
    # hands --cuda_devices to the trainer class whose constructor wraps on them (MGP150, MGP120 after the parse).
    "console_trainer": (
        "projects/console_trainer",
        "bertlike_command",
        {2: ["--cuda_devices", "0", "1"], 3: ["--cuda_devices", "0", "1", "2"]},
    ),
    # st-gcn's whole chain: IO holds the wrap, Processor (in between, another module) builds a dict of loaders, logs
    # and saves through the project's installed package, Recognition trains on `self.data_loader['train']`.
    "held_between": (
        "projects/held_between",
        "main.py",
        {2: ["recognition", "--device", "0", "1"], 3: ["recognition", "--device", "0", "1", "2"]},
    ),
    # pytorch-deeplab-xception: main() parses --gpu-ids into a list under `if args.cuda: try:` and hands the whole
    # namespace to Trainer(args), which wraps on self.args.gpu_ids: the set-up goes after the parse, given args.gpu_ids.
    "trainer_args_gpus": (
        "projects/trainer_args_gpus",
        "train.py",
        {2: ["--gpu-ids", "0,1"], 3: ["--gpu-ids", "0,1,2"]},
    ),
    # WaveRNN: the model never wrapped, each step through the project's hand-written data_parallel (MGP107).
    "hand_written_dp": ("projects/hand_written_dp", "train.py", NO_ARGUMENTS),
    # Yet-Another-EfficientDet: the project's DataParallel subclass (utils/utils.py) cuts each batch itself, rebased
    # on the runtime's DDP (MGP106); train.py calls it, its loader gives whole batches.
    "detector_subclass": ("projects/detector_subclass", "train.py", NO_ARGUMENTS),
    # ... its batch split over two GPUs of three: the third process runs its replica on no rows.
    "detector_subclass_two_parts": ("projects/detector_subclass", "train.py", {2: ["--num_gpus", "2"], 3: ["--num_gpus", "2"]}),
    # SimCLR: an own path the script starts itself across nodes (mp.spawn under `if args.nodes > 1:`) beside its
    # DataParallel fallback, which migrates, set up in that `if`'s `else`; a contrastive loss over the whole batch.
    "spawned_own_path": ("projects/spawned_own_path", "train.py", NO_ARGUMENTS),
    # mobilenetv2.pytorch / pytorch/examples' ImageNet trainer: an option chooses the own path (`--world-size 2 --rank
    # r`, each process launched by hand), which joins its group under `if args.distributed:`; the fallback migrates,
    # set up after that `if`, and its `not args.distributed or args.rank == 0` save is the main process's.
    "option_own_path": ("projects/option_own_path", "train.py", NO_ARGUMENTS),
    # face.evoLVe: the GPUs read from a configuration module's dict in the main block (configuration 1 names two,
    # 2 three); the set-up right after `GPU_ID = cfg['GPU_ID']`, given them; a backbone and a margin head each wrapped
    "config_dict_gpus": ("projects/config_dict_gpus", "train.py", {2: ["1"], 3: ["2"]}),
    # DeepLabv3.pytorch: the wrap only under `--train`; the set-up relaunches only then (without it, an evaluation on
    # `--gpu` stays one process: under torchrun each process evaluates and one saves; the test below starts it plainly)
    "train_or_evaluate": ("projects/train_or_evaluate", "train.py", {processes: ["--train"] for processes in WORLD_SIZES}),
    "evaluate_on_its_gpu": ("projects/train_or_evaluate", "train.py", NO_ARGUMENTS),
    # CMC: a model class keeps its own wrap (`self.encoder = nn.DataParallel(...)` in models/encoder.py); the script
    # that builds it trains it (its loader split there, the set-up and the save its own), with a loss over the batch.
    "built_holder": ("projects/built_holder", "train.py", NO_ARGUMENTS),
    # deeplab-pytorch's `get_dataset(name)(...)` and pytorch-pose's `datasets.__dict__[name](...)`: a project factory
    # picks the dataset class, which draws per sample; not followed, so each process loads whole batches.
    "dataset_factory": ("projects/dataset_factory", "train.py", NO_ARGUMENTS),
    # deeplab-pytorch's click group: the set-up goes in the group for the commands that wrap (`train`, `test`), under
    # a test of the command invoked; `train` runs here, `report` (its `crf`) in the test below
    "click_commands": ("projects/click_commands", "main.py", {processes: ["train"] for processes in WORLD_SIZES}),
    # HRNet: the GPUs come from a config a project function fills from the command line and freezes
    # (`update_config(cfg, args)`, then `device_ids=cfg.GPUS`): the set-up goes after it, given them; the loop is in
    # lib/core/ (no __init__.py, reached through `import _init_paths`), its debug images written once
    "config_gpus": (
        "projects/config_gpus",
        "tools/train.py",
        {processes: ["--gpus", ",".join(map(str, range(processes))), "--output", f"out{processes}"] for processes in WORLD_SIZES},
    ),
    "dataset_factory_by_name": ("projects/dataset_factory", "train.py", {processes: ["--by-name"] for processes in WORLD_SIZES}),
    # DeepLabv3: the dataset's __getitem__ draws its augmentation in utils.preprocess (Python's random); RAFT: the
    # dataset's base class calls the augmentor it keeps (numpy): each loader split in whole batches
    "sample_helpers": ("projects/sample_helpers", "train.py", NO_ARGUMENTS),
    "sample_helpers_kept": ("projects/sample_helpers", "train_flow.py", NO_ARGUMENTS),
    # InsightFace-v2: the dataset of another module applies random transforms built at its module's top
    "sample_helpers_transforms": ("projects/sample_helpers", "train_faces.py", NO_ARGUMENTS),
    # RAFT: `device_ids=args.gpus` after `RAFT(args)`, whose __init__ writes other attributes of args: the set-up is
    # given them after the parser; per-batch noise over the global batch, a masked sequence loss, metrics by .item()
    "handed_args": (
        "projects/handed_args",
        "train.py",
        {2: ["--gpus", "0", "1", "--add_noise"], 3: ["--gpus", "0", "1", "2", "--add_noise", "--batch_size", "7"]},
    ),
}
TOLERANCE = 1e-9
TIMEOUT_S = 500

# Runs scripts one after the other in this interpreter (``runner.run``: as ``python SCRIPT`` would, on W
# emulated devices when given), each with its own FIXTURE_OUTPUT; the modules a script imported from its own
# directory are dropped after it, since another case may have modules of the same names.
_IN_TURN = """
import gc, json, os, sys
from mgpu_runtime.emulation import runner

gc.freeze()  # torch's objects, out of each collection below
for script, args, output, devices in json.loads(sys.argv[-1]):
    os.environ["FIXTURE_OUTPUT"] = output
    before = set(sys.modules)
    try:
        runner.run(script, args, devices=devices, float64=True)
    except SystemExit as stop:  # a command's `sys.exit(train())` ends its script, not the others' turns
        if stop.code not in (None, 0):
            raise
    home = os.path.dirname(os.path.abspath(script))
    for name in set(sys.modules) - before:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(home):
            del sys.modules[name]
    gc.collect()
    gc.freeze()
"""


def _copy(case: str, directory: Path, migrated: bool) -> Path:
    """The case's files in ``directory``: the inputs, or (``migrated``) each input's ``--to ddp`` migration."""
    where, entry, _ = CASES[case]
    source = FIXTURES / where
    if where == "scripts":
        chosen = source / (f"{Path(entry).stem}.ddp.py" if migrated else entry)
        (directory / entry).write_text(chosen.read_text())
        return directory / entry
    shutil.copytree(source, directory, ignore=shutil.ignore_patterns("*.ddp.*", "*.balanced.*", "*.ddp-torch.*"), dirs_exist_ok=True)
    if migrated:
        for path in directory.rglob("*.py"):
            expected = source / path.relative_to(directory).with_name(f"{path.stem}.ddp.py")
            if is_input(path) and expected.exists():
                path.write_text(expected.read_text())
    return directory / entry


def _start(command: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=cwd, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request):
    """Every selected case's saved tensors, by (case, run): 'original W' and 'torchrun W' (the cases of the tests
    this session runs: ``-k held_model`` runs that case's jobs alone)."""
    root = tmp_path_factory.mktemp("project_shapes")
    driver = root / "in_turn.py"
    driver.write_text(_IN_TURN)
    originals, migrations = [], {}
    selected = {getattr(item, "callspec", None) and item.callspec.params.get("case") for item in request.session.items}
    for case, (_, _, args) in CASES.items():
        if case not in selected:
            continue
        for processes in WORLD_SIZES:
            home = root / f"{case}-original{processes}"
            home.mkdir()
            script = _copy(case, home, migrated=False)
            originals.append((str(script), args[processes], str(root / f"{case}-original{processes}.pt"), processes))
        home = root / f"{case}-migrated"
        home.mkdir()
        script = _copy(case, home, migrated=True)
        for processes in WORLD_SIZES:
            job = (processes, "")
            migrations.setdefault(job, []).append((str(script), args[processes], str(root / f"{case}-torchrun{processes}.pt"), None))
    jobs = {"the originals": _start([sys.executable, str(driver), json.dumps(originals)], root)}
    for (processes, alone), scripts in migrations.items():
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
        jobs[f"torchrun {processes} {alone}"] = _start([*command, str(driver), json.dumps(scripts)], root)
    failures = []
    for name, job in jobs.items():
        try:
            output, _ = job.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            job.kill()
            output, _ = job.communicate()
        if job.returncode != 0:
            failures.append(f"{name} failed ({job.returncode}):\n{output[-4000:]}")
    assert not failures, "\n\n".join(failures)
    return {path.stem: torch.load(path, map_location="cpu") for path in root.glob("*.pt")}


def _plain_starts(tmp_path: Path, processes: int, arguments: list[str], logged: bool = False):
    """The original (tmp_path/original/train.py) under DataParallel emulated on ``processes`` devices in float64,
    then the migration (tmp_path/migrated/train.py) started as ``python train.py`` with MGPU_NPROC set, as its
    user would; each saves its weights to tmp_path/<name>.pt (and appends to <name>.log when ``logged``)."""
    environment = _environment()
    done = []
    for name, command, more in (
        ("original", ["-m", "mgpu_runtime.emulation", "--devices", str(processes), "--float64", "train.py"], {}),
        ("migrated", ["train.py"], {"MGPU_NPROC": str(processes)}),
    ):
        outputs = {"FIXTURE_OUTPUT": str(tmp_path / f"{name}.pt")}
        if logged:
            outputs["FIXTURE_LOG"] = str(tmp_path / f"{name}.log")
        run = subprocess.run(
            [sys.executable, *command, *arguments], cwd=tmp_path / name, env={**environment, **more, **outputs},
            capture_output=True, text=True, timeout=TIMEOUT_S,
        )
        assert run.returncode == 0, run.stderr[-4000:]
        done.append(run)
    return done[0], done[1]


def _tensors(saved, prefix=""):
    """Every tensor in a saved object, by its path (``model.0.weight``), and every plain number."""
    if isinstance(saved, torch.Tensor):
        yield prefix, saved.to(torch.float64)
    elif isinstance(saved, (int, float)):
        yield prefix, torch.tensor(float(saved), dtype=torch.float64)
    elif isinstance(saved, dict):
        for key, value in saved.items():
            yield from _tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(saved, (list, tuple)):
        for index, value in enumerate(saved):
            yield from _tensors(value, f"{prefix}.{index}" if prefix else str(index))


@pytest.mark.slow
@pytest.mark.xdist_group("project_shapes_e2e")
@pytest.mark.parametrize("processes", WORLD_SIZES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_migration_trains_as_the_original_under_dataparallel(runs, case, processes):
    original = dict(_tensors(runs[f"{case}-original{processes}"]))
    migrated = dict(_tensors(runs[f"{case}-torchrun{processes}"]))
    assert original and original.keys() == migrated.keys()
    apart = {name: (original[name] - migrated[name]).abs().max().item() for name in original}
    worst = max(apart, key=apart.get)
    print(f"{case} at {processes}: {worst} is {apart[worst]:.3g} apart")
    assert apart[worst] <= TOLERANCE, f"{case} at {processes}: {worst} is {apart[worst]:.3g} apart"


# own_path: (W, the batch given on the command line or None for its default of 12, the process count expected).
# (3 processes run once, with a batch of 18 that ends on a short batch: the default's run at 3 proves nothing more.)
OWN_PATH_RUNS = [(2, None, 2), (3, "--train_batch_size=18", 3), (3, "--train_batch_size 10", 1)]


@pytest.mark.slow
@pytest.mark.xdist_group("project_shapes_e2e")
@pytest.mark.parametrize(("processes", "batch", "expected"), OWN_PATH_RUNS)
def test_a_plain_start_of_the_own_path_trains_as_the_original(tmp_path, processes, batch, expected):
    """The migrated own_path launched as ``python train.py [batch]`` with MGPU_NPROC=W: its own distributed path
    at W processes of a share of the batch each (18 over 3 ends on a short batch of 12), or, with a batch that W
    does not divide (10 over 3), its DataParallel branch in one process, said once on stderr; against the
    original under DataParallel emulated on W devices, given the same batch; the log it appends to each epoch is
    written once."""
    arguments = batch.split() if batch else []
    source = FIXTURES / "projects" / "own_path"
    for name in ("original", "migrated"):
        (tmp_path / name).mkdir()
        shutil.copy(source / "pyproject.toml", tmp_path / name)
    (tmp_path / "original" / "train.py").write_text((source / "train.py").read_text())
    (tmp_path / "migrated" / "train.py").write_text((source / "train.ddp.py").read_text())
    _, migrated = _plain_starts(tmp_path, processes, arguments, logged=True)
    said = [line for line in migrated.stderr.splitlines() if line.startswith("mgpu_runtime:")]
    if expected > 1:
        assert len(said) == 1 and f"as {expected} processes" in said[0], migrated.stderr[-4000:]
        given = int(arguments[-1].split("=")[-1]) if arguments else 12
        assert f"--train_batch_size {given // expected} per process ({given} over {expected})" in said[0]
    else:
        assert said == [f"mgpu_runtime: --train_batch_size 10 does not split evenly over {processes} processes: running the script's DataParallel branch in one process"]
    # The log the script appends to each epoch: written once, as the original wrote it (MGP139's guard).
    assert (tmp_path / "migrated.log").read_text() == (tmp_path / "original.log").read_text() == "epoch 0 done\nepoch 1 done\nepoch 2 done\n"
    before = dict(_tensors(torch.load(tmp_path / "original.pt", map_location="cpu")))
    after = dict(_tensors(torch.load(tmp_path / "migrated.pt", map_location="cpu")))
    assert before and before.keys() == after.keys()
    apart = max((before[name] - after[name]).abs().max().item() for name in before)
    assert apart <= TOLERANCE, f"own_path at {processes} ({batch}): {apart:.3g} apart"


# own_path_helper: (W, the JSON config's options or None for none, the command line, the batch expected to be split,
# the process count expected). Its batch comes from the script's default, from its config file (read after the
# command line is parsed, where the launch follows), or from the command line, which overrides the file again.
OWN_PATH_HELPER_RUNS = [
    (2, None, [], 12, 2),
    (3, {"train_batch_size": 18, "epochs": 2}, [], 18, 3),  # 48 rows: two batches of 18, then a short one of 12
    # The script sees only `--train_batch_size 10` written as two words as given (`f"--{key}" in argv`): it holds the
    # file's 18, the original too. Its processes get `--train_batch_size 9` as two words, which it lets override.
    (2, {"train_batch_size": 18}, ["--train_batch_size=10"], 18, 2),
    (3, {"train_batch_size": 10}, [], 10, 1),  # 10 over 3 does not split: its DataParallel branch, in one process
]


@pytest.mark.slow
@pytest.mark.xdist_group("project_shapes_e2e")
@pytest.mark.parametrize(("processes", "config", "arguments", "batch", "expected"), OWN_PATH_HELPER_RUNS)
def test_a_plain_start_of_the_own_path_with_its_fallback_in_a_helper_trains_as_the_original(
    tmp_path, processes, config, arguments, batch, expected
):
    """own_path_helper (DialoGPT's shape: a flat script, its DataParallel fallback in a builder of model_utils.py,
    its own path's loader a project class of rows.py, its gradients averaged by hand, a JSON `--config` that
    overrides the parsed options): the migration launched as ``python train.py [...]`` with MGPU_NPROC=W runs the
    own path at W processes, each with its share of the batch the script holds once the config file is read,
    against the original under DataParallel emulated on W devices: the losses it prints and its final weights."""
    source = FIXTURES / "projects" / "own_path_helper"
    assert not (source / "model_utils.ddp.py").exists()  # the builder's module stays as it is
    for name in ("original", "migrated"):
        (tmp_path / name).mkdir()
        for file in ("pyproject.toml", "model_utils.py", "rows.py"):
            shutil.copy(source / file, tmp_path / name)
    (tmp_path / "original" / "train.py").write_text((source / "train.py").read_text())
    (tmp_path / "migrated" / "train.py").write_text((source / "train.ddp.py").read_text())
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
        arguments = ["--config", str(tmp_path / "config.json"), *arguments]
    original, migrated = _plain_starts(tmp_path, processes, arguments)
    said = [line for line in migrated.stderr.splitlines() if line.startswith("mgpu_runtime:")]
    if expected > 1:
        assert len(said) == 1 and f"as {expected} processes" in said[0], migrated.stderr[-4000:]
        assert f"--train_batch_size {batch // expected} per process ({batch} over {expected})" in said[0]
    else:
        assert said == [
            f"mgpu_runtime: --train_batch_size {batch} does not split evenly over {processes} processes: running the "
            "script's DataParallel branch in one process"
        ]
    # The losses it prints (the main process's, the script averages them over its processes): the original's.
    printed = [line.split() for line in migrated.stdout.splitlines() if line.startswith("epoch ")]
    expected_lines = [line.split() for line in original.stdout.splitlines() if line.startswith("epoch ")]
    epochs = (config or {}).get("epochs", 3)
    assert len(printed) == len(expected_lines) == epochs * -(-48 // batch), migrated.stdout[-4000:]
    for mine, theirs in zip(printed, expected_lines):
        assert mine[:3] == theirs[:3] and abs(float(mine[3]) - float(theirs[3])) <= TOLERANCE, (mine, theirs)
    before = dict(_tensors(torch.load(tmp_path / "original.pt", map_location="cpu")))
    after = dict(_tensors(torch.load(tmp_path / "migrated.pt", map_location="cpu")))
    assert before and before.keys() == after.keys() and all(t.dtype == torch.float64 for t in before.values())
    apart = max((before[name] - after[name]).abs().max().item() for name in before)
    assert apart <= TOLERANCE, f"own_path_helper at {processes} ({config}, {arguments}): {apart:.3g} apart"


@pytest.mark.slow
@pytest.mark.xdist_group("project_shapes_e2e")
def test_an_evaluation_on_the_main_process_may_outlast_mgpu_timeout(tmp_path):
    """evaluate_helper's migration runs the project's evaluation on the main process while the others wait for it
    (``mgpu_runtime.wait_for_main_process``), with no time limit: an evaluation longer than MGPU_TIMEOUT, which
    a barrier would have failed, ends well."""
    script = _copy("evaluate_helper", tmp_path, migrated=True)
    assert "mgpu_runtime.wait_for_main_process()" in script.read_text()
    environment = {**_environment(), "MGPU_TIMEOUT": "8", "FIXTURE_EVALUATION_S": "12", "FIXTURE_OUTPUT": str(tmp_path / "out.pt")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert done.stdout.count("accuracy") == 3, done.stdout


@pytest.mark.slow
@pytest.mark.xdist_group("project_shapes_e2e")
@pytest.mark.parametrize("processes", WORLD_SIZES)
def test_the_own_path_left_to_torchrun_has_the_global_batch_but_divides_by_each_process_tokens(tmp_path, processes):
    """chosen_fallback (a translation project's main.py: its own path beside a trainer, picked by name, that wraps
    its model in DataParallel on the GPUs of --device-ids, dim=1): left with MGP231 and its command, which, with
    --local_rank defaulting to LOCAL_RANK (MGP131), runs that path under torchrun with the original's global batch:
    the original's weights when every process counts the same target tokens. With sentences of several lengths it
    is not the original, since each process divides its loss by its own tokens: why no plain start launches it."""
    ids = ",".join(str(device) for device in range(processes))
    apart = {}
    for equal in (True, False):
        runs = tmp_path / ("equal" if equal else "varying")
        source = FIXTURES / "projects" / "chosen_fallback"
        for name in ("original", "migrated"):
            shutil.copytree(source, runs / name, ignore=shutil.ignore_patterns("*.ddp.*", "*.balanced.*"))
        assert not (source / "trainers.ddp.py").exists()  # the trainer's module stays as it is
        (runs / "migrated" / "main.py").write_text((source / "main.ddp.py").read_text())
        environment = {**_environment(), **({"FIXTURE_EQUAL_LENGTHS": "1"} if equal else {})}
        original = subprocess.run(
            [sys.executable, "-m", "mgpu_runtime.emulation", "--devices", str(processes), "main.py", "--device-ids", ids],
            cwd=runs / "original", env={**environment, "FIXTURE_OUTPUT": str(runs / "original.pt")},
            capture_output=True, text=True, timeout=TIMEOUT_S,
        )
        assert original.returncode == 0, original.stderr[-4000:]
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", "main.py",
                   "--batch-size", str(12 // processes)]
        # The project's own path, which the tool leaves as it is, runs under torch's exit abort (no runtime there
        # to give gloo's threads the GIL before the interpreter's end): up to four runs.
        migrated = job_past_the_exit_abort(
            command, timeout=TIMEOUT_S, attempts=4, cwd=runs / "migrated",
            env={**environment, "FIXTURE_OUTPUT": str(runs / "migrated.pt")},
        )
        assert migrated.returncode == 0, (migrated.stdout + migrated.stderr)[-4000:]
        before = dict(_tensors(torch.load(runs / "original.pt", map_location="cpu")))
        after = dict(_tensors(torch.load(runs / "migrated.pt", map_location="cpu")))
        assert before and before.keys() == after.keys()
        apart[equal] = max((before[name] - after[name]).abs().max().item() for name in before)
    assert apart[True] <= TOLERANCE, f"chosen_fallback at {processes}, equal lengths: {apart[True]:.3g} apart"
    assert apart[False] > 1e-3, f"chosen_fallback at {processes}, several lengths: only {apart[False]:.3g} apart"


# own_path_defaults: (W, the JSON config's options or None for none, the command line, the batch expected to be split).
OWN_PATH_DEFAULTS_RUNS = [
    (2, None, [], 12),
    (3, {"batch_size": 18, "epochs": 2}, [], 18),  # 48 rows: two batches of 18, then a short one of 12
    (2, {"batch_size": 18}, ["-b", "8"], 8),  # the command line overrides the file's defaults
]


@pytest.mark.slow
@pytest.mark.xdist_group("project_shapes_e2e")
@pytest.mark.parametrize(("processes", "config", "arguments", "batch"), OWN_PATH_DEFAULTS_RUNS)
def test_a_plain_start_after_a_config_file_of_defaults_trains_as_the_original(tmp_path, processes, config, arguments, batch):
    """own_path_defaults (a JSON --config-file made the parser's defaults, then a second parse): the migration,
    launched as ``python train.py [...]`` with MGPU_NPROC=W, runs its own path at W processes, each with its share of
    the batch the script holds after that block (the file's, or the command line's), against the original under
    DataParallel emulated on W devices: its final weights."""
    source = FIXTURES / "projects" / "own_path_defaults"
    for name in ("original", "migrated"):
        (tmp_path / name).mkdir()
        shutil.copy(source / "pyproject.toml", tmp_path / name)
    (tmp_path / "original" / "train.py").write_text((source / "train.py").read_text())
    (tmp_path / "migrated" / "train.py").write_text((source / "train.ddp.py").read_text())
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
        arguments = ["--config-file", str(tmp_path / "config.json"), *arguments]
    _, migrated = _plain_starts(tmp_path, processes, arguments)
    said = [line for line in migrated.stderr.splitlines() if line.startswith("mgpu_runtime:")]
    assert len(said) == 1 and f"--batch-size {batch // processes} per process ({batch} over {processes})" in said[0], said
    before = dict(_tensors(torch.load(tmp_path / "original.pt", map_location="cpu")))
    after = dict(_tensors(torch.load(tmp_path / "migrated.pt", map_location="cpu")))
    assert before and before.keys() == after.keys() and all(t.dtype == torch.float64 for t in before.values())
    apart = max((before[name] - after[name]).abs().max().item() for name in before)
    assert apart <= TOLERANCE, f"own_path_defaults at {processes} ({config}, {arguments}): {apart:.3g} apart"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _copies(tmp_path: Path, project: str, modules: tuple[str, ...]) -> None:
    """tmp_path/original and tmp_path/migrated: the fixture project's ``modules``, as they are and migrated (a module
    the tool leaves is copied as it is)."""
    source = FIXTURES / "projects" / project
    for name, suffix in (("original", ""), ("migrated", ".ddp")):
        (tmp_path / name).mkdir()
        shutil.copy(source / "pyproject.toml", tmp_path / name)
        for module in modules:
            migrated = source / f"{module}{suffix}.py"
            (tmp_path / name / f"{module}.py").write_text((migrated if migrated.exists() else source / f"{module}.py").read_text())


def _own_path_by_hand(tmp_path: Path, command) -> tuple[list[str], list[str]]:
    """The original's and the migration's own path, two processes each launched by hand (``command(rank, port)``:
    the script's arguments), rank r saving to tmp_path/<name><r>.pt: the lines each rank 0 printed."""
    environment = _environment()
    printed = []
    for name in ("original", "migrated"):
        for _ in range(3):  # again while a process aborted in gloo's teardown at its exit (the script's own code)
            port = str(_free_port())
            ranks = [
                subprocess.Popen(
                    [sys.executable, "train.py", *command(rank, port)],
                    cwd=tmp_path / name, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                    env={**environment, "MASTER_PORT": port, "FIXTURE_OUTPUT": str(tmp_path / f"{name}{rank}.pt")},
                )
                for rank in (0, 1)
            ]
            outputs = [rank.communicate(timeout=TIMEOUT_S)[0] for rank in ranks]
            if all(rank.returncode == 0 for rank in ranks) or not any(EXIT_ABORT in output for output in outputs):
                break
        assert all(rank.returncode == 0 for rank in ranks), "\n".join(output[-3000:] for output in outputs)
        printed.append(outputs[0].splitlines())
    original, migrated = printed
    assert [line for line in original if line.startswith(("step", "epoch"))] == [
        line for line in migrated if line.startswith(("step", "epoch"))
    ] and original
    return original, migrated


@pytest.mark.slow
@pytest.mark.xdist_group("project_shapes_e2e")
@pytest.mark.parametrize("dataparallel", ["0", "1"])
def test_the_own_path_a_script_starts_itself_stays_its_own(tmp_path, dataparallel):
    """spawned_own_path's own path (`--nodes 2`: here two nodes of one process each on this machine, gloo), started
    from the original and from its migration, with its own DDP (`--dataparallel 0`) or a DataParallel in each of
    its processes (`--dataparallel 1`): the runtime stands aside there (leave_to_own_path), so both train alike, bit
    for bit, print the same lines, and save the same checkpoint (its keys: the own DDP's `module.` prefix kept, as
    model.py's check, given the runtime's wrapper alone, still saves that DDP whole)."""
    _copies(tmp_path, "spawned_own_path", ("train", "model"))
    _own_path_by_hand(
        tmp_path, lambda node, port: ["--nodes", "2", "--gpus", "1", "--nr", str(node), "--dataparallel", dataparallel]
    )
    before = torch.load(tmp_path / "original0.pt")
    after = torch.load(tmp_path / "migrated0.pt")
    assert list(before) == list(after)
    assert all(key.startswith("module.") for key in before) == (dataparallel == "0")
    assert all(torch.equal(before[key], after[key]) for key in before)
    assert not (tmp_path / "original1.pt").exists() and not (tmp_path / "migrated1.pt").exists()


@pytest.mark.slow
@pytest.mark.xdist_group("project_shapes_e2e")
def test_a_plain_start_of_the_fallback_beside_a_spawned_own_path_trains_as_the_original(tmp_path):
    """The migrated spawned_own_path started as ``python train.py`` with MGPU_NPROC=2: the set-up in the ``else``
    of ``if args.nodes > 1:`` relaunches it as 2 processes, each of which takes that ``else`` again; against the
    original under DataParallel emulated on 2 devices, the weights and the printed lines, each once (at 3, under
    torchrun: the case above)."""
    _copies(tmp_path, "spawned_own_path", ("train", "model"))
    _started_plainly_as_the_original(tmp_path, 2, "spawned_own_path")


def _started_plainly_as_the_original(tmp_path: Path, processes: int, name: str) -> None:
    """The copies of tmp_path/original and tmp_path/migrated started plainly (``_plain_starts``): the same step and
    epoch lines, each once, and the same weights within the tolerance."""
    original, migrated = _plain_starts(tmp_path, processes, [])
    lines = [line for line in original.stdout.splitlines() if line.startswith(("step", "epoch"))]
    assert lines and [line for line in migrated.stdout.splitlines() if line.startswith(("step", "epoch"))] == lines
    before = dict(_tensors(torch.load(tmp_path / "original.pt", map_location="cpu")))
    after = dict(_tensors(torch.load(tmp_path / "migrated.pt", map_location="cpu")))
    assert before and before.keys() == after.keys()
    apart = max((before[key] - after[key]).abs().max().item() for key in before)
    assert apart <= TOLERANCE, f"{name} started plainly at {processes}: {apart:.3g} apart"


@pytest.mark.slow
@pytest.mark.xdist_group("project_shapes_e2e")
def test_the_own_path_an_option_chooses_stays_its_own(tmp_path):
    """option_own_path's own path, each of its two processes launched by hand (`--world-size 2 --rank r`, gloo),
    from the original and from its migration: the runtime stands aside there (leave_to_own_path before the join, the
    set-up after it a job of one plain process), so both print the same lines and rank 0 saves the same weights,
    bit for bit, and rank 1 none."""
    _copies(tmp_path, "option_own_path", ("train", "loaders"))
    _own_path_by_hand(
        tmp_path, lambda rank, port: ["--world-size", "2", "--rank", str(rank), "--dist-url", f"tcp://127.0.0.1:{port}"]
    )
    before = torch.load(tmp_path / "original0.pt")
    after = torch.load(tmp_path / "migrated0.pt")
    assert list(before) == list(after) and all(torch.equal(before[key], after[key]) for key in before)
    assert not (tmp_path / "original1.pt").exists() and not (tmp_path / "migrated1.pt").exists()


@pytest.mark.slow
@pytest.mark.xdist_group("project_shapes_e2e")
def test_a_plain_start_of_the_fallback_beside_an_option_chosen_own_path_trains_as_the_original(tmp_path):
    """The migrated option_own_path started as ``python train.py`` with MGPU_NPROC=3: the set-up after ``if
    args.distributed:`` relaunches it as 3 processes, each of which takes the fallback again (the same command line);
    against the original under DataParallel emulated on 3 devices, the weights and the printed lines, each once."""
    _copies(tmp_path, "option_own_path", ("train", "loaders"))
    _started_plainly_as_the_original(tmp_path, 3, "option_own_path")


@pytest.mark.slow
def test_a_branch_that_wraps_nothing_stays_one_process(tmp_path):
    """train_or_evaluate's train.py (DeepLabv3.pytorch's main.py) started plainly with two processes wanted: without `--train` it
    evaluates as one process (no relaunch), printing and saving what the original did; with `--train` it relaunches
    as two and prints each step's line once."""
    source = FIXTURES / "projects" / "train_or_evaluate"
    for name, suffix in (("original", ""), ("migrated", ".ddp")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.py").write_text((source / f"train{suffix}.py").read_text())
    runs = {}
    for name in ("original", "migrated"):
        for mode in ([], ["--train"]):
            runs[name, bool(mode)] = subprocess.run(
                [sys.executable, "train.py", *mode], cwd=tmp_path / name, capture_output=True, text=True,
                env={**_environment(), "MGPU_NPROC": "2", "FIXTURE_OUTPUT": str(tmp_path / f"{name}{len(mode)}.pt")},
                timeout=TIMEOUT_S,
            )
            assert runs[name, bool(mode)].returncode == 0, runs[name, bool(mode)].stderr[-4000:]
    evaluated = runs["original", False].stdout
    assert evaluated.count("eval: ") == 23 and runs["migrated", False].stdout == evaluated
    assert "relaunching" not in runs["migrated", False].stderr
    before, after = (torch.load(tmp_path / f"{name}0.pt") for name in ("original", "migrated"))
    assert before.keys() == after.keys() and all(torch.equal(before[key], after[key]) for key in before)
    assert "relaunching under torchrun as 2 processes" in runs["migrated", True].stderr
    assert runs["migrated", True].stdout.count("epoch 0 step 0:") == 1


@pytest.mark.slow
def test_a_command_that_runs_no_model_stays_one_process(tmp_path):
    """deeplab-pytorch's `crf` (post-processing on the CPU, beside the `train` and `test` commands that wrap): its
    migration, started plainly with two processes wanted, runs as one process, printing and writing what the
    original did once (its report opened with "x": a second writer fails); `train` relaunches as two and prints
    the group's line once."""
    for name, migrated in (("original", False), ("migrated", True)):
        (tmp_path / name).mkdir()
        _copy("click_commands", tmp_path / name, migrated)
    runs = {}
    for name in ("original", "migrated"):
        for command in ("report", "train"):
            runs[name, command] = subprocess.run(
                [sys.executable, "main.py", command], cwd=tmp_path / name, capture_output=True, text=True,
                env={**_environment(), "MGPU_NPROC": "2", "FIXTURE_OUTPUT": str(tmp_path / f"{name}.pt")}, timeout=TIMEOUT_S,
            )
            assert runs[name, command].returncode == 0, runs[name, command].stderr[-4000:]
    assert runs["migrated", "report"].stdout == runs["original", "report"].stdout == "Mode: report\nreport written\n"
    assert "relaunching" not in runs["migrated", "report"].stderr
    assert (tmp_path / "migrated" / "report.txt").read_text() == (tmp_path / "original" / "report.txt").read_text()
    assert "relaunching under torchrun as 2 processes" in runs["migrated", "train"].stderr
    assert runs["migrated", "train"].stdout.count("Mode: train") == 1
