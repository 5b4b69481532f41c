"""Gradient hooks on global values: ``x.register_hook(hook)``, ``x.retain_grad()`` and ``x.grad``, for both targets.

Under DataParallel a hook registered outside the model's forward is on a gathered tensor, or on one computed
from it: it runs once, with the gradient of the whole value, and what it returns is the gradient that flows
on. Here the value is held in pieces and so is its gradient; the hook still gets the whole gradient, as a
``Sharded`` value (lazily, as every global value of the loop: its rows are the pieces' gradients, a reduction
over them is a collective, anything else materialises it), and what it returns (``Sharded``, or a plain
tensor of the value's shape) is cut into the pieces' gradients.

* **One piece per process** (``--to ddp``; a balanced value on one replica): the hook goes on the piece, and
  is given the piece's gradient as the global value, ``Sharded`` over the processes (a piece's gradient is
  whole on its rank, ``gradients.py``; the other rows are the other ranks', whose hooks meet this one's in
  any collective). Every process runs the hook, as every process runs the loop.
* **Several pieces in one process** (``--to balanced``): autograd reaches each replica's piece on its own, so
  no piece's hook could see the others' rows. ``register_hook`` therefore ties the pieces: the value's
  pieces become the outputs of one node (``_Tie``, copies of them), which every later use goes through, and
  whose backward receives every piece's gradient at once, runs the hooks in the order they were registered,
  and hands the result to the old pieces. A hook sees the gradient of every use of its value, also of uses
  made before it was registered; those went to the old pieces directly. So a value already used with
  autograd (``Sharded._used``) is hooked piece by piece instead: the hook runs once, on the first piece's
  gradient held as the global value with one replica's rows here (``_OnePart``), and each operation it
  makes is recorded and replayed on the other pieces' gradients (a rule decides by global facts only, so
  each piece takes the same path). Element-wise and row-wise hooks (scaling, clamping or reversing the
  gradient, per-row weights) are exact; an operation that needs the other rows (a reduction over them, a
  materialisation, a print) raises, naming the line where the hook was registered. A use the marking missed
  is caught in the backward: the old pieces must receive exactly what the tie gave them, or it raises.

A gathered output's pieces are fresh views of the replicas' outputs (``scatter_gather.gather``), as
DataParallel's gather made a new tensor: its hooks and ``.grad`` see the uses of the gathered value, not the
uses inside ``forward``.

``retain_grad()`` and ``.grad``: the gradient kept is the one after the hooks (torch runs the retaining hook
last), read from the tensors the hooks hand it to (``Sharded._holders``: the old pieces of a tied value).
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from mgpu_runtime.sharded.groups import Group, starts
from mgpu_runtime.sharded.tensor import Sharded, materialize

Hook = Callable[[torch.Tensor], Any]
Rule = Callable[[Callable, tuple, dict], Any]

_LIBRARIES = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH_REGISTER_HOOK = torch.Tensor.register_hook
TORCH_RETAIN_GRAD = torch.Tensor.retain_grad
"""Torch's own, for the pieces (over processes ``gradients.py`` puts its own on ``torch.Tensor``, for the loop's)."""


class _Calls(threading.local):
    piece: _PieceCall | None = None
    """The hook call on one piece's gradient in progress on this thread (``rules.apply`` hands it every op)."""


CALLS = _Calls()


def register_hook(func: Callable, args: tuple, kwargs: dict) -> Handle:
    """``value.register_hook(hook)`` (see the module doc)."""
    value = args[0]
    hook = args[1] if len(args) > 1 else kwargs["hook"]
    if not any(piece.requires_grad for piece in value._pieces):
        raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    site = _site()
    if len(value._pieces) == 1:
        return Handle([TORCH_REGISTER_HOOK(value._pieces[0], _whole_from_one(value, hook))])
    if value._tie is None and not value._used:
        _Tie(value, site)
    if value._tie is not None:
        return value._tie.add(hook, site)
    return _PieceByPiece(value, hook, site).handle


def retain_grad(func: Callable, args: tuple, kwargs: dict) -> None:
    """``value.retain_grad()``: its ``.grad`` is the gradient after its hooks."""
    for tensor in holders(args[0]):
        TORCH_RETAIN_GRAD(tensor)


def holders(value: Sharded) -> Sequence[torch.Tensor]:
    """The tensors whose gradients are ``value``'s after its hooks: its pieces, or a tied value's old pieces."""
    return value._pieces if value._holders is None else value._holders


class Handle:
    """What ``register_hook`` returns: ``remove()`` takes the hook away (also as a context manager)."""

    def __init__(self, handles: list[Any], remove: Callable[[], None] | None = None) -> None:
        self._handles = handles
        self._remove = remove

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        if self._remove is not None:
            self._remove()
            self._remove = None

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


# --- one piece: the hook on it --------------------------------------------------------------------------------------


def _whole_from_one(value: Sharded, hook: Hook) -> Hook:
    splits, group = value._splits, value._group

    def piece_hook(gradient: torch.Tensor) -> torch.Tensor | None:
        whole = Sharded([gradient], splits, group)
        result = hook(whole)
        return None if result is None else as_gradient(result, whole, hook)._pieces[0]

    return piece_hook


def as_gradient(result: Any, like: Sharded, hook: Hook) -> Sharded:
    """What a hook returned, as a gradient held like ``like`` (torch's errors for another size, or no tensor)."""
    if result is None:
        return like
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"hook '{_name(hook)}' returned {type(result).__name__}, expected a Tensor or None")
    if tuple(result.shape) != tuple(like.shape):
        raise RuntimeError(f"hook '{_name(hook)}' has changed the size of value")
    if type(result) is Sharded and result._splits == like._splits and result._group == like._group:
        return result
    full = materialize(result)
    firsts, group = starts(like._splits), like._group
    pieces = [
        group.place(full.narrow(0, firsts[part], like._splits[part]), piece)
        for part, piece in zip(group.held, like._pieces)
    ]
    return Sharded(pieces, like._splits, group)


# --- several pieces, not used yet: the tie ---------------------------------------------------------------------------


class _Tie:
    """The one node a hooked value's later uses go through (see the module doc)."""

    def __init__(self, value: Sharded, site: str) -> None:
        self.splits, self.group, self.site = value._splits, value._group, site
        self.hooks: dict[int, tuple[Hook, str]] = {}
        self._keys = itertools.count()
        old = value._pieces
        self.given: list[torch.Tensor | None] = [None] * len(old)
        """What the last backward gave each old piece, until the piece's check reads it."""
        value._pieces = tuple(_TieFunction.apply(self, *old))
        if value._holders is None:
            value._holders = old
        value._tie = self
        for index, piece in enumerate(old):
            if piece.requires_grad:
                TORCH_REGISTER_HOOK(piece, self._check(index))

    def add(self, hook: Hook, site: str) -> Handle:
        key = next(self._keys)
        self.hooks[key] = (hook, site)

        def remove() -> None:
            self.hooks.pop(key, None)

        return Handle([], remove)

    def backward(self, gradients: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        whole = Sharded(list(gradients), self.splits, self.group)
        for hook, _ in list(self.hooks.values()):
            whole = as_gradient(hook(whole), whole, hook)
        self.given = list(whole._pieces)
        return tuple(whole._pieces)

    def _check(self, index: int) -> Hook:
        def check(gradient: torch.Tensor) -> None:
            given, self.given[index] = self.given[index], None
            if given is None or not (gradient is given or torch.equal(gradient, given)):
                raise RuntimeError(
                    f"mgpu_runtime: the gradient hook registered at {self.site} saw only part of its value's gradient: "
                    "the value was used, before the hook was registered, in a way the runtime did not notice, and "
                    "that use's gradient reached the value without passing the hook, as it did under DataParallel. "
                    "Register the hook right after the value is computed; and please report this, with that line."
                )

        return check


class _TieFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tie: _Tie, *pieces: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.tie = tie
        return tuple(piece.clone() for piece in pieces)

    @staticmethod
    def backward(ctx: Any, *gradients: torch.Tensor) -> tuple[Any, ...]:
        return (None, *ctx.tie.backward(gradients))


# --- several pieces, already used: piece by piece --------------------------------------------------------------------


class _OnePart(Group):
    """The group of one replica's piece of a gradient whose other pieces are not here: every question that needs
    the other rows is refused, naming the hook's line."""

    seed_scale = 1.0

    def __init__(self, whole: Group, index: int, site: str) -> None:
        self.whole, self.index, self.site = whole, index, site
        self.parts = whole.parts
        self.held = (whole.held[index],)
        self.device = whole.device

    def _refused(self, what: str) -> RuntimeError:
        return RuntimeError(
            f"mgpu_runtime: the gradient hook registered at {self.site} needs {what}; its value was used before the "
            "hook was registered, so each replica's rows of the gradient arrive on their own and the hook can only "
            "be run on one replica's rows at a time (exact for element-wise and row-wise hooks). Register the hook "
            "right after the value is computed, before any use of it: then it is given the whole gradient."
        )

    def sum(self, *quantities: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        raise self._refused("a sum over the rows of the gradient")

    def concatenate(self, pieces: Sequence[torch.Tensor], splits: Sequence[int]) -> torch.Tensor:
        raise self._refused("the whole gradient (an operation across its rows, or its values)")

    def row_counts(self, rows: Sequence[int]) -> tuple[int, ...]:
        raise self._refused("the rows the gradient's other pieces select")

    def objects(self, pieces: Sequence[list[Any]]) -> list[Any]:
        raise self._refused("the gradient's other rows")

    def row_table(self, rows: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
        raise self._refused("the rows the gradient's other pieces select")

    def place(self, value: torch.Tensor, piece: torch.Tensor) -> torch.Tensor:
        return self.whole.place(value, piece)

    def place_on(self, value: torch.Tensor, index: int) -> torch.Tensor:
        return self.whole.place_on(value, self.index)


class _PieceByPiece:
    """A hook on each piece of a value already used: run once per backward, replayed on the other pieces."""

    def __init__(self, value: Sharded, hook: Hook, site: str) -> None:
        self.hook, self.site = hook, site
        self.splits, self.group = value._splits, value._group
        hooked = [index for index, piece in enumerate(value._pieces) if piece.requires_grad]
        self.count = len(hooked)
        self.tapes: dict[int, _Tape] = {}
        """The recording of the current backward (by autograd's graph task), until every piece has had it."""
        self._lock = threading.Lock()  # autograd may reach the pieces from the devices' threads at once
        self.handle = Handle([TORCH_REGISTER_HOOK(value._pieces[index], self._piece_hook(index)) for index in hooked])

    def _piece_hook(self, index: int) -> Hook:
        def piece_hook(gradient: torch.Tensor) -> torch.Tensor | None:
            with self._lock:
                task = torch._C._current_graph_task_id()
                part = _OnePart(self.group, index, self.site)
                view = Sharded([gradient], self.splits, part)
                tape = self.tapes.get(task)
                if tape is None:
                    tape = _Tape()
                    self.tapes = {task: tape}  # a backward that never reached every piece is over
                    result = tape.record(self.hook, view, part)
                else:
                    result = tape.replay(view, part)
                tape.served += 1
                if tape.served == self.count:
                    self.tapes.pop(task, None)
                    tape.complete(self.group)
                return None if result is None else as_gradient(result, view, self.hook)._pieces[0]

        return piece_hook


class _Tape:
    """The torch operations of one hook call on one piece's gradient, to replay on another piece's. The values
    the call made on its piece's rows (the gradient it was given too) are made whole once every piece has been
    replayed: a value the hook kept (``grads.append(grad)``) is the whole global value after the backward."""

    def __init__(self) -> None:
        self.steps: list[tuple[Rule, Callable, tuple, dict, Any]] = []
        self.origin: Sharded | None = None
        self.output: Any = None
        self.served = 0
        self.pieces: dict[int, tuple[Sharded, dict[int, torch.Tensor]]] = {}
        """For each value the call made on its piece's rows: the value, and its piece of each part's rows."""

    def record(self, hook: Hook, view: Sharded, part: _OnePart) -> Any:
        self.origin = view
        self.keep(view, view, part)
        call = _PieceCall(part, self)
        previous, CALLS.piece = CALLS.piece, call
        try:
            self.output = hook(view)
        finally:
            CALLS.piece = previous
        return self.output

    def replay(self, view: Sharded, part: _OnePart) -> Any:
        seen: dict[int, Any] = {id(self.origin): view}
        self.keep(self.origin, view, part)
        for rule, func, args, kwargs, result in self.steps:
            replayed = rule(func, _substitute(args, seen, part), _substitute(kwargs, seen, part))
            _bind(result, replayed, seen)
            self.keep(result, replayed, part)
        return _substitute(self.output, seen, part)

    def keep(self, recorded: Any, made: Any, part: _OnePart) -> None:
        if type(recorded) is Sharded:
            if type(made) is Sharded and made._group is part and type(recorded._group) is _OnePart:
                self.pieces.setdefault(id(recorded), (recorded, {}))[1][part.index] = made._pieces[0]
        elif isinstance(recorded, (tuple, list)) and isinstance(made, (tuple, list)):
            for old, new in zip(recorded, made):
                self.keep(old, new, part)

    def complete(self, whole: Group) -> None:
        for value, pieces in self.pieces.values():
            if len(pieces) == len(whole.held):
                value._pieces = tuple(pieces[index] for index in range(len(whole.held)))
                value._group = whole


class _PieceCall:
    """A hook running on one piece's gradient: each top-level torch operation is run with the loop's own global
    values cut to this piece's rows, and recorded."""

    def __init__(self, part: _OnePart, tape: _Tape) -> None:
        self.part, self.tape, self.depth = part, tape, 0

    def apply(self, rule: Rule, func: Callable, args: tuple, kwargs: dict) -> Any:
        self.depth += 1
        try:
            result = rule(func, _substitute(args, {}, self.part), _substitute(kwargs, {}, self.part))
        finally:
            self.depth -= 1
        self.tape.steps.append((rule, func, args, kwargs, result))
        self.tape.keep(result, result, self.part)
        return result


def _substitute(value: Any, seen: dict[int, Any], part: _OnePart) -> Any:
    """``value`` for ``part``'s piece: a recorded result as replayed, a global value of the loop held like the
    gradient as its piece of ``part``'s rows."""
    if type(value) is Sharded:
        found = seen.get(id(value))
        if found is not None:
            return found
        whole = part.whole
        if value._group == whole and len(value._pieces) == len(whole.held):
            return Sharded([value._pieces[part.index]], value._splits, part)
        if type(value._group) is _OnePart and value._group is not part:
            raise RuntimeError(f"mgpu_runtime: the gradient hook registered at {part.site} keeps a value of another "
                               "replica's gradient; it cannot be run on each replica's rows. Please report this.")
        return value
    if type(value) in (list, tuple):
        return type(value)(_substitute(item, seen, part) for item in value)
    if type(value) is dict:
        return {key: _substitute(item, seen, part) for key, item in value.items()}
    return value


def _bind(recorded: Any, replayed: Any, seen: dict[int, Any]) -> None:
    if type(recorded) is Sharded:
        seen[id(recorded)] = replayed
    elif isinstance(recorded, (tuple, list)) and isinstance(replayed, (tuple, list)):
        for old, new in zip(recorded, replayed):
            _bind(old, new, seen)


def _name(hook: Hook) -> str:
    return getattr(hook, "__name__", type(hook).__name__)


def _site() -> str:
    """``FILE:LINE`` of the script's statement that registers the hook (past torch's and the runtime's frames)."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
        frame = frame.f_back
    return "an unknown line" if frame is None else f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
