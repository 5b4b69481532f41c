"""Where this process sits in the job, read from what its launcher put in the environment.

Two launchers are recognised, in this order (after Lightning Fabric's cluster environments: each is a
``Launcher`` of ``LAUNCHERS``, with ``detect`` and ``read`` over the same mapping), else a single process:

* torchrun (torchelastic): ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT``. Checked first, so torchrun started inside a SLURM allocation wins.
* SLURM's ``srun``: ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS`` (or the step's
  ``SLURM_STEP_NUM_TASKS``), ``SLURM_NODEID``; the master is the first host of the node list unless
  ``MASTER_ADDR`` says otherwise, and the port is ``MASTER_PORT`` or one derived from ``SLURM_JOB_ID``.
* Neither: a single process, a world of one, which needs no address and no port.

This module is a pure function of the environment mapping: it touches neither torch nor the network, so
every rule is tested with plain dictionaries. A half-set environment (``RANK`` without ``WORLD_SIZE``) is an
error that names what is missing and how to fix it, never a guess.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

TORCHRUN = "torchrun"
SLURM = "slurm"
SINGLE = "single"

_TORCHRUN_MARKERS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
_TORCHRUN_FIX = (
    "launch with `torchrun --nproc_per_node=N script.py`, which sets RANK, LOCAL_RANK, WORLD_SIZE, "
    "MASTER_ADDR and MASTER_PORT together, or unset them all to run a single process"
)
_SLURM_FIX = "start the script with `srun`, which sets all of them, or unset SLURM_PROCID to run a single process"
_SLURM_NODE_LISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
_SLURM_TASKS_PER_NODE = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
# Lightning's choice: a port per job, so two jobs sharing a node do not collide.
_SLURM_PORT_BASE = 15000
_SLURM_PORT_SPAN = 10000


class LaunchEnvironmentError(RuntimeError):
    """The launch environment is incomplete or contradictory; the message says how to fix it."""


@dataclass(frozen=True)
class LaunchEnvironment:
    """This process's place in the job."""

    launcher: str
    """``"torchrun"``, ``"slurm"`` or ``"single"``."""
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    """Processes on this node."""
    node_rank: int
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def init_method(self) -> str:
        """The ``init_process_group`` URL that reaches the other processes."""
        if self.launcher == TORCHRUN:
            # torchrun's agent already runs a store; env:// finds and reuses it (TORCHELASTIC_USE_AGENT_STORE).
            return "env://"
        return f"tcp://{self.master_addr}:{self.master_port}"


SINGLE_PROCESS = LaunchEnvironment(SINGLE, rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0)


class Launcher(ABC):
    """A way of launching the job's processes: whether ``environ`` shows it (``detect``), and where this process
    sits in the job it launched (``read``). A new launcher is one more subclass in ``LAUNCHERS``."""

    name: str

    @staticmethod
    @abstractmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """Whether this launcher started the process."""

    @staticmethod
    @abstractmethod
    def read(environ: Mapping[str, str]) -> LaunchEnvironment:
        """This process's place in the job (a half-set environment raises ``LaunchEnvironmentError``)."""


class Torchrun(Launcher):
    """torchrun (torchelastic): ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and the rest of its variables."""

    name = TORCHRUN

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        return any(name in environ for name in _TORCHRUN_MARKERS)

    @staticmethod
    def read(environ: Mapping[str, str]) -> LaunchEnvironment:
        return _torchrun(environ)


class Slurm(Launcher):
    """SLURM's ``srun``: ``SLURM_PROCID`` and its companions, the master from the node list."""

    name = SLURM

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        return "SLURM_PROCID" in environ

    @staticmethod
    def read(environ: Mapping[str, str]) -> LaunchEnvironment:
        return _slurm(environ)


LAUNCHERS: tuple[type[Launcher], ...] = (Torchrun, Slurm)
"""In the order they are asked: torchrun's variables win over SLURM's (torchrun inside an allocation)."""


def detect_environment(environ: Mapping[str, str]) -> LaunchEnvironment:
    """The launch environment described by ``environ`` (normally ``os.environ``): the first launcher that
    shows in it, else a single process."""
    for launcher in LAUNCHERS:
        if launcher.detect(environ):
            return launcher.read(environ)
    return SINGLE_PROCESS


def first_host(node_list: str) -> str:
    """The first host of a SLURM node list, compressed forms included.

    ``node[01-04,07],gpu5`` gives ``node01``; ``rack[1-2]-n[07-09]`` gives ``rack1-n07``: the first entry (commas
    inside brackets do not separate entries), with each bracket replaced by the start of its first range.
    """
    entry = re.match(r"(?:[^,\[\]]|\[[^\[\]]*\])+", node_list.strip())
    if entry is None:
        raise LaunchEnvironmentError(f"the SLURM node list {node_list!r} names no host")
    rest = node_list.strip()[entry.end() :]
    if rest and not rest.startswith(","):  # `node[1-2`: a bracket never closed (or one never opened)
        raise LaunchEnvironmentError(
            f"the SLURM node list {node_list!r} is malformed at {rest!r}: set MASTER_ADDR to the first node's address"
        )
    return re.sub(r"\[([^\],\-]*)[^\]]*\]", r"\1", entry.group())


def tasks_on_node(tasks_per_node: str, node: int) -> int:
    """Tasks on node number ``node`` from SLURM's ``2(x3),1`` notation (three nodes of 2, then one of 1)."""
    counts: list[int] = []
    for group in tasks_per_node.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", group)
        if match is None:
            raise LaunchEnvironmentError(f"cannot read the SLURM tasks per node {tasks_per_node!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if node >= len(counts):
        raise LaunchEnvironmentError(f"the SLURM tasks per node {tasks_per_node!r} list no node {node}")
    return counts[node]


def _torchrun(environ: Mapping[str, str]) -> LaunchEnvironment:
    _require(environ, _TORCHRUN_MARKERS, _TORCHRUN_FIX)
    world_size = _integer(environ, "WORLD_SIZE", minimum=1)
    rank = _integer(environ, "RANK", minimum=0)
    local_rank = _integer(environ, "LOCAL_RANK", minimum=0)
    if world_size > 1:
        _require(environ, ("MASTER_ADDR", "MASTER_PORT"), _TORCHRUN_FIX, found=f"WORLD_SIZE={world_size}")
    local_world_size = _integer(environ, "LOCAL_WORLD_SIZE", minimum=1) if "LOCAL_WORLD_SIZE" in environ else world_size
    if "GROUP_RANK" in environ:
        node_rank = _integer(environ, "GROUP_RANK", minimum=0)
    else:
        node_rank = (rank - local_rank) // local_world_size
    return _checked(
        LaunchEnvironment(
            TORCHRUN,
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            local_world_size=local_world_size,
            node_rank=node_rank,
            master_addr=environ.get("MASTER_ADDR"),
            master_port=_port(environ) if "MASTER_PORT" in environ else None,
        ),
        "RANK",
        "LOCAL_RANK",
    )


def _slurm(environ: Mapping[str, str]) -> LaunchEnvironment:
    world_variable = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
    _require(environ, ("SLURM_PROCID", world_variable, "SLURM_LOCALID", "SLURM_NODEID"), _SLURM_FIX)
    world_size = _integer(environ, world_variable, minimum=1)
    node_rank = _integer(environ, "SLURM_NODEID", minimum=0)
    tasks_variable = next((name for name in _SLURM_TASKS_PER_NODE if name in environ), None)
    local_world_size = tasks_on_node(environ[tasks_variable], node_rank) if tasks_variable else world_size
    master_addr = master_port = None
    if world_size > 1:
        master_addr = environ.get("MASTER_ADDR") or _slurm_master(environ)
        master_port = _slurm_port(environ)
    return _checked(
        LaunchEnvironment(
            SLURM,
            rank=_integer(environ, "SLURM_PROCID", minimum=0),
            local_rank=_integer(environ, "SLURM_LOCALID", minimum=0),
            world_size=world_size,
            local_world_size=local_world_size,
            node_rank=node_rank,
            master_addr=master_addr,
            master_port=master_port,
        ),
        "SLURM_PROCID",
        "SLURM_LOCALID",
    )


def _slurm_master(environ: Mapping[str, str]) -> str:
    node_list = next((environ[name] for name in _SLURM_NODE_LISTS if environ.get(name)), None)
    if node_list is None:
        raise LaunchEnvironmentError(
            "SLURM_PROCID is set but neither a node list (SLURM_JOB_NODELIST) nor MASTER_ADDR is: "
            f"the processes cannot find each other; {_SLURM_FIX}, or set MASTER_ADDR to the first node's address"
        )
    return first_host(node_list)


def _slurm_port(environ: Mapping[str, str]) -> int:
    if "MASTER_PORT" in environ:
        return _port(environ)
    if "SLURM_JOB_ID" in environ:
        return _SLURM_PORT_BASE + _integer(environ, "SLURM_JOB_ID", minimum=0) % _SLURM_PORT_SPAN
    raise LaunchEnvironmentError(
        "SLURM_PROCID is set but neither MASTER_PORT nor SLURM_JOB_ID is, so no rendezvous port can be chosen: "
        f"set MASTER_PORT to a free port, the same for every task; or {_SLURM_FIX}"
    )


def _require(environ: Mapping[str, str], names: tuple[str, ...], fix: str, found: str | None = None) -> None:
    """Fail when some of ``names`` are missing; ``found`` says what made them necessary (default: the others)."""
    missing = [name for name in names if name not in environ]
    if not missing:
        return
    if found is None:
        present = [name for name in names if name in environ]
        found = f"{', '.join(present)} {'is' if len(present) == 1 else 'are'} set"
    raise LaunchEnvironmentError(
        f"{found} but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not: "
        f"a half-set launch environment; {fix}"
    )


def _integer(environ: Mapping[str, str], name: str, minimum: int, maximum: int | None = None) -> int:
    text = environ[name]
    try:
        value = int(text)
    except ValueError:
        raise LaunchEnvironmentError(f"{name}={text!r} is not a whole number") from None
    if value < minimum:
        raise LaunchEnvironmentError(f"{name}={value} is below {minimum}")
    if maximum is not None and value > maximum:
        raise LaunchEnvironmentError(f"{name}={value} is above {maximum}")
    return value


def _port(environ: Mapping[str, str]) -> int:
    return _integer(environ, "MASTER_PORT", minimum=1, maximum=65535)


def _checked(environment: LaunchEnvironment, rank_name: str, local_rank_name: str) -> LaunchEnvironment:
    if environment.rank >= environment.world_size:
        raise LaunchEnvironmentError(
            f"{rank_name}={environment.rank} is not below the world size {environment.world_size}: "
            "the variables come from different launches"
        )
    if environment.local_rank >= environment.local_world_size:
        raise LaunchEnvironmentError(
            f"{local_rank_name}={environment.local_rank} is not below the {environment.local_world_size} "
            "processes of this node: the variables come from different launches"
        )
    return environment
