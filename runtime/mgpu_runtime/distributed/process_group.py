"""Joining the job: device, backend, process group, and leaving it cleanly at exit.

``setup()`` is idempotent and is where everything starts: it reads the launch environment, relaunches a
script started without a launcher (or as a single SLURM task) under torchrun when more processes are wanted
(``launch.py``), binds the CUDA device to the local rank before anything else touches CUDA, and
initialises the default process group.

* Backend: nccl on CUDA, gloo on CPU. ``MGPU_BACKEND`` overrides the choice. Ranks that share a GPU
  (``MGPU_SHARE_DEVICE=1``, or torchrun starting more processes on the node than there are visible GPUs)
  get gloo, as NCCL refuses two ranks on one device; their device is ``cuda:(local_rank % device_count)``.
  Under SLURM fewer visible GPUs than tasks usually means each task was given its own
  (``--gpus-per-task``), so only ``MGPU_SHARE_DEVICE=1`` declares sharing there.
* A world of one joins no network: a gloo group over an in-process ``HashStore`` (no address, no port), which
  exists only so ``DistributedDataParallel`` can be built; the wrappers send nothing through it.
* On the script's own distributed path, started by the script itself beside a migrated DataParallel fallback
  (``leave_to_own_path()``, own_path.py), ``setup()`` joins nothing: the process is a job of one plain process,
  with the script's device and process group left as the script made them.
* Every collective is bounded: the group's timeout is ``MGPU_TIMEOUT`` seconds (default 300, instead of
  torch's 30 minutes for gloo), and a collective that fails says which ranks did not arrive (``lockstep.py``).
* Teardown, registered with ``atexit`` when this module created the group, also when the script never
  calls anything: a note saying how this rank ended (read by peers whose collectives then fail), then
  destroy, then a wait until every rank has destroyed its group (``leaving.py``). No barrier before the
  destroy: a rank that leaves early (``sys.exit`` on one rank) would wait there for peers that wait for it
  elsewhere; destroying the group instead makes their pending collectives fail at once, naming it.

The other functions are the process's coordinates. ``rank()`` & co. read the launch environment without
joining anything (they also work in a DataLoader worker, and in a plain single process); ``device()`` and
``barrier()`` set up first. One exception: in a plainly started process that ``setup()`` would relaunch (more
than one process wanted) and that has not set up yet, they set up first, so that the relaunch happens there:
module-level code that runs before the main block's ``setup()`` (``if mgpu_runtime.is_main_process():
os.makedirs(...)``) would otherwise be answered for the process about to be replaced, which is not one of the
job's processes (it would make its directory, and the job's rank 0 another).
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from mgpu_runtime.distributed import global_view, rank_output
from mgpu_runtime.distributed.lockstep import BARRIER, Lockstep
from mgpu_runtime.distributed.safety import SafetyNet
from mgpu_runtime.sharded import RankGroup
from mgpu_runtime.sharded.gradients import Gradients
from mgpu_runtime.distributed.environment import (
    SLURM,
    TORCHRUN,
    LaunchEnvironment,
    SINGLE_PROCESS,
    LaunchEnvironmentError,
    detect_environment,
)
from mgpu_runtime.distributed.launch import own_path_runs, relaunch_if_requested, relaunch_wanted
from mgpu_runtime.distributed.leaving import let_the_gloo_threads_finish, meet_the_others, the_store

BACKEND_VARIABLE = "MGPU_BACKEND"
SHARE_DEVICE_VARIABLE = "MGPU_SHARE_DEVICE"
TIMEOUT_VARIABLE = "MGPU_TIMEOUT"
DEFAULT_TIMEOUT_S = 300
MAX_TIMEOUT_S = 365 * 24 * 3600


@dataclass
class Job:
    """This process's part in the job: the runtime's whole state, made by ``setup()`` and dropped at teardown.

    In a world of more than one process it holds the rank group of the loop's global values (with autograd's
    convention for them, ``mgpu_runtime.sharded.gradients``), the lockstep check and the safety net.
    """

    environment: LaunchEnvironment
    device: torch.device
    owns_process_group: bool
    lockstep: Lockstep | None = None
    safety: SafetyNet | None = None
    group: RankGroup | None = None
    gradients: Gradients | None = None
    # On GPUs, on a rank above 0: the random stream of the wrapped model's forward (global_view.DeviceStream).
    stream: global_view.DeviceStream | None = None
    # How many times this process passed each call site of main_process_value (readings.py).
    readings: dict[str, int] = field(default_factory=dict)
    # The DistributedDataParallel wrappers made in this job (ddp.py), weakly: a new one that shares parameters
    # with one of them makes both sum their gradients after each backward pass.
    wrappers: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    # The functional data_parallel's wrapper of each module it ran (distributed/functional.py), held weakly by the
    # module: a module the script drops is not kept alive by the job.
    functional_wrappers: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    # Set by fail_together() (together.py): an error raised in one rank's replica forward is raised on every rank.
    fail_together: bool = False


_job: Job | None = None


def setup(devices: Sequence[int | str | torch.device] | str | None = None, *, processes: int | None = None) -> None:
    """Join the job this process was launched into (see the module doc); a no-op after the first call.

    ``devices``: the GPUs the script chose (a DataParallel's ``device_ids``: indices among the visible GPUs,
    ``"2,3"``, ``torch.device("cuda:2")``). A plainly started script then relaunches as one process per chosen
    GPU, and local rank r runs on ``devices[r]``, also under a launcher; without CUDA they are ignored.

    ``processes=1``: a plainly started script stays one process, whatever ``MGPU_NPROC`` or the GPUs say (a
    command of the script that runs no model, beside commands that train: a click group's ``crf``); under a
    launcher it joins the launcher's job as usual. No other count is accepted."""
    global _job
    if processes not in (None, 1):
        raise ValueError(f"setup(processes={processes!r}): only processes=1 (stay one process) is accepted")
    if _job is not None:
        return
    if own_path_runs():
        # The script's own distributed path, which it started itself (own_path.leave_to_own_path): a job of one
        # plain process, with no process group, device or output of the runtime's; the script's own are its.
        _job = Job(SINGLE_PROCESS, _current_device(), owns_process_group=False)
        return
    chosen = chosen_devices(devices)
    environment = detect_environment(os.environ)
    # torchrun --nproc_per_node=1 is a deliberate choice; one SLURM task is just SLURM's default.
    if environment.world_size == 1 and environment.launcher != TORCHRUN and processes is None:
        relaunch_if_requested(chosen)
    device, shares_device = _bind_device(environment, chosen)
    owns_process_group = not dist.is_initialized()
    if owns_process_group:
        _init_process_group(environment, _backend(device, shares_device))
        atexit.register(teardown)
    elif dist.get_world_size() != environment.world_size:
        raise LaunchEnvironmentError(
            f"a process group of {dist.get_world_size()} processes already exists, but the launch environment "
            f"says {environment.world_size}"
        )
    job = Job(environment, device, owns_process_group)
    if environment.world_size > 1:
        job.safety = SafetyNet()
        job.lockstep = Lockstep()
        job.lockstep.start(environment.rank, environment.world_size, environment.master_addr, environment.master_port)
        job.group, job.gradients, job.stream = global_view.join(
            environment.rank, environment.world_size, device, job.lockstep
        )
    _job = job
    rank_output.apply(environment)


def teardown() -> None:
    """Leave the job: a note for the peers, then destroy the process group this module created. Runs at exit."""
    global _job
    job, _job = _job, None
    atexit.unregister(teardown)
    if job is None:
        return
    if job.safety is not None:
        job.safety.remove()
    if job.gradients is not None:
        global_view.leave(job.gradients)
    # Python sets sys.last_value when an uncaught exception ended the script.
    ended = getattr(sys, "last_value", None)
    if job.lockstep is not None:
        job.lockstep.stop(f"an uncaught {type(ended).__name__}" if ended is not None else "sys.exit() or the end of its script")
    if job.owns_process_group and dist.is_initialized():
        store, everyone = the_store()
        dist.destroy_process_group()
        # None ends its process (closing its connections) while a peer is still taking its group down: that peer
        # could abort at exit (leaving.py). Only after a good end, and not before the destroy: a rank leaving
        # early must not wait for peers that wait for it in a collective (the lockstep check's heartbeats say
        # which), nor one whose script failed (the job fails anyway).
        if ended is None:
            meet_the_others(store, everyone, "left", job.lockstep.a_peer_waits if job.lockstep is not None else None)
        let_the_gloo_threads_finish(everyone)


def current_job() -> Job | None:
    """This process's part in the job when ``setup()`` has run, else None (nothing is set up here)."""
    return _job


def job() -> Job:
    """This process's part in the job (set up first)."""
    setup()
    assert _job is not None
    return _job


def rank() -> int:
    """This process's rank among all processes of the job (0 on the main process)."""
    return _environment().rank


def local_rank() -> int:
    """This process's rank among the processes of its node: the index of its GPU."""
    return _environment().local_rank


def world_size() -> int:
    """How many processes the job has (1 for a plain single process)."""
    return _environment().world_size


def node_rank() -> int:
    """The index of this process's node."""
    return _environment().node_rank


def is_main_process() -> bool:
    """Whether this is rank 0, the process that logs, saves and evaluates once for the job."""
    return rank() == 0


def device() -> torch.device:
    """This process's device: ``cuda:<local rank>`` (modulo visible GPUs), or the CPU without CUDA."""
    return job().device


def is_initialized() -> bool:
    """``torch.distributed.is_initialized()`` as the original script saw it: whether a process group of the script's
    own making exists. The runtime's own group does not count (under DataParallel the script had none); on the
    script's own distributed path (``leave_to_own_path``) its group does."""
    return dist.is_available() and dist.is_initialized() and not (_job is not None and _job.owns_process_group)


def barrier() -> None:
    """Wait until every process gets here."""
    current = job()
    if current.lockstep is not None:
        with current.lockstep.waiting_in(BARRIER, "a barrier"):  # a peer blocked elsewhere is told apart
            _barrier(current.device)


def _environment() -> LaunchEnvironment:
    if _job is not None:
        return _job.environment
    aside = own_path_runs()
    environment = SINGLE_PROCESS if aside else detect_environment(os.environ)
    if aside or _setup_would_relaunch(environment):
        # execs torchrun (or stops): this process's own answers would be for no process of the job; or, on the
        # script's own path, the job of one plain process
        setup()
        assert _job is not None
        return _job.environment
    return environment


def _setup_would_relaunch(environment: LaunchEnvironment) -> bool:
    """Whether ``setup()`` would replace this process (see the module doc): a plain start (the conditions of
    ``setup()``) wanting more than one process, outside a DataLoader worker (whose parent has set up)."""
    if environment.world_size != 1 or environment.launcher == TORCHRUN:
        return False
    if torch.utils.data.get_worker_info() is not None:
        return False
    return relaunch_wanted(os.environ)


def chosen_devices(devices: Sequence[int | str | torch.device] | str | None) -> tuple[int, ...] | None:
    """``setup(devices=...)`` as GPU indices: ``[2, 3]``, ``"2,3"``, ``["2", "3"]``, ``[torch.device("cuda:2")]``."""
    if devices is None:
        return None
    items = devices.split(",") if isinstance(devices, str) else list(devices)
    chosen = []
    for item in items:
        index = item.index if isinstance(item, torch.device) else int(str(item).strip())
        if index is None or index < 0:
            raise LaunchEnvironmentError(f"setup(devices={devices!r}): {item!r} is no GPU index")
        chosen.append(index)
    if not chosen:
        raise LaunchEnvironmentError(f"setup(devices={devices!r}) chooses no GPU")
    return tuple(chosen)


def device_index(local_rank: int, visible: int, chosen: tuple[int, ...] | None) -> int:
    """The GPU a local rank runs on: the chosen GPUs in turn, else every visible one."""
    if chosen is None:
        return local_rank % visible
    missing = [index for index in chosen if index >= visible]
    if missing:
        raise LaunchEnvironmentError(f"the script chose GPU {missing[0]}, but only {visible} are visible")
    return chosen[local_rank % len(chosen)]


def _current_device() -> torch.device:
    """The device the script itself made current (``torch.cuda.set_device(gpu)``), or the CPU without CUDA."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _bind_device(environment: LaunchEnvironment, chosen: tuple[int, ...] | None = None) -> tuple[torch.device, bool]:
    """This process's device, made current before any CUDA work; and whether it is shared with other ranks."""
    if not torch.cuda.is_available():
        return torch.device("cpu"), False
    visible = torch.cuda.device_count()
    shares_device = os.environ.get(SHARE_DEVICE_VARIABLE, "") not in ("", "0") or (
        environment.launcher != SLURM and environment.local_world_size > (len(chosen) if chosen else visible)
    )
    index = device_index(environment.local_rank, visible, chosen)
    torch.cuda.set_device(index)
    return torch.device("cuda", index), shares_device


def _backend(device: torch.device, shares_device: bool) -> str:
    chosen = os.environ.get(BACKEND_VARIABLE, "").strip()
    if chosen:
        return chosen
    return "nccl" if device.type == "cuda" and not shares_device else "gloo"


def _init_process_group(environment: LaunchEnvironment, backend: str) -> None:
    if environment.world_size == 1:
        # No peers: an in-process store, so a single process needs no address, port or rendezvous.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        return
    _check_master_address(environment)
    timeout = datetime.timedelta(seconds=timeout_seconds(os.environ))
    joining = {"rank": environment.rank, "world_size": environment.world_size, "timeout": timeout}
    if environment.launcher == TORCHRUN:  # torchrun's agent serves the store, and its rendezvous bounds the wait
        dist.init_process_group(backend, init_method=environment.init_method, **joining)
    else:
        dist.init_process_group(backend, store=_rendezvous_store(environment, timeout), **joining)


def _rendezvous_store(environment: LaunchEnvironment, timeout: datetime.timedelta) -> dist.Store:
    """The job's store at MASTER_ADDR:MASTER_PORT, served by rank 0, as ``tcp://`` would make it, but with every
    wait bounded: torch's client, connected to another program's listener that never answers, waits forever
    (and rank 0's port already taken is said in torch's words, naming no variable)."""
    host, port, seconds = environment.master_addr, environment.master_port, timeout.total_seconds()
    if environment.rank == 0:
        try:
            return dist.TCPStore(
                host, port, environment.world_size, is_master=True, timeout=timeout, wait_for_workers=False,
                multi_tenant=True,
            )
        except dist.DistNetworkError as error:
            if "EADDRINUSE" not in str(error):
                raise
            raise LaunchEnvironmentError(
                f"MASTER_PORT={port} is in use on {host} by another program, so rank 0 cannot serve the job's store "
                "there: choose a free port, the same for every process"
            ) from None
    connected: dict[str, object] = {}

    def connect() -> None:
        try:
            connected["store"] = dist.TCPStore(host, port, environment.world_size, is_master=False, timeout=timeout)
        except Exception as error:  # noqa: BLE001 -- raised below, in the thread that waits
            connected["error"] = error

    # In a thread that can be abandoned: the client's own timeout does not cover a listener that never answers.
    attempt = threading.Thread(target=connect, name="mgpu_runtime rendezvous", daemon=True)
    attempt.start()
    attempt.join(seconds + _GRACE_S)
    if "store" in connected:
        return connected["store"]
    if "error" in connected and "EADDRINUSE" in str(connected["error"]):
        raise connected["error"]
    raise LaunchEnvironmentError(
        f"rank {environment.rank} could not join the job's store at {host}:{port} (MASTER_ADDR, MASTER_PORT) within "
        f"{TIMEOUT_VARIABLE}={seconds:g} s: {_what_listens(host, port)}"
    ) from connected.get("error")


# Beyond the store client's own timeout, before its thread is abandoned.
_GRACE_S = 5.0


def _what_listens(host: str, port: int) -> str:
    """What a rank that could not join finds at the store's address, said for the person reading why."""
    try:
        with socket.create_connection((host, port), timeout=_GRACE_S):
            return (
                "a program there accepts connections but does not answer as torch's store (another program holds "
                "the port, or rank 0 is stuck): choose a free MASTER_PORT, the same for every process"
            )
    except OSError as error:
        return f"nothing answers there ({error.strerror or error}): rank 0 did not start, or ended, or is elsewhere"


def _check_master_address(environment: LaunchEnvironment) -> None:
    """torch's own error for a host that does not resolve names no variable; this one does."""
    try:
        socket.getaddrinfo(environment.master_addr, environment.master_port)
    except (socket.gaierror, UnicodeError) as error:
        raise LaunchEnvironmentError(
            f"MASTER_ADDR={environment.master_addr!r} does not resolve ({error}): set it to the address of the "
            "node running rank 0, the same for every process"
        ) from None


def timeout_seconds(environ) -> float:
    """How long any collective may wait for the other ranks: ``MGPU_TIMEOUT`` seconds, else 300. At most a
    year: torch counts the timeout in milliseconds, and ``inf`` or ``1e308`` overflowed on every rank."""
    text = environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= MAX_TIMEOUT_S:
        raise LaunchEnvironmentError(
            f"{TIMEOUT_VARIABLE}={text!r} must be a positive number of seconds, at most {MAX_TIMEOUT_S} (a year)"
        )
    return value


def _barrier(device: torch.device) -> None:
    if dist.get_backend() == "nccl":
        # Tells NCCL which device this rank uses, instead of letting it guess.
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()
