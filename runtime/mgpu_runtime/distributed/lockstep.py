"""The lockstep check, and what a stalled or broken job says: ranks out of step fail loudly, naming who.

Every process must reduce the same step's gradients together. A rank that skips a backward (a ``continue``
before ``loss.backward()``, a try/except that swallowed one rank's error, an ``if`` on a per-rank value)
does not hang the job: its next reduction meets the others' current one, sizes agree, and from then on every
step averages gradients of different batches, silently. So each rank counts its steps (training forwards of
the wrapped model: train mode, grad enabled) and carries the count inside the reduction itself: one
bucket of every backward (the smallest) gets ``world_size`` extra elements, zero except this rank's own slot, which holds
its count. After the sum every rank sees every rank's count, at the price of a few elements (no extra
collective); counts that differ raise ``LockstepError`` on every rank, with the same message.
``MGPU_LOCKSTEP=0`` switches it off.

When a collective fails instead (the process-group timeout, ``MGPU_TIMEOUT``, or a peer gone), the message
says which ranks did not arrive and where they were: each rank publishes its count to the job's store once a
second from a background thread (a heartbeat: alive and behind, or silent, i.e. dead or stuck outside
Python), and a rank that leaves writes a note at exit. The gradient reduction explains its own failures;
other collectives (a barrier, the loader, a criterion) are explained by the process's excepthook.

The loop's values are global (``mgpu_runtime.sharded``): a loss, a sum, a metric of the batch, a forward of
the wrapped model is a collective too, and one made on some ranks only (``if is_main_process():`` around an
evaluation, an ``if rank == 0:``) would pair with another collective of the others: a wait until the
timeout, or worse, sums of unrelated tensors. So each rank counts its collectives of global values (a sum
carries every rank's count, ``counts``) and marks where it is blocked (such a collective, a
barrier, or its gradient reduction); the heartbeat publishes both, and a rank blocked for two beats compares
itself with the peers that are blocked too. Blocked ranks whose steps or counts differ
can never meet: each says so, naming the ranks and the statements they wait in, and exits at once
(``os._exit(1)``: its own collective would never return), seconds after the mismatch instead of
``MGPU_TIMEOUT``. A rank that is computing, not blocked, is never judged: it may be on its way.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from mgpu_runtime.sharded.groups import Monitor

LOCKSTEP_VARIABLE = "MGPU_LOCKSTEP"
_HEARTBEAT_S = 1.0
_CAUSES = (
    "a `continue` (or `break`) before `loss.backward()` that only some ranks take, a try/except around the step "
    "that swallowed one rank's error, or an `if` on a per-rank value (the rank, its own loss or batch)"
)


class LockstepError(RuntimeError):
    """Ranks reduced gradients of different steps: some ran more backward passes than others."""


class CollectiveFailed(RuntimeError):
    """A collective timed out or lost a peer; the message names the ranks that did not arrive."""
# A beat's store call waits at most this long (the client's timeout), so the heartbeat ends within it.
_STORE_TIMEOUT_S = 10


def enabled() -> bool:
    return os.environ.get(LOCKSTEP_VARIABLE, "").strip() != "0"


class Lockstep(Monitor):
    """This rank's lockstep check: its counts, where it waits, its heartbeat; one per job (the process group's).

    It is the monitor of the job's rank group (``mgpu_runtime.sharded.groups.Monitor``): the collectives of the
    loop's global values are counted and carried (``counts``, ``check``) and said where a rank waits
    (``waiting``)."""

    def __init__(self) -> None:
        self._steps = 0
        """Training forwards of the wrapped model on this rank: the step it is at."""
        self._reduced = 0
        """The step whose gradient reduction this rank last started (so a peer can tell "still computing" apart)."""
        self._collectives = 0
        """Collectives of the loop's global values this rank has entered (a loss, a sum, a gather: every rank must make
        the same ones)."""
        self._blocked: tuple[str, str, int] | None = None
        """The collective this rank waits in for its peers (its kind, what it is) and the waiting thread."""
        self._buckets = 0
        """Gradient buckets sent and not yet reduced: while any is, this rank waits in its gradient reduction."""
        self._bucket_thread = 0
        self._bucket_lock = threading.Lock()
        self._store: dist.Store | None = None
        self._rank = 0
        self._world = 1
        self._stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._pending_collectives: tuple[torch.Tensor, str, int] | None = None
        self._bucket_sizes: dict[int, int] = {}
        self._carrier_index = 0
        self._pending: tuple[torch.Tensor, int] | None = None
        self._slots: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self._outgoing_buffers: dict[tuple[torch.dtype, torch.device, int], list[torch.Tensor]] = {}
        """The buffers not in flight that carried a bucket and the counts, by kind and bucket size (``_outgoing``)."""

    def start(self, rank: int, world_size: int, master_addr: str | None, master_port: int | None) -> None:
        """Start publishing this rank's progress to the job's store, and explain uncaught collective failures."""
        self._rank, self._world = rank, world_size
        if master_addr and master_port:
            try:
                client = dist.TCPStore(
                    master_addr,
                    master_port,
                    is_master=False,
                    timeout=datetime.timedelta(seconds=_STORE_TIMEOUT_S),
                    wait_for_workers=False,
                )
                # Per attempt: an elastic restart must not read the notes of the attempt before it.
                self._store = dist.PrefixStore(f"mgpu_runtime/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", client)
            except (RuntimeError, dist.DistStoreError):
                self._store = None  # no explanations then, but the job runs
        if self._store is not None:
            self._stop.clear()
            self._heartbeat_thread = threading.Thread(target=self._heartbeat, name="mgpu_runtime heartbeat", daemon=True)
            self._heartbeat_thread.start()
        previous = sys.excepthook
        sys.excepthook = lambda kind, value, traceback: self._explaining_hook(previous, kind, value, traceback)

    def stop(self, how: str) -> None:
        """At exit: end the heartbeat, then leave a note saying how this rank ended, for peers still waiting for it.

        The heartbeat is joined, not only told to stop: a daemon thread still inside a store call when the
        interpreter finalizes is ended by ``pthread_exit`` inside torch's C++, which aborts the process
        (``terminate called without an active exception``, SIGABRT) after a run that finished well."""
        self._stop.set()
        if self._heartbeat_thread is not None and self._heartbeat_thread is not threading.current_thread():
            self._heartbeat_thread.join(timeout=2 * _STORE_TIMEOUT_S)
            self._heartbeat_thread = None
        self._publish(f"exited/{self._rank}", f"{self._steps} {how}")

    def a_peer_waits(self) -> bool:
        """Whether a peer that has not left is blocked in a collective (after this rank has stopped: it waits for
        this rank then, and its collective fails only when this process ends)."""
        if self._store is None:
            return False
        try:
            for rank in range(self._world):
                if rank == self._rank or self._read(f"exited/{rank}") is not None:
                    continue
                progress = self._read(f"progress/{rank}")
                if progress is not None and progress.split(" ", 5)[4] != "-":
                    return True
        except (RuntimeError, dist.DistStoreError, IndexError):
            return False
        return False

    def note_forward(self) -> None:
        """Called by the wrapper at each training forward."""
        self._steps += 1

    @contextlib.contextmanager
    def waiting_in(self, kind: str, what: str) -> Iterator[None]:
        """This rank waits for its peers in a collective of ``kind``, ``what`` (said in the messages)."""
        self._blocked = (kind, what, threading.get_ident())
        try:
            yield
        finally:
            self._blocked = None

    def waiting(self, what: str) -> contextlib.AbstractContextManager[None]:
        """This rank waits for its peers in a collective of the loop's global values, ``what`` (counted by
        ``counts``)."""
        return self.waiting_in(GLOBAL, what)

    def counts(self, like: torch.Tensor) -> torch.Tensor:
        """``world_size`` elements for a reduction of global values to carry, this rank's count of such collectives
        in its slot: after the sum every rank sees whether all made the same ones (``check``).
        A collective that carries no counts (a gather) calls it too, for the count the heartbeat publishes."""
        self._collectives += 1
        return self._slot(like) * (self._collectives % _exact_integers(like.dtype))

    def check(self, counts: torch.Tensor, what: str) -> None:
        """After a reduction of global values: every rank's count is this one's, or the reduction met another
        collective (one made on some ranks only). Read at once on the CPU; on a GPU at the next gradient reduction
        (reading it here would synchronise the device at every loss)."""
        if counts.device.type != "cpu":
            self._pending_collectives = (counts, what, self._steps)
            return
        self._check_collective_counts(counts, what, self._steps, _caller())

    def _check_collective_counts(self, counts: torch.Tensor, what: str, step: int, where: str) -> None:
        values = counts.tolist()
        expected = self._collectives % _exact_integers(counts.dtype)
        if all(value == expected for value in values) or not enabled():
            return
        listing = ", ".join(
            f"rank {rank} after {round(value)}" if value == round(value) and value >= 0 else f"rank {rank} in another collective"
            for rank, value in enumerate(values)
        )
        raise LockstepError(
            f"mgpu_runtime: rank {self._rank}'s collective {self._collectives} ({what}{where}, step {step}) met other collectives "
            f"than the same one of every rank (collectives of global values made: {listing}). The loop's values are "
            f"global: a loss, a sum, a metric of the batch is a collective. Usually one computed on some ranks only "
            f"(`if rank == 0:`, `if is_main_process():` around a loss or a metric of the batch). Make every rank make "
            f"the same calls. {LOCKSTEP_VARIABLE}=0 switches this check off."
        )

    def _blocked_in(self) -> tuple[str, str, int] | None:
        if self._blocked is None and self._buckets:
            return (GRADIENT, f"its gradient reduction of step {self._steps}", self._bucket_thread)
        return self._blocked

    def _bucket_sent(self, change: int) -> None:
        with self._bucket_lock:
            self._buckets += change
        if change > 0:
            self._bucket_thread = threading.get_ident()

    def all_reduce(self, buffer: torch.Tensor, bucket_index: int) -> torch.futures.Future:
        """Sum ``buffer`` over ranks (a DDP bucket); one bucket of each backward carries the lockstep counts."""
        self._check_pending()  # before the outgoing buffer, which holds the last counts, is overwritten
        if bucket_index == 0:
            self._reduced = self._steps
        marked = bucket_index == self._carrier(bucket_index, buffer.numel()) and enabled() and buffer.is_floating_point()
        step = self._steps
        size = buffer.numel()
        if marked:
            sent = self._outgoing(buffer)
            sent[:size].copy_(buffer)
            torch.mul(self._slot(buffer), step % _exact_integers(buffer.dtype), out=sent[size:])
        else:
            sent = buffer

        def finished(future: torch.futures.Future) -> torch.Tensor:
            try:
                result = future.value()[0]
            except Exception as failure:  # re-raised, saying who did not arrive
                raise CollectiveFailed(self.explain(failure, f"the gradient reduction of step {step}")) from failure
            finally:
                self._bucket_sent(-1)
            if marked:
                # The buffer goes back for another carrier; what DDP and the check read later are copies (the
                # smallest bucket, and world_size counts).
                self._check_later(result[size:].clone(), step)
                gradients = result[:size].clone()
                self._give_back(sent)
                return gradients
            return result

        self._bucket_sent(+1)
        return dist.all_reduce(sent, async_op=True).get_future().then(finished)

    def _carrier(self, bucket_index: int, size: int) -> int:
        """The bucket that carries the counts: the smallest of the last backward (copying it to append the counts
        is the check's main cost). The same on every rank, as DDP gives every rank the same buckets."""
        if bucket_index == 0 and self._bucket_sizes:
            self._carrier_index = min(self._bucket_sizes, key=lambda index: (self._bucket_sizes[index], index))
            self._bucket_sizes.clear()  # DDP rebuilds its buckets after the first step
        self._bucket_sizes[bucket_index] = size
        return self._carrier_index

    def _check_later(self, counts: torch.Tensor, step: int) -> None:
        """Counts are read at the next reduction, on the thread running the hook: reading them here, on the
        collective's thread, would cost a GIL hand-over (on CPU) or a device synchronisation (on GPU) every step.
        A skip is seen one step late, but seen: once a rank is out of step, every later reduction shows it."""
        self._pending = (counts, step)

    def _check_pending(self) -> None:
        if self._pending_collectives is not None:
            counts, what, step = self._pending_collectives
            self._pending_collectives = None
            self._check_collective_counts(counts, what, step, "")
        if self._pending is not None:
            counts, step = self._pending
            self._pending = None
            self._check(counts, step)

    def _outgoing(self, like: torch.Tensor) -> torch.Tensor:
        """The bucket and the counts, sent as one tensor: the same memory every step (a fresh tensor each time
        costs gloo about as much again as the reduction of a small bucket). Several wrapped models reduce in one
        backward, each with its carrier bucket in flight (MuZero's networks, each wrapped, two with a first bucket of
        8 elements): each carrier in flight has a buffer of its own, taken from those given back (``_give_back``)."""
        key = (like.dtype, like.device, like.numel())
        with self._bucket_lock:
            free = self._outgoing_buffers.setdefault(key, [])
            if free:
                return free.pop()
        return like.new_empty(like.numel() + self._world)

    def _give_back(self, buffer: torch.Tensor) -> None:
        """A carrier's buffer no longer in flight (its result copied out), for the next carrier of its size."""
        with self._bucket_lock:
            self._outgoing_buffers[(buffer.dtype, buffer.device, buffer.numel() - self._world)].append(buffer)


    def _slot(self, like: torch.Tensor) -> torch.Tensor:
        """``world_size`` elements, 1 at this rank's place: its count times this is what it sends."""
        key = (like.dtype, like.device)
        if key not in self._slots:
            self._slots[key] = like.new_zeros(self._world)
            self._slots[key][self._rank] = 1
        return self._slots[key]

    def _check(self, counts: torch.Tensor, step: int) -> None:
        values = [round(value) for value in counts.tolist()]
        if len(set(values)) == 1:
            return
        ahead = [rank for rank, value in enumerate(values) if value > min(values)]
        listing = ", ".join(f"rank {rank} at step {value}" for rank, value in enumerate(values))
        raise LockstepError(
            f"mgpu_runtime: the ranks reduced gradients of different steps ({listing}): "
            f"rank{'s' if len(ahead) > 1 else ''} {', '.join(map(str, ahead))} skipped a backward (or the others ran an "
            f"extra one), so from here every step would average gradients of different batches. Usually {_CAUSES}: "
            f"make every rank take the same path (decide together, e.g. with mgpu_runtime.reduce_sum of a flag). "
            f"{LOCKSTEP_VARIABLE}=0 switches this check off."
        )

    def explain(self, failure: BaseException, where: str) -> str:
        """A message for a collective that failed at ``where``: which ranks did not arrive, and how they are."""
        first = str(failure).strip().splitlines()[0] if str(failure).strip() else type(failure).__name__
        others = self._peers()
        if others is None:
            whom = "the other ranks' progress is unknown (the job's store cannot be reached; rank 0 may have exited)"
        else:
            whom = "; ".join(others) or "it has no peers"
        return (
            f"mgpu_runtime: rank {self._rank} waited in vain at {where} ({type(failure).__name__}: {first[:200]}). {whom}. "
            f"A rank that is alive but behind is somewhere the others are not (another collective, or {_CAUSES}); "
            f"the wait is bounded by MGPU_TIMEOUT (seconds)."
        )

    def _peers(self) -> list[str] | None:
        """What each other rank was doing, from its exit note or its heartbeat (read twice, a few beats apart)."""
        if self._store is None:
            return None
        try:
            first = self._progress()
            time.sleep(2.5 * _HEARTBEAT_S)
            second = self._progress()
            exited = {rank: self._read(f"exited/{rank}") for rank in range(self._world) if rank != self._rank}
        except (RuntimeError, dist.DistStoreError):
            return None
        states: dict[str, list[int]] = {}
        for rank in range(self._world):
            if rank == self._rank:
                continue
            if exited[rank] is not None:
                count, how = exited[rank].split(" ", 1)
                state = f"exited at step {count} ({how})"
            elif second.get(rank) is None:
                state = "never reported (did not start, or died before its first beat)"
            else:
                _, steps, reduced = second[rank]
                alive = first.get(rank) != second[rank]
                state = f"{{is_}} {'alive' if alive else 'not responding (killed, or stuck outside Python)'}, {_where(steps, reduced)}"
            states.setdefault(state, []).append(rank)
        return [f"{_ranks(ranks)} {state.format(is_='is' if len(ranks) == 1 else 'are')}" for state, ranks in states.items()]

    def _progress(self) -> dict[int, tuple[int, int, int]]:
        found = {}
        for rank in range(self._world):
            value = self._read(f"progress/{rank}")
            if value is not None:
                beat, steps, reduced = value.split(" ", 3)[:3]
                found[rank] = (int(beat), int(steps), int(reduced))
        return found

    def _read(self, key: str) -> str | None:
        if not self._store.check([key]):
            return None
        return self._store.get(key).decode()

    def _publish(self, key: str, value: str) -> None:
        if self._store is None:
            return
        with contextlib.suppress(RuntimeError, dist.DistStoreError):  # the store's host is gone: nobody reads it
            self._store.set(key, value)

    def _heartbeat(self) -> None:
        beat = 0
        stalled, last = 0, None
        while not self._stop.wait(_HEARTBEAT_S if beat else 0.0):
            beat += 1
            state = (self._steps, self._collectives, self._blocked_in())
            stalled = stalled + 1 if state == last and state[2] is not None else 0
            last = state
            kind, where = self._blocked_at() if stalled else ("-", "-")
            self._publish(f"progress/{self._rank}", f"{beat} {self._steps} {self._reduced} {self._collectives} {kind} {where}")
            if stalled >= 2 and enabled():
                self._stop_if_apart(state, kind, where)

    def _blocked_at(self) -> tuple[str, str]:
        """The kind of collective this rank waits in, and what it is with the script's statement that got it there
        (from the waiting thread's stack)."""
        blocked_now = self._blocked_in()
        if blocked_now is None:
            return "-", "-"
        kind, where, thread = blocked_now
        return kind, where + _statement(sys._current_frames().get(thread))

    def _stop_if_apart(self, state: tuple, kind: str, where: str) -> None:
        """End this rank, saying why, when it can never meet its peers: peers blocked in another kind of collective,
        or after other steps or collectives of global values; or, while it waits in the gradient reduction of its step, a peer
        already at a later step that never reduced this one (it skipped that backward, or makes none at all)."""
        try:
            peers = {rank: self._read(f"progress/{rank}") for rank in range(self._world) if rank != self._rank}
        except (RuntimeError, dist.DistStoreError):
            return
        apart = {}
        for rank, value in peers.items():
            if value is None:
                continue
            _, steps, reduced, losses, peer_kind, peer_where = value.split(" ", 5)
            steps, reduced, losses = int(steps), int(reduced), int(losses)
            # A peer past this step that never reduced it is named for that too, whether it computes or already waits
            # in a later step's collective (which of the two this check sees depends on when it reads the peer).
            skipped = kind == GRADIENT and steps > self._steps and reduced < self._steps
            past = f", past step {self._steps} without reducing its gradients (last reduced: step {reduced})" if skipped else ""
            if peer_kind != "-" and (steps, losses, peer_kind) != (self._steps, self._collectives, kind):
                apart[rank] = f"rank {rank} at step {steps} after {losses}, in {peer_where}{past}"
            elif skipped:
                apart[rank] = f"rank {rank} at step {steps} and computing{past}"
        if not apart or (self._steps, self._collectives, self._blocked_in()) != state:
            return
        listing = "; ".join(
            [f"rank {self._rank} at step {self._steps} after {self._collectives} collectives of global values, in {where}", *apart.values()]
        )
        print(
            f"mgpu_runtime: the ranks wait in collectives that can never meet ({listing}). Usually {_CAUSES}; or a "
            f"loss, a metric or a forward of the batch computed on some ranks only (`if is_main_process():`): the "
            f"loop's values are global, so each is a collective. Make every rank take the same path. "
            f"{LOCKSTEP_VARIABLE}=0 switches this check off.",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    def _explaining_hook(self, previous: Callable, kind: type, value: BaseException, traceback) -> None:
        """The usual traceback, then, for a failed collective outside the gradient reduction, who did not arrive."""
        previous(kind, value, traceback)
        if not _is_collective_failure(value) or any("mgpu_runtime: " in str(link) for link in _chain(value)):
            return  # not a collective's failure, or already explained (DDP re-raises the hook's error as its own)
        print(self.explain(value, f"a collective at step {self._steps}"), file=sys.stderr)


GLOBAL, GRADIENT, BARRIER = "global", "gradient", "barrier"
"""The kinds of collective a blocked rank says it waits in: two ranks blocked in different kinds never meet."""


def _caller() -> str:
    """`` at FILE:LINE``, the script's statement on this thread's stack (past torch's and the runtime's frames)."""
    return _statement(sys._getframe())


def _statement(frame) -> str:
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
        frame = frame.f_back
    return "" if frame is None else f" at {os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


# Torch's default first bucket holds up to 1 MB of the last gradients; a first bucket of one parameter
# (usually the last layer's bias) makes the carrier a few elements, whose copy costs nothing.
_FIRST_BUCKET_MB = 1e-6
_BUCKET_MB = 25


def bucket_arguments(ddp_init: Callable, given: dict) -> dict:
    """DDP arguments that make the smallest bucket tiny, unless the script chose its own buckets (or this torch
    cannot take per-bucket sizes)."""
    if {"bucket_cap_mb", "bucket_cap_mb_list"} & given.keys() or not enabled():
        return {}
    if "bucket_cap_mb_list" not in inspect.signature(ddp_init).parameters:
        return {}
    return {"bucket_cap_mb_list": [_FIRST_BUCKET_MB, _BUCKET_MB]}


def _exact_integers(dtype: torch.dtype) -> int:
    """Counts are sent modulo this, so every count is exact in the bucket's dtype (128 in bfloat16)."""
    if not dtype.is_floating_point:
        return 1 << 31
    return round(1.0 / torch.finfo(dtype).eps)


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}"


def _where(steps: int, reduced: int) -> str:
    if reduced < steps:
        return f"at step {steps} but not in its gradient reduction (still computing, or waiting elsewhere)"
    return f"in or past the gradient reduction of step {steps}"


_LIBRARIES = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))


def _chain(value: BaseException | None):
    while value is not None:
        yield value
        value = value.__cause__ or value.__context__


def _is_collective_failure(value: BaseException) -> bool:
    markers = ("Timed out", "timed out", "Connection closed by peer", "Connection reset by peer", "NCCL", "gloo")
    return isinstance(value, getattr(dist, "DistError", ())) or (
        isinstance(value, RuntimeError) and any(marker in str(value) for marker in markers)
    )


