"""End to end, --to ddp: what the original did once (files, directories, logs, printed lines), its migration does
once, in every module the program runs (issue 23, item 4).

Each case is a fixture project reduced from a real one, run as the original under DataParallel emulated on W
devices (``python -m mgpu_runtime.emulation --devices W --float64``) and as its committed migration under
``torchrun --nproc_per_node=W`` (gloo, the CPU), W = 2 and 3, each in a directory of its own as its working
directory. Then the two directories must hold the same files (what the scripts wrote, by relative path), each
with the same content (tensors and arrays within 1e-9, float64; anything else byte for byte), the wrapped
model's final weights must agree within 1e-9, and the job must print the lines the original printed.

"Once" is checked, not assumed: the writers these projects call that the test machine lacks (tensorboardX,
tensorboard_logger, ignite's engine and ``ModelCheckpoint``, torchvision's ``save_image``, scipy's ``savemat``, PIL) are the stand-ins
of ``tests/data/stubs`` on ``PYTHONPATH``, which create
each file exclusively, so a second process writing it fails the job; appended logs would hold each line once
per process; the directory reset of ncsn's ``main.py`` races when every process runs it. The clock that names darts's run
directory is a stand-in (``FIXTURE_CLOCK``, ``stubs/sitecustomize.py``) that reads the same second in the original
and on rank 0 and 1.1 s later on every other rank: read on each rank, the names part, and the job fails. The last test shows
that the check fails a migration that writes the runner's images on every process, and one whose checkpoint handler
and run directory are every process's (as before the aside review's fixes).
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.codemod.e2e_runs import environment, job_past_the_exit_abort
from tests.fixture_cases import FIXTURES, ROOT, is_input

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

STUBS = ROOT / "tests" / "data" / "stubs"
WORLD_SIZES = (2, 3)
TOLERANCE = 1e-9
TIMEOUT_S = 400
# name -> (the project under fixtures/projects/, its entry script)
CASES = {
    "score_runner": "main.py",  # ermongroup/ncsn: main.py resets the log folder, the runner wraps, trains, samples
    "speech_logs": "train.py",  # ming024/FastSpeech2: SummaryWriters, a log() helper, evaluate.py, log.txt
    "utils_writers": "train.py",  # helpers of utils/: a Logger, save_pred, save_checkpoint, a StatisticsContainer
    # datasets that download themselves (ncsn, SCAN, open-reid): in the script, in utils/, through data/'s dict of
    # classes (open-reid's datasets.create); open-reid's sys.stdout = Logger(path), its file opened with "w"
    "downloads": "train.py",
    "run_directory": "train.py",  # quark0/darts: a run directory named by the clock, made and logged into at module level
    # the aside review's (A3, A4, A6): reid-strong-baseline's ignite ModelCheckpoint attached to the engine of another
    # module, SupContrast's tensorboard_logger Logger, SfmLearner's run directory named from the clock in utils.py
    "engine_writers": "train.py",
    # Face_Pytorch: the net, set to eval mode, handed to getFeatureFromTorch of eval_lfw.py, which runs it over the
    # test pairs and writes the features (scipy.io.savemat) that evaluation_10_fold reads back: the main process
    # evaluates, given the net unwrapped, the others wait
    "eval_features": "train.py",
    # pytorch-deeplab-xception: the project's Saver (the run's directory found from the runs before it) built on the
    # main process and copied, its writing methods called there; the SummaryWriter a project method returns made on
    # the main process only, handed to another method that logs with it
    "saver_summary": "train.py",
    # flownet2-pytorch: train() defined in the main block iterates its loader through tools.IteratorTimer (split, as
    # the loader is), the arguments appended to args.txt by a TimerBlock's log2file (the loop made once), a checkpoint
    # per epoch by tools.save_checkpoint
    "timed_batches": "main.py",
    # pytorch-semseg: a run directory named by a Python draw, the best model saved into the SummaryWriter's own
    # `file_writer.get_logdir()`: the writer on the main process only, its log directory the main's on every process
    "writer_logdir": "train.py",
}
# The stand-in clock (tests/data/stubs/sitecustomize.py): time.strftime(fmt) reads this second, 1.1 s later per rank.
CLOCK_S = "1700000000.5"


def _environment() -> dict[str, str]:
    env = environment()
    env["PYTHONPATH"] = os.pathsep.join([str(STUBS), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env["FIXTURE_CLOCK"] = CLOCK_S
    env.pop("FIXTURE_OUTPUT", None)
    return env


def _copy(case: str, home: Path, migrated: bool) -> Path:
    """The project's inputs under ``home/src``, or (``migrated``) each input's committed ``--to ddp`` migration."""
    source = FIXTURES / "projects" / case
    shutil.copytree(source, home / "src", ignore=shutil.ignore_patterns("*.ddp.*", "*.balanced.*", "*.ddp-torch.*", "__pycache__"))
    if migrated:
        for path in (home / "src").rglob("*.py"):
            expected = source / path.relative_to(home / "src").with_name(f"{path.stem}.ddp.py")
            if is_input(path) and expected.exists():
                path.write_text(expected.read_text())
    return home / "src" / CASES[case]


def _start(home: Path, script: Path, processes: int, original: bool) -> subprocess.Popen:
    emulation = ["-m", "mgpu_runtime.emulation", "--float64", "--state", "state.pt"]
    if original:
        command = [sys.executable, *emulation[:2], "--devices", str(processes), *emulation[2:], str(script)]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *emulation, str(script)]
    return subprocess.Popen(command, cwd=home, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(job: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = job.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        job.kill()
        out, err = job.communicate()
    return job.returncode, out, err


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request):
    """Each run's directory and printed lines, by (case, processes, 'original' or 'migrated'); the runs of one W
    start together, two W one after the other (a 2-core machine). Only the cases of the tests this session runs
    (``-k eval_features`` runs that case's jobs alone)."""
    root = tmp_path_factory.mktemp("side_effects")
    selected = {getattr(item, "callspec", None) and item.callspec.params.get("case") for item in request.session.items}
    done, failures = {}, []
    for processes in WORLD_SIZES:
        jobs = {}
        for case in CASES:
            if case not in selected:
                continue
            for kind in ("original", "migrated"):
                home = root / f"{case}-{kind}{processes}"
                home.mkdir()
                script = _copy(case, home, migrated=kind == "migrated")
                jobs[case, processes, kind] = home, _start(home, script, processes, original=kind == "original")
        for key, (home, job) in jobs.items():
            code, out, err = _finish(job)
            if code != 0:
                failures.append(f"{key} failed ({code}):\n{err[-3000:]}")
            done[key] = home, out
    assert not failures, "\n\n".join(failures)
    return done


def _written(home: Path) -> list[str]:
    """What a run wrote into its directory (its sources and their byte code left out): its files, and the
    directories it made and left empty (a run directory a second process named otherwise)."""
    return sorted(
        str(path.relative_to(home))
        for path in home.rglob("*")
        if (path.is_file() or (path.is_dir() and not any(path.iterdir()))) and path.relative_to(home).parts[0] != "src"
    )


def _tensors(value, prefix=""):
    if isinstance(value, torch.Tensor):
        yield prefix, value.to(torch.float64)
    elif isinstance(value, np.ndarray):
        yield prefix, torch.from_numpy(value.astype(np.float64))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield prefix, torch.tensor(float(value), dtype=torch.float64)
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield from _tensors(inner, f"{prefix}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, inner in enumerate(value):
            yield from _tensors(inner, f"{prefix}.{index}")


def _content(path: Path):
    """A file's tensors by their place (a torch file, a numpy array), or its bytes."""
    data = path.read_bytes()
    if data.startswith(b"\x80"):  # the pickled arrays of the scipy.io stand-in's savemat
        return dict(_tensors(pickle.loads(data)))
    if data.startswith(b"PK"):
        return dict(_tensors(torch.load(path, map_location="cpu", weights_only=False)))
    if data.startswith(b"\x93NUMPY"):
        return dict(_tensors(np.load(path)))
    return data


@pytest.mark.slow
@pytest.mark.xdist_group("side_effects_e2e")
@pytest.mark.parametrize("processes", WORLD_SIZES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_migration_writes_and_prints_what_the_original_did_once(runs, case, processes):
    original, printed = runs[case, processes, "original"]
    migrated, printed_migrated = runs[case, processes, "migrated"]
    assert printed_migrated.splitlines() == printed.splitlines()
    files = _written(original)
    assert "state.pt" in files and len(files) > 2
    assert _written(migrated) == files
    for name in files:
        theirs, ours = _content(original / name), _content(migrated / name)
        if isinstance(theirs, bytes):
            assert ours == theirs, f"{case} at {processes}: {name} differs"
            continue
        assert isinstance(ours, dict) and ours.keys() == theirs.keys(), name
        for place, value in theirs.items():
            assert ours[place].shape == value.shape, (name, place)
            apart = (ours[place] - value).abs().max().item() if value.numel() else 0.0
            assert apart <= TOLERANCE, f"{case} at {processes}: {name} {place} is {apart:.3g} apart"


@pytest.mark.slow
@pytest.mark.xdist_group("side_effects_e2e")
def test_the_check_fails_a_migration_that_writes_the_images_on_every_process(tmp_path):
    """The runner's images written by every process, as before MGP134: the second writer of a file fails."""
    home = tmp_path / "every-process"
    home.mkdir()
    script = _copy("score_runner", home, migrated=True)
    runner = home / "src" / "runners" / "anneal_runner.py"
    text = runner.read_text()
    assert "mgpu_runtime.on_main_process(save_image, " in text
    runner.write_text(text.replace("mgpu_runtime.on_main_process(save_image, ", "save_image("))
    code, _, err = _finish(_start(home, script, 2, original=False))
    assert code != 0 and "FileExistsError" in err, err[-3000:]


@pytest.mark.slow
@pytest.mark.xdist_group("side_effects_e2e")
def test_a_plain_start_that_relaunches_makes_one_run_directory(tmp_path):
    """darts's migration started as ``python train.py`` with MGPU_NPROC=2: its module-level code asks the runtime
    (the clock's name, is_main_process()) before the main block's setup(), and is answered by the job's processes
    after the relaunch, not by the process started plainly (which made a run directory of its own)."""
    home = tmp_path / "plain"
    home.mkdir()
    script = _copy("run_directory", home, migrated=True)
    job = job_past_the_exit_abort(
        [sys.executable, str(script), "--epochs", "1"], timeout=TIMEOUT_S, cwd=home, env={**_environment(), "MGPU_NPROC": "2"},
        before_again=lambda: [shutil.rmtree(made) for made in home.glob("eval-*")],
    )
    assert job.returncode == 0, job.stderr[-3000:]
    assert "relaunching under torchrun as 2 processes" in job.stderr
    assert [path.name for path in home.glob("eval-*")] == ["eval-EXP-" + time.strftime("%Y%m%d-%H%M%S", time.localtime(float(CLOCK_S)))]


# What the migration of engine_writers moved onto the main process, and the original's call it undoes: the
# checkpoint handler and the Logger then write their files twice (FileExistsError); the run directory's name
# read on every process names a second directory, which the other process makes and leaves empty.
_UNDONE = {
    "checkpoint handler": ("engine.py", "mgpu_runtime.main_process_only(ModelCheckpoint, ", "ModelCheckpoint("),
    "tensorboard_logger": ("train.py", "mgpu_runtime.main_process_only(tb_logger.Logger, ", "tb_logger.Logger("),
    "run directory": ("train.py", "mgpu_runtime.main_process_value(run_directory, ", "run_directory("),
}


@pytest.mark.slow
@pytest.mark.xdist_group("side_effects_e2e")
@pytest.mark.parametrize("undone", sorted(_UNDONE))
def test_the_check_fails_the_engine_writers_every_process_made(tmp_path, undone):
    """engine_writers's migration with one of its moves undone, as the tool wrote it before the aside review's
    fixes (A3, A4, A6): the job fails, or what it wrote is not what the original wrote."""
    module, moved, original = _UNDONE[undone]
    home = tmp_path / "every-process"
    home.mkdir()
    script = _copy("engine_writers", home, migrated=True)
    path = home / "src" / module
    text = path.read_text()
    assert moved in text
    path.write_text(text.replace(moved, original))
    code, _, err = _finish(_start(home, script, 2, original=False))
    if undone == "run directory":
        assert code == 0, err[-3000:]
        made = sorted(path.name for path in (home / "runs" / "lr0.1").iterdir())
        assert len(made) == 2 and f"runs/lr0.1/{made[1]}" in _written(home), _written(home)  # the second, empty
    else:
        assert code != 0 and "FileExistsError" in err, err[-3000:]
