"""How each torch operation on ``Sharded`` values is computed: on the pieces, as a collective, or materialised.

``apply`` is the whole entry point. Each torch function is classified once (``_classify``, cached by
function) into one rule:

* **metadata** (``shape``, ``size()``, ``numel()``, ``len()`` ...): the global value's, without communication;
* **per piece**: element-wise operations (torch's own ``pointwise`` tag, with broadcasting: a plain
  operand whose first dimension is the batch's rows is cut like the batch), conversions (``.to``,
  ``.float()``, ``.detach()``), operations along other dimensions (``softmax(1)``, ``sum(-1)``, ``topk`` over
  classes, ``cat`` on ``dim=1``), row-wise layers (``F.linear``, convolutions, pooling, ``F.embedding``),
  reshapes that keep each part's rows whole (``view(-1, C)``), indexing of other dimensions or by a mask
  of the same rows, matrix products with the batch on the outside;
* **over the rows**: ``sum``, ``mean``, ``amax``/``amin``, ``max``/``min``, ``any``/``all``,
  ``count_nonzero`` over all elements or dimension 0: partial results per piece, combined by the group;
  torch's loss functions (``loss_rules.py``);
* **materialised** (everything else): every ``Sharded`` argument becomes its global tensor (differentiably,
  the same on every process), and the operation runs on plain tensors. An in-place operation on a ``Sharded``
  value done this way writes back: the value's pieces become its rows of the result. So does a custom
  ``torch.autograd.Function`` of the script's (a loss with its backward written by hand): its ``apply`` never
  asks ``__torch_function__``, so ``_custom_functions_materialize`` gives it the global tensors first.

A rule never decides by what one process holds (the rows of its own piece): only by global facts (shapes,
splits, dtypes), which every process knows alike, so every process takes the same path and meets the same
collectives.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from mgpu_runtime.sharded import hooks
from mgpu_runtime.sharded.groups import RankGroup, starts
from mgpu_runtime.sharded.tensor import Sharded, adopt_requires_grad, materialize, sync_viewed
from mgpu_runtime.structure import children, rebuild

Rule = Callable[[Callable, tuple, dict], Any]
_RULES: dict[Any, Rule] = {}
_autograd_backward = torch.autograd.backward
_autograd_grad = torch.autograd.grad


def apply(func: Callable, args: tuple, kwargs: dict) -> Any:
    """The result of ``func(*args, **kwargs)`` where some argument is ``Sharded``."""
    rule = _RULES.get(func)
    if rule is None:
        rule = _RULES[func] = _classify(func)
    call = hooks.CALLS.piece
    if call is not None and call.depth == 0:
        return call.apply(rule, func, args, kwargs)  # a gradient hook run on one piece (hooks.py)
    for value in args:
        if type(value) is Sharded and value._viewed is not None:
            sync_viewed(value)  # a view an indexing gave was changed in place (``x[n][p] += d``)
    if rule not in _NOT_USES and torch.is_grad_enabled():
        _note_uses(args, kwargs)
    return rule(func, args, kwargs)


def _note_uses(args: tuple, kwargs: dict) -> None:
    """The Sharded arguments went into a computation that autograd may record (``hooks.py`` asks)."""
    for value in (*args, *kwargs.values()) if kwargs else args:
        if type(value) is Sharded:
            value._used = True
            if value._legacy_leaf:
                adopt_requires_grad(value)
        elif type(value) in (list, tuple):
            for part in value:
                if type(part) is Sharded:
                    part._used = True
                    if part._legacy_leaf:
                        adopt_requires_grad(part)


# --- finding the Sharded arguments --------------------------------------------------------------------------


def _sharded_in(values: Sequence[Any]) -> list[Sharded]:
    found = []
    for value in values:
        if type(value) is Sharded:
            found.append(value)
        elif type(value) in (list, tuple):
            found.extend(part for part in value if type(part) is Sharded)
    return found


def _reference(args: tuple, kwargs: dict) -> Sharded | None:
    """The Sharded argument every other one must line up with; None when they do not all line up."""
    found = _sharded_in(args) + _sharded_in(list(kwargs.values()))
    first = found[0]
    for other in found[1:]:
        if other._splits != first._splits or other._group != first._group:
            return None
    return first


def _name(func: Any) -> str:
    owner = getattr(func, "__self__", None)
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__") and owner is not None:
        return getattr(owner, "__name__", "")
    return name


# --- building results -----------------------------------------------------------------------------------------


def _wrap(results: list[Any], splits: Sequence[int], reference: Sharded) -> Any:
    """One value from the per-piece results: tensors (also inside tuples and namedtuples) become Sharded."""
    first = results[0]
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:
            return first  # a piece's scalar (a flag, a count): the same on every piece by construction
        return Sharded(results, splits, reference._group)
    parts = children(first) if isinstance(first, tuple) else None
    if parts is None:
        return first
    per_piece = [children(result) or [] for result in results]
    return rebuild(first, [_wrap([piece[index] for piece in per_piece], splits, reference) for index in range(len(parts))])


def _operand(value: Any, index: int, reference: Sharded, split: bool, ndim: int) -> Any:
    """``value`` as the ``index``-th held piece's operation sees it: its piece if Sharded, its rows of that
    piece if it is a plain tensor cut like the batch (``split``: the batch's rows on its first dimension,
    aligned by broadcasting), else itself (placed beside the piece). A plain tensor of one row beside a batch of
    one row is cut too: the piece holding that row gets it whole either way, and a piece past it (a rank that
    DataParallel ran nothing on) gets no rows, which is what broadcasting gives an element-wise operation and
    what a loss's target, ``gather``'s index or ``cat``'s other operand must be (an evaluation loader's last
    batch of one row crashed the empty rank's ``cross_entropy``)."""
    if type(value) is Sharded:
        return value._pieces[index]
    if isinstance(value, torch.Tensor):
        piece = reference._pieces[index]
        rows = sum(reference._splits)
        if split and value.dim() == ndim and ndim > 0 and value.shape[0] == rows:
            start, count = reference.rows_of_part(reference._group.held[index])
            value = value.narrow(0, start, count)
        reference._group.note_mixing(value)
        return reference._group.place(value, piece)
    if type(value) in (list, tuple):
        return type(value)(_operand(part, index, reference, split, ndim) for part in value)
    return value


def _per_piece(
    func: Callable,
    args: tuple,
    kwargs: dict,
    reference: Sharded,
    split: bool = True,
    splits: Sequence[int] | None = None,
    local: Callable[[int], tuple[tuple, dict]] | None = None,
    ndim: int | None = None,
) -> Any:
    """``func`` on each held piece (plain operands cut or placed, see ``_operand``); the results wrapped with
    ``splits`` (default: the reference's). ``local(index)`` gives a piece's own arguments instead; ``ndim`` is
    the result's dimensions, when the caller knows them."""
    if ndim is None and local is None:
        ndim = max((value.dim() for value in _tensors(args, kwargs)), default=0)
    results = []
    for index in range(len(reference._pieces)):
        if local is not None:
            piece_args, piece_kwargs = local(index)
        else:
            width = ndim or 0
            piece_args = tuple(_operand(value, index, reference, split, width) for value in args)
            piece_kwargs = {name: _operand(value, index, reference, split, width) for name, value in kwargs.items()}
        results.append(func(*piece_args, **piece_kwargs))
    return _wrap(results, reference._splits if splits is None else splits, reference)


def _tensors(args: tuple, kwargs: dict):
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif type(value) in (list, tuple):
            yield from (part for part in value if isinstance(part, torch.Tensor))


@functools.cache
def _in_place(func: Callable) -> bool:
    name = _name(func)
    return (name.endswith("_") and not name.endswith("__")) or name in _IN_PLACE_DUNDERS


_IN_PLACE_DUNDERS = frozenset(
    f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift", "matmul")
)


# --- the materialising fallback ---------------------------------------------------------------------------------


def _materialized(func: Callable, args: tuple, kwargs: dict) -> Any:
    """``func`` on the global tensors; an in-place change of a Sharded value (or ``out=``) is written back."""
    target = args[0] if args and type(args[0]) is Sharded and _in_place(func) else kwargs.get("out")
    plain_args, plain_kwargs = materialize(args), materialize(kwargs)
    result = func(*plain_args, **plain_kwargs)
    if type(target) is Sharded:
        full = plain_args[0] if target is (args[0] if args else None) else plain_kwargs["out"]
        _write_back(target, full)
        return target
    return result


def _write_back(target: Sharded, full: torch.Tensor) -> None:
    """After an in-place change of ``target``'s global tensor ``full``: its pieces are its rows of ``full``."""
    held = target._group.held
    firsts = starts(target._splits)
    target._group.note_mixing(full)
    target._pieces = tuple(
        target._group.place(full.narrow(0, firsts[part], target._splits[part]), piece)
        for part, piece in zip(held, target._pieces)
    )


def _materialize_rule(func: Callable, args: tuple, kwargs: dict) -> Any:
    return _materialized(func, args, kwargs)


# --- metadata ------------------------------------------------------------------------------------------------------


def _global_size(value: Sharded) -> torch.Size:
    return torch.Size((sum(value._splits), *value._pieces[0].shape[1:]))


def _size(func, args, kwargs):
    size = _global_size(args[0])
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    return size if dim is None else size[dim]


def _numel(func, args, kwargs):
    return math.prod(_global_size(args[0]))


def _len(func, args, kwargs):
    return sum(args[0]._splits)


def _first_piece(func, args, kwargs):
    """Metadata every piece shares (dtype, dimensions, layout, whether it is floating point)."""
    return func(args[0]._pieces[0], *args[1:], **kwargs)


def _device(func, args, kwargs):
    value = args[0]
    devices = {piece.device for piece in value._pieces}
    return value._pieces[0].device if len(devices) == 1 else value._group.device


def _requires_grad(func, args, kwargs):
    return any(piece.requires_grad for piece in args[0]._pieces)


def _is_leaf(func, args, kwargs):
    return all(piece.is_leaf for piece in hooks.holders(args[0]))


def _grad_fn(func, args, kwargs):
    return next((piece.grad_fn for piece in hooks.holders(args[0]) if piece.grad_fn is not None), None)


def _gradient_property(func, args, kwargs):
    """``x.grad``: each piece's gradient (after the value's hooks), as a Sharded value (None until every piece has
    one)."""
    value = args[0]
    gradients = [piece.grad for piece in hooks.holders(value)]
    if any(gradient is None for gradient in gradients):
        return None
    return Sharded(gradients, value._splits, value._group)


def _set_on_pieces(func, args, kwargs):
    """A setter (``x.requires_grad = True``, ``x.grad = None``) applied to every piece (``grad``: to the tensors
    that hold the value's gradient)."""
    value, new = args
    targets = hooks.holders(value) if _name(func) == "grad" else value._pieces
    for index, piece in enumerate(targets):
        func(piece, new._pieces[index] if type(new) is Sharded else new)


def _stride(func, args, kwargs):
    size = _global_size(args[0])
    strides = [1] * len(size)
    for index in range(len(size) - 2, -1, -1):
        strides[index] = strides[index + 1] * max(size[index + 1], 1)
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    return tuple(strides) if dim is None else strides[dim]


def _hash(func, args, kwargs):
    return id(args[0])


_METADATA: dict[str, Rule] = {
    "size": _size,
    "shape": lambda func, args, kwargs: _global_size(args[0]),
    "numel": _numel,
    "nelement": _numel,
    "__len__": _len,
    "stride": _stride,
    "device": _device,
    "requires_grad": _requires_grad,
    "is_leaf": _is_leaf,
    "grad_fn": _grad_fn,
    "__hash__": _hash,
}
_FIRST_PIECE = frozenset(
    {
        "dim", "ndim", "ndimension", "dtype", "layout", "is_floating_point", "is_complex", "is_signed",
        "element_size", "is_cuda", "is_cpu", "is_sparse", "is_quantized", "is_meta", "is_mps", "is_xpu",
        "is_contiguous", "is_pinned", "is_shared", "is_nested", "is_mkldnn", "names", "itemsize",
        "get_device", "type", "is_inference", "_version",
    }
)


# --- per piece ----------------------------------------------------------------------------------------------------


def _pointwise(func, args, kwargs):
    """Element-wise, broadcasting: Sharded operands must be cut alike and hold the batch on the result's first
    dimension; a plain operand with the batch's rows there is cut like them."""
    if "out" in kwargs:
        return _materialized(func, args, kwargs)
    found = _sharded_in(args) + _sharded_in(list(kwargs.values())) if kwargs else _sharded_in(args)
    reference = found[0]
    ndim = max(value.dim() for value in _tensors(args, kwargs))
    for other in found:
        if other._splits != reference._splits or other._group != reference._group or other.dim() != ndim:
            return _materialized(func, args, kwargs)
    if _in_place(func):
        target = args[0]
        if type(target) is not Sharded:
            return _materialized(func, args, kwargs)  # a plain tensor changed by a global value
        _per_piece(func, args, kwargs, reference, ndim=ndim)
        return target
    return _per_piece(func, args, kwargs, reference, ndim=ndim)


def _conversion(func, args, kwargs):
    """``.to()``, ``.float()``, ``.detach()``, ``.clone()``...: each piece converted; a Sharded argument other than
    the value (``x.to(other)``, ``x.type_as(other)``) stands for its dtype and device. A conversion that changes
    nothing gives the value itself, as torch gives ``x`` for ``x.float()`` of a float ``x`` (so it is one value
    for its gradient hooks too)."""
    value = args[0]
    if type(value) is not Sharded:
        return func(*materialize(args), **materialize(kwargs))

    def local(index: int) -> tuple[tuple, dict]:
        rest = tuple(other._pieces[0] if type(other) is Sharded else other for other in args[1:])
        return (value._pieces[index], *rest), {k: v._pieces[0] if type(v) is Sharded else v for k, v in kwargs.items()}

    result = _per_piece(func, args, kwargs, value, local=local)
    if _in_place(func) or type(result) is Sharded and all(new is old for new, old in zip(result._pieces, value._pieces)):
        return value
    return result


def _row_wise(func, args, kwargs):
    """Layers that compute each row on its own (``F.linear``, convolutions, pooling, ``F.embedding``): Sharded
    arguments must be cut alike; plain ones (weights, biases) are every piece's."""
    reference = _reference(args, kwargs)
    if reference is None:
        return _materialized(func, args, kwargs)
    return _per_piece(func, args, kwargs, reference, split=False)


def _row_paired(func, args, kwargs):
    """Layers of two operands cut like the batch, each row with its own (``F.grid_sample(input, grid)``,
    ``F.bilinear``, ``F.pairwise_distance``): a plain operand with the batch's rows is cut to each piece's rows,
    as the piece of the other is (SfmLearner's warp samples the loader's whole reference images at a grid computed
    from the model's output); the rest (a weight, a one-row operand that broadcasts) is every piece's."""
    reference = _reference(args, kwargs)
    if reference is None:
        return _materialized(func, args, kwargs)
    rows = sum(reference._splits)

    def operand(value: Any, index: int, paired: bool) -> Any:
        if paired and isinstance(value, torch.Tensor) and type(value) is not Sharded and value.dim() > 0 and value.shape[0] == rows:
            start, count = reference.rows_of_part(reference._group.held[index])
            value = value.narrow(0, start, count)
        return _operand(value, index, reference, False, 0)

    def local(index: int) -> tuple[tuple, dict]:
        piece_args = tuple(operand(value, index, position < 2) for position, value in enumerate(args))
        piece_kwargs = {name: operand(value, index, name in _PAIRED_OPERANDS) for name, value in kwargs.items()}
        return piece_args, piece_kwargs

    return _per_piece(func, args, kwargs, reference, local=local)


def _new_factory(func, args, kwargs):
    """``x.new_zeros(size)`` ...: a plain tensor of the given size, with the value's dtype and device."""
    return func(args[0]._pieces[0], *materialize(args[1:]), **materialize(kwargs))


def _like_factory(func, args, kwargs):
    """``torch.zeros_like(x)`` ...: the same on each piece."""
    value = args[0]
    if type(value) is not Sharded:
        return _materialized(func, args, kwargs)
    return _per_piece(func, args, kwargs, value, split=False)


def _random_like(func, args, kwargs):
    """``torch.rand_like(x)`` ...: drawn for the global shape exactly as the original drew it (every process's
    generator is the original's outside the model), then cut like ``x``."""
    value = args[0]
    if type(value) is not Sharded:
        return _materialized(func, args, kwargs)
    template = torch.empty(_global_size(value), dtype=value._pieces[0].dtype, device=value._pieces[0].device)
    group = value._group
    if template.is_cuda and isinstance(group, RankGroup) and group.parts > 1:
        group.take_rank_zero_stream(template.device)
    drawn = func(template, *materialize(args[1:]), **materialize(kwargs))
    firsts = starts(value._splits)
    pieces = [
        value._group.place(drawn.narrow(0, firsts[part], value._splits[part]), piece)
        for part, piece in zip(value._group.held, value._pieces)
    ]
    return Sharded(pieces, value._splits, value._group)


# --- along a dimension ---------------------------------------------------------------------------------------------

_ALL = object()
"""A reduction's default: every dimension."""
_REQUIRED = object()


def _dims(value: Any, ndim: int) -> tuple[int, ...] | None:
    """The dimensions a ``dim`` argument names, normalised; None for "every dimension"."""
    if value is None or value is _ALL:
        return None
    if isinstance(value, (list, tuple)):
        if not value:
            return None
        return tuple(dim % ndim if ndim else 0 for dim in value)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return (value % ndim if ndim else 0,)
    return ()  # a name (named tensors) or something else: no batch dimension assumed... materialise below


class _Along:
    """An operation along ``dim`` (position ``at`` in the arguments, or the keyword ``name``)."""

    def __init__(self, at: int, name: str = "dim", default: Any = _REQUIRED, over_rows: Rule | None = None,
                 result_ndim_offset: int = 0) -> None:
        self.at, self.name, self.default, self.over_rows = at, name, default, over_rows
        self.offset = result_ndim_offset
        """For ``stack`` and ``unsqueeze``: the dimension is one of the result's, which has one more."""

    def __call__(self, func, args, kwargs):
        reference = _reference(args, kwargs)
        if reference is None or (_in_place(func) and args and type(args[0]) is not Sharded):
            # A plain tensor changed by a global value (erfnet's one-hot of the argmax, `torch.zeros(n, c).scatter_(1,
            # pred, 1)`): cut like the batch, only this process's rows of it would be written.
            return _materialized(func, args, kwargs)
        given = args[self.at] if len(args) > self.at else kwargs.get(self.name, self.default)
        if given is _REQUIRED:
            return _materialized(func, args, kwargs)  # torch's own error, or a form this rule does not know
        ndim = reference.dim() + self.offset
        dims = _dims(given, ndim)
        if dims is not None and dims and 0 not in dims:
            return _per_piece(func, args, kwargs, reference)
        if self.over_rows is not None:
            return self.over_rows(func, args, kwargs)
        return _materialized(func, args, kwargs)


# --- over the rows -------------------------------------------------------------------------------------------------


def _reduction_dims(func, args, kwargs) -> tuple[Sharded, Any, bool, dict]:
    value = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    rest = {k: v for k, v in kwargs.items() if k not in ("dim", "keepdim")}
    return value, dim, keepdim, rest


def _sum_over_rows(func, args, kwargs):
    value, dim, keepdim, rest = _reduction_dims(func, args, kwargs)
    if type(value) is not Sharded or len(args) > 3 or set(rest) - {"dtype"}:
        return _materialized(func, args, kwargs)
    if dim is None:
        partials = [piece.sum(**rest) for piece in value._pieces]
    else:
        partials = [piece.sum(dim, keepdim=keepdim, **rest) for piece in value._pieces]
    (total,) = value._group.sum(partials)
    return total


def _mean_over_rows(func, args, kwargs):
    value, dim, keepdim, rest = _reduction_dims(func, args, kwargs)
    dtype = rest.get("dtype")
    floating = value._pieces[0].is_floating_point() or value._pieces[0].is_complex()
    if type(value) is not Sharded or len(args) > 3 or set(rest) - {"dtype"} or not (floating or dtype is not None):
        return _materialized(func, args, kwargs)
    size = _global_size(value)
    dims = _dims(dim, len(size))
    count = math.prod(size) if dims is None else math.prod(size[d] for d in dims)
    total = _sum_over_rows(torch.sum, args, kwargs)
    return total / count


def _combined(reduce: Callable[..., Any], fill: Callable[[torch.Tensor], float]) -> Rule:
    """A reduction that is its own combination (max of maxima, any of anys): each piece's result (keeping the
    reduced dimensions), gathered over the parts, reduced again as the caller asked. An empty piece takes part
    with ``fill`` (the reduction's identity), as torch refuses to reduce no elements."""

    def rule(func, args, kwargs):
        value, dim, keepdim, rest = _reduction_dims(func, args, kwargs)
        if type(value) is not Sharded or len(args) > 3 or rest:
            return _materialized(func, args, kwargs)
        ndim = value.dim()
        dims = tuple(range(ndim)) if _dims(dim, ndim) is None else _dims(dim, ndim)
        partials = []
        for part, piece in zip(value._group.held, value._pieces):
            if value._splits[part]:
                partial = reduce(piece, dims, True)
            elif piece.is_floating_point():
                # Derived from the piece, so that it takes part in autograd as the other ranks' partials do: a
                # collective's backward must run on every rank or on none.
                partial = piece.sum(dims, keepdim=True) * 0 + fill(piece)
            else:
                shape = [1 if d in dims else size for d, size in enumerate(piece.shape)]
                partial = torch.full(shape, fill(piece), dtype=piece.dtype, device=piece.device)
            partials.append(partial)
        gathered = value._group.concatenate(partials, [1] * value._group.parts)
        combined = reduce(gathered, dims, True)
        if dim is None and not keepdim:
            return combined.reshape(())
        return combined if keepdim else combined.squeeze(dims)

    return rule


def _extreme(largest: bool) -> Callable[[torch.Tensor], float]:
    def fill(piece: torch.Tensor) -> float:
        if piece.is_floating_point():
            return -math.inf if largest else math.inf
        if piece.dtype == torch.bool:
            return not largest
        info = torch.iinfo(piece.dtype)
        return info.min if largest else info.max

    return fill


_amax = _combined(lambda t, dims, keep: t.amax(dims, keepdim=keep), _extreme(True))
_amin = _combined(lambda t, dims, keep: t.amin(dims, keepdim=keep), _extreme(False))
_any = _combined(lambda t, dims, keep: t.any(dims, keepdim=keep), lambda piece: False)
_all = _combined(lambda t, dims, keep: t.all(dims, keepdim=keep), lambda piece: True)


def _max_or_min(largest: bool) -> Rule:
    """``max``/``min``: of two tensors element-wise; of all elements a collective; along a dimension per piece."""
    extreme = _amax if largest else _amin

    def rule(func, args, kwargs):
        other = args[1] if len(args) > 1 else kwargs.get("other")
        if isinstance(other, torch.Tensor):
            return _pointwise(func, args, kwargs)
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if dim is None:
            return extreme(func, args[:1], {})
        return _Along(1)(func, args, kwargs)

    return rule


def _count_nonzero(func, args, kwargs):
    value = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    dims = _dims(dim, value.dim())
    if dims is not None and 0 not in dims:
        return _per_piece(func, args, kwargs, value)
    partials = [func(piece, dim) if dim is not None else func(piece) for piece in value._pieces]
    (total,) = value._group.sum(partials)
    return total


# --- shapes ------------------------------------------------------------------------------------------------------


def _shape_argument(args: tuple, kwargs: dict, name: str = "size") -> list[int] | None:
    given = args[1:] if len(args) > 1 else (kwargs[name],) if name in kwargs else ()
    if len(given) == 1 and isinstance(given[0], (list, tuple, torch.Size)):
        given = tuple(given[0])
    if not all(isinstance(size, int) and not isinstance(size, bool) for size in given):
        return None
    return list(given)


def _reshaped(func, args, kwargs, target: list[int] | None, local_call: Callable[[torch.Tensor, list[int]], Any]):
    """A reshape to the global ``target``: each part keeps its rows whole when its elements fill whole rows of
    the target (``view(-1, C)`` of a ``(B, T, C)`` batch: ``b * T`` rows each); else the value is materialised."""
    value = args[0]
    if target is None or type(value) is not Sharded:
        return _materialized(func, args, kwargs)
    size = _global_size(value)
    total = math.prod(size)
    if target.count(-1) == 1:
        known = math.prod(s for s in target if s != -1)
        if known == 0 or total % known:
            return _materialized(func, args, kwargs)
        target = [total // known if s == -1 else s for s in target]
    if not target or math.prod(target) != total or -1 in target:
        return _materialized(func, args, kwargs)
    row = math.prod(size[1:])
    new_row = math.prod(target[1:])
    if new_row == 0 or any((rows * row) % new_row for rows in value._splits):
        return _materialized(func, args, kwargs)
    splits = [rows * row // new_row for rows in value._splits]
    pieces = [
        local_call(piece, [splits[part], *target[1:]]) for part, piece in zip(value._group.held, value._pieces)
    ]
    return Sharded(pieces, splits, value._group)


def _view_or_reshape(func, args, kwargs):
    if len(args) == 2 and isinstance(args[1], torch.dtype) or "dtype" in kwargs:
        return _conversion(func, args, kwargs)
    return _reshaped(func, args, kwargs, _shape_argument(args, kwargs, "shape" if "shape" in kwargs else "size"),
                     lambda piece, shape: func(piece, shape))


def _as_other(func, args, kwargs):
    """``view_as``/``reshape_as``/``expand_as`` another tensor's global shape."""
    value, other = args[0], args[1] if len(args) > 1 else kwargs["other"]
    shape = list(_global_size(other)) if type(other) is Sharded else list(other.shape)
    base = {"view_as": torch.Tensor.view, "reshape_as": torch.Tensor.reshape, "expand_as": torch.Tensor.expand}[_name(func)]
    if type(value) is not Sharded:
        # A plain value shaped like a global one (WaveRNN's `y.expand_as(means)`): the plain tensor of that shape.
        return base(value, shape)
    return apply(base, (value, shape), {})


def _flatten(func, args, kwargs):
    value = args[0]
    start = args[1] if len(args) > 1 else kwargs.get("start_dim", 0)
    end = args[2] if len(args) > 2 else kwargs.get("end_dim", -1)
    ndim = value.dim()
    if ndim == 0 or not isinstance(start, int):
        return _materialized(func, args, kwargs)
    start, end = start % ndim, end % ndim
    if start > 0:
        return _per_piece(func, args, kwargs, value)
    size = _global_size(value)
    return _reshaped(func, args, kwargs, [-1, *size[end + 1 :]], lambda piece, shape: piece.reshape(shape))


def _squeeze(func, args, kwargs):
    value = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    size = _global_size(value)
    dims = tuple(d for d, s in enumerate(size) if s == 1) if dim is None else _dims(dim, len(size))
    if dims is None or 0 in dims and size[0] == 1:
        return _materialized(func, args, kwargs)
    dims = tuple(d for d in dims if d != 0 and size[d] == 1)  # squeezing a dimension that is not 1 is no change
    return _per_piece(lambda piece: piece.squeeze(dims) if dims else piece.view(piece.shape), (value,), {}, value)


def _unsqueeze(func, args, kwargs):
    value = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if not isinstance(dim, int) or dim % (value.dim() + 1) == 0:
        return _materialized(func, args, kwargs)
    return _per_piece(func, args, kwargs, value, split=False)


def _expand(func, args, kwargs):
    value = args[0]
    sizes = _shape_argument(args, kwargs)
    if sizes is None or len(sizes) != value.dim() or sizes[0] not in (-1, sum(value._splits)):
        return _materialized(func, args, kwargs)
    return _per_piece(lambda piece: piece.expand(-1, *sizes[1:]), (value,), {}, value)


def _repeat(func, args, kwargs):
    value = args[0]
    sizes = _shape_argument(args, kwargs, "repeats")
    if sizes is None or len(sizes) != value.dim() or sizes[0] != 1:
        return _materialized(func, args, kwargs)
    return _per_piece(lambda piece: piece.repeat(sizes), (value,), {}, value)


def _permute(func, args, kwargs):
    value = args[0]
    dims = _shape_argument(args, kwargs, "dims")
    if dims is None or not dims or dims[0] % value.dim() != 0:
        return _materialized(func, args, kwargs)
    return _per_piece(func, args, kwargs, value, split=False)


def _transpose(func, args, kwargs):
    value = args[0]
    ndim = value.dim()
    names = ("dim0", "dim1")
    dims = [args[1 + i] if len(args) > 1 + i else kwargs.get(names[i]) for i in range(2)]
    if not all(isinstance(d, int) for d in dims) or 0 in (d % ndim for d in dims):
        return _materialized(func, args, kwargs)
    return _per_piece(func, args, kwargs, value, split=False)


def _movedim(func, args, kwargs):
    value = args[0]
    ndim = value.dim()
    source = args[1] if len(args) > 1 else kwargs.get("source")
    destination = args[2] if len(args) > 2 else kwargs.get("destination")
    sources = [source] if isinstance(source, int) else list(source)
    destinations = [destination] if isinstance(destination, int) else list(destination)
    order = [None] * ndim
    for s, d in zip(sources, destinations):
        order[d % ndim] = s % ndim
    rest = iter(d for d in range(ndim) if d not in {s % ndim for s in sources})
    order = [next(rest) if o is None else o for o in order]
    if order[0] != 0:
        return _materialized(func, args, kwargs)
    return _per_piece(func, args, kwargs, value, split=False)


def _transposed_property(func, args, kwargs):
    value = args[0]
    name = _name(func)
    if value.dim() < 2 and name in ("T", "H", "t"):
        return value
    if name in ("mT", "mH") and value.dim() >= 3:
        return _per_piece(func, args, kwargs, value, split=False)
    return _materialized(func, args, kwargs)


def _cat(func, args, kwargs):
    tensors = args[0] if args else kwargs["tensors"]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    stack = _name(func) == "stack"
    if not tensors or not isinstance(dim, int) or "out" in kwargs:
        return _materialized(func, args, kwargs)
    reference = _reference((list(tensors),), {})
    ndim = max(t.dim() for t in tensors) + (1 if stack else 0)
    if reference is None or dim % ndim == 0 or any(t.dim() != reference.dim() for t in tensors):
        return _materialized(func, args, kwargs)
    return _per_piece(func, (list(tensors), dim), {}, reference)


def _chunks(func, args, kwargs):
    """``chunk``/``split``/``unbind``/``tensor_split`` along another dimension: a tuple of Sharded values."""
    dim_at = {"unbind": 1}.get(_name(func), 2)
    return _Along(dim_at, default=0)(func, args, kwargs)


# --- indexing -----------------------------------------------------------------------------------------------------


def _entries(key: Any) -> list[Any]:
    return list(key) if type(key) is tuple else [key]


def _advanced(entry: Any) -> bool:
    return isinstance(entry, (torch.Tensor, list, range)) and not isinstance(entry, bool)


def _batch_untouched(entries: list[Any], ndim: int) -> bool:
    """Whether an index leaves dimension 0 as it is (``x[:, 0]``, ``x[..., :5]``, ``x[:, None]``) and keeps it
    first in the result (advanced indices not split apart, which would move them to the front)."""
    if not entries:
        return True
    first = entries[0]
    if first is Ellipsis:
        consumed = sum(_consumes(entry) for entry in entries[1:])
        if ndim - consumed < 1:
            return False
    elif not (isinstance(first, slice) and first == slice(None)):
        return False
    positions = [position for position, entry in enumerate(entries) if _advanced(entry)]
    return not positions or positions == list(range(positions[0], positions[-1] + 1))


def _consumes(entry: Any) -> int:
    if entry is None or entry is Ellipsis:
        return 0
    if isinstance(entry, torch.Tensor) and entry.dtype == torch.bool:
        return max(entry.dim(), 1)
    return 1


def _is_row_range(entry: Any, rows: int) -> bool:
    """``torch.arange(B)`` or ``range(B)`` as the first index: every row in order (``x[torch.arange(n), y]``)."""
    if isinstance(entry, range):
        return entry == range(rows)
    if isinstance(entry, torch.Tensor) and type(entry) is not Sharded and entry.dim() == 1 and len(entry) == rows:
        if entry.is_floating_point() or entry.dtype == torch.bool:
            return False
        return bool((entry == torch.arange(rows, device=entry.device)).all())
    return False


def _getitem(func, args, kwargs):
    value, key = args
    if type(value) is not Sharded:
        return _materialized(func, args, kwargs)
    entries = _entries(key)
    rows = sum(value._splits)
    size = _global_size(value)
    ndim = len(size)
    if not _sharded_in(entries) and _batch_untouched(entries, ndim):
        return _per_piece(func, args, kwargs, value, split=False)
    first = entries[0] if entries else None
    if isinstance(first, torch.Tensor) and first.dtype == torch.bool and not _sharded_in(entries[1:]):
        mask = first
        if type(mask) is Sharded and (mask._splits, mask._group) != (value._splits, value._group):
            return _materialized(func, args, kwargs)
        if tuple(mask.shape) == tuple(size[: mask.dim()]) and all(entry == slice(None) for entry in entries[1:]):
            return _masked(value, mask, entries[1:])
    if _is_row_range(first, rows) and len(entries) == 2 and isinstance(entries[1], torch.Tensor):
        index = entries[1]
        aligned = type(index) is not Sharded or index._splits == value._splits
        if index.dim() == 1 and len(index) == rows and not index.is_floating_point() and aligned:
            return _per_piece(
                lambda piece, local: piece[torch.arange(len(piece), device=piece.device), local],
                (value, index), {}, value,
            )
    return _viewed(func, value, key)


def _viewed(func, value: Sharded, key: Any) -> Any:
    """``value[key]`` on the global tensor. Where torch gives a view (a row ``x[3]``, a slice of rows), a change
    in place through it reaches ``value`` (``Sharded._viewed``), as it reached the tensor DataParallel gathered."""
    full = materialize(value)
    result = func(full, materialize(key))
    if (
        isinstance(result, torch.Tensor)
        and isinstance(full, torch.Tensor)
        and result._is_view()
        and result.untyped_storage().data_ptr() == full.untyped_storage().data_ptr()
    ):
        value._viewed = (full, full._version)
    return result


def _masked(value: Sharded, mask: torch.Tensor, rest: list[Any]) -> Sharded:
    """``x[mask]`` with a mask over the leading dimensions, cut like the batch: each piece its selected elements;
    the parts' sizes are exchanged (one small collective)."""
    reference = mask if type(mask) is Sharded else value
    pieces = []
    for index, piece in enumerate(value._pieces):
        local = _operand(mask, index, value, True, mask.dim())
        pieces.append(piece[(local, *rest)])
    held = value._group.row_counts([len(piece) for piece in pieces])
    return Sharded(pieces, held, reference._group)


def _setitem(func, args, kwargs):
    value, key, new = args
    if type(value) is not Sharded:
        return _materialized(func, args, kwargs)
    entries = _entries(key)
    size = _global_size(value)
    first = entries[0] if entries else None
    if not _sharded_in(entries) and _batch_untouched(entries, len(size)):
        selected = _per_piece(torch.Tensor.__getitem__, (value, key), {}, value, split=False)
        new_ndim = selected.dim() if isinstance(selected, torch.Tensor) else 0

        def local(index: int) -> tuple[tuple, dict]:
            return (value._pieces[index], key, _operand(new, index, value, True, new_ndim)), {}

        _per_piece(func, args, {}, value, local=local)
        return None
    if (
        type(first) is Sharded
        and first.dtype == torch.bool
        and (first._splits, first._group) == (value._splits, value._group)
        and len(entries) == 1
        and (not isinstance(new, torch.Tensor) or new.dim() == 0)
    ):
        def masked(index: int) -> tuple[tuple, dict]:
            return (value._pieces[index], first._pieces[index], new), {}

        _per_piece(func, args, {}, value, local=masked)
        return None
    full = materialize(value)
    func(full, materialize(key), materialize(new))
    _write_back(value, full)
    return None


# --- products ------------------------------------------------------------------------------------------------------


def _matmul(func, args, kwargs):
    """A matrix product with the batch on the outside (``x @ W``, batched products) runs on the pieces; one that
    contracts over the batch (``x.T @ y``, a vector of rows) is materialised."""
    left, right = args[0], args[1] if len(args) > 1 else kwargs.get("other", kwargs.get("mat2"))
    name = _name(func)
    if name == "__rmatmul__":
        left, right = right, left
    sharded_left, sharded_right = type(left) is Sharded, type(right) is Sharded
    if sharded_left and sharded_right:
        ok = left.dim() >= 3 and left.dim() == right.dim() and left._splits == right._splits
    elif sharded_left:
        ok = left.dim() >= 2 and (right.dim() <= 2 or right.dim() == left.dim())
    else:
        ok = right.dim() >= 3 and left.dim() <= right.dim()
    if not ok or set(kwargs) - {"other", "mat2"}:
        return _materialized(func, args, kwargs)
    reference = left if sharded_left else right
    # Only a batched product's leading dimensions broadcast like the batch; a matrix operand is whole.
    batched = max(left.dim(), right.dim()) >= 3
    return _per_piece(torch.matmul, (left, right), {}, reference, split=batched)


# --- autograd ------------------------------------------------------------------------------------------------------


def _split_like(value: Sharded, gradient: Any) -> list[torch.Tensor]:
    """A gradient for the global ``value``, as one per held piece."""
    if type(gradient) is Sharded:
        return list(gradient._pieces)
    firsts = starts(value._splits)
    return [
        value._group.place(gradient.narrow(0, firsts[part], value._splits[part]), piece)
        for part, piece in zip(value._group.held, value._pieces)
    ]


def roots(outputs: Sequence[Any], gradients: Sequence[Any], group: Any = None) -> tuple[list[torch.Tensor], list[Any]]:
    """Autograd roots for global outputs: a Sharded output gives its pieces (each piece's gradient is whole on its
    process); a plain output, held alike everywhere, starts at the group's seed scale (``1/W`` over processes;
    ``group`` when no output names one). A missing gradient is torch's implicit one, for one-element outputs."""
    tensors: list[torch.Tensor] = []
    grads: list[Any] = []
    group = next((value._group for value in outputs if type(value) is Sharded), group)
    for output, gradient in zip(outputs, gradients):
        if type(output) is Sharded:
            if gradient is None:
                if math.prod(_global_size(output)) != 1:
                    raise RuntimeError("grad can be implicitly created only for scalar outputs")
                gradient = torch.ones(_global_size(output), dtype=output.dtype, device=output._pieces[0].device)
            tensors.extend(output._pieces)
            grads.extend(_split_like(output, gradient))
        else:
            scale = group.seed_scale if group is not None else 1.0
            if gradient is None:
                gradient = torch.ones_like(output) if scale != 1.0 else None
            if gradient is not None and scale != 1.0:
                gradient = gradient * scale
            tensors.append(output)
            grads.append(gradient)
    return tensors, grads


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _backward(func, args, kwargs):
    """``x.backward(gradient)`` and ``torch.autograd.backward(tensors, grad_tensors)`` with Sharded outputs."""
    if _name(func) == "backward" and func is not _autograd_backward and func is not torch.autograd.backward:
        output = args[0]
        gradient = args[1] if len(args) > 1 else kwargs.pop("gradient", None)
        rest = dict(kwargs)
        for index, name in enumerate(("retain_graph", "create_graph", "inputs"), start=2):
            if len(args) > index:
                rest[name] = args[index]
        outputs, gradients = [output], [gradient]
    else:
        outputs = _as_list(args[0] if args else kwargs.pop("tensors"))
        gradients = _as_list(args[1] if len(args) > 1 else kwargs.pop("grad_tensors", None)) or [None] * len(outputs)
        rest = dict(kwargs)
        for index, name in enumerate(("retain_graph", "create_graph", "grad_variables", "inputs"), start=2):
            if len(args) > index:
                rest[name] = args[index]
    tensors, grads = roots(outputs, gradients)
    if rest.get("inputs") is not None:
        rest["inputs"] = _leaves(_as_list(rest["inputs"]))
    _autograd_backward(tensors, grads, **rest)


def _leaves(values: list[Any]) -> list[torch.Tensor]:
    """The tensors autograd takes as ``inputs`` for these values (a hooked value's gradient is its holders')."""
    found: list[torch.Tensor] = []
    for value in values:
        if type(value) is Sharded and value._legacy_leaf:
            adopt_requires_grad(value)
        found.extend(hooks.holders(value) if type(value) is Sharded else [value])
    return found


def _grad(func, args, kwargs):
    """``torch.autograd.grad`` with Sharded outputs or inputs: a Sharded input's gradient is Sharded (whole on each
    process); a plain input's is summed over the parts (``gradients.py`` makes it whole)."""
    from mgpu_runtime.sharded.gradients import whole_gradients

    names = ("outputs", "inputs", "grad_outputs", "retain_graph", "create_graph", "only_inputs", "allow_unused")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    outputs = _as_list(bound.pop("outputs"))
    inputs = _as_list(bound.pop("inputs"))
    gradients = _as_list(bound.pop("grad_outputs", None)) or [None] * len(outputs)
    group = next(value._group for value in (*outputs, *inputs) if type(value) is Sharded)
    tensors, grads = roots(outputs, gradients, group)
    leaves = _leaves(inputs)
    found = list(_autograd_grad(tensors, leaves, grads, **bound))
    result, position = [], 0
    for value in inputs:
        if type(value) is Sharded:
            count = len(value._pieces)
            pieces = found[position : position + count]
            result.append(None if any(p is None for p in pieces) else Sharded(pieces, value._splits, value._group))
        else:
            count = 1
            result.append(found[position])
        position += count
    plain = [index for index, value in enumerate(inputs) if type(value) is not Sharded and result[index] is not None]
    for index, summed in zip(plain, whole_gradients(group, [result[index] for index in plain])):
        result[index] = summed
    return tuple(result)


# --- Python's protocols -------------------------------------------------------------------------------------------


def _repr(func, args, kwargs):
    """A Python protocol on the global value. Only iteration gives tensors autograd can carry on from; the rest
    (a print, ``.item()``, numpy) is no use of the value for its gradient hooks."""
    if _name(func) == "__iter__":
        return func(*materialize(args), **materialize(kwargs))
    found = _sharded_in(args) + _sharded_in(list(kwargs.values()))
    used = [value._used for value in found]
    result = func(*materialize(args), **materialize(kwargs))
    for value, before in zip(found, used):
        value._used = before
    return result


# --- classification ------------------------------------------------------------------------------------------------

_DUNDER_ATEN = {
    "__add__": "add", "__radd__": "add", "__sub__": "sub", "__rsub__": "sub", "__mul__": "mul", "__rmul__": "mul",
    "__truediv__": "div", "__rtruediv__": "div", "__div__": "div", "__rdiv__": "div",
    "__floordiv__": "remainder", "__rfloordiv__": "remainder", "__mod__": "remainder", "__rmod__": "remainder",
    "__pow__": "pow", "__rpow__": "pow", "__and__": "bitwise_and", "__rand__": "bitwise_and",
    "__or__": "bitwise_or", "__ror__": "bitwise_or", "__xor__": "bitwise_xor", "__rxor__": "bitwise_xor",
    "__lshift__": "bitwise_left_shift", "__rlshift__": "bitwise_left_shift",
    "__rshift__": "bitwise_right_shift", "__rrshift__": "bitwise_right_shift",
    "__invert__": "bitwise_not", "__neg__": "neg", "__pos__": "positive", "__abs__": "abs",
    "__eq__": "eq", "__ne__": "ne", "__lt__": "lt", "__le__": "le", "__gt__": "gt", "__ge__": "ge",
}
_DUNDER_ATEN = {
    **_DUNDER_ATEN,
    **{f"__i{name[2:]}": aten for name, aten in _DUNDER_ATEN.items() if not name.startswith("__r")},
}
# Composite element-wise functions of torch.nn.functional with no aten operator of their name.
_POINTWISE_EXTRA = frozenset(
    {
        "logsigmoid", "softsign", "tanhshrink", "relu6", "hardswish", "threshold_", "relu_", "elu_",
        "leaky_relu_", "hardtanh_", "copy_", "fill_", "zero_", "masked_fill", "masked_fill_", "where",
        "type_as_", "float_power_", "clip_", "silu", "gelu", "mish", "sigmoid", "tanh",
    }
)
_CONVERSIONS = frozenset(
    {
        "to", "type", "float", "double", "half", "bfloat16", "int", "long", "bool", "byte", "char", "short",
        "cfloat", "cdouble", "cpu", "cuda", "xpu", "mps", "detach", "detach_", "clone", "contiguous",
        "requires_grad_", "pin_memory", "share_memory_", "type_as", "data", "_base",
        "float16", "to_dense", "resolve_conj", "resolve_neg", "conj", "real", "imag",
    }
)
_ROW_WISE = frozenset(
    {
        "linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
        "conv_transpose3d", "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
        "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "adaptive_avg_pool1d",
        "adaptive_avg_pool2d", "adaptive_avg_pool3d", "lp_pool1d", "lp_pool2d", "max_pool1d_with_indices",
        "max_pool2d_with_indices", "max_pool3d_with_indices", "fractional_max_pool2d_with_indices",
        "interpolate", "upsample", "upsample_nearest", "upsample_bilinear", "pixel_shuffle", "pixel_unshuffle",
        "unfold", "fold", "embedding", "one_hot", "group_norm", "local_response_norm", "prelu",
        "channel_shuffle", "native_channel_shuffle",
    }
)
_ROW_PAIRED = frozenset({"grid_sample", "bilinear", "pairwise_distance"})
_PAIRED_OPERANDS = frozenset({"input", "grid", "input1", "input2", "x1", "x2"})
_LIKE = frozenset({"zeros_like", "ones_like", "empty_like", "full_like"})
_RANDOM_LIKE = frozenset({"rand_like", "randn_like", "randint_like"})
_NEW = frozenset({"new_zeros", "new_ones", "new_empty", "new_full", "new_tensor"})
_PROTOCOL = frozenset(
    {
        "__repr__", "__str__", "__format__", "tolist", "numpy", "item", "__array__", "__iter__", "__bool__",
        "__float__", "__int__", "__index__", "__complex__", "__reduce_ex__", "__deepcopy__", "__contains__",
        "__getstate__", "__array_wrap__", "__dlpack__", "data_ptr", "storage", "untyped_storage",
    }
)


def _layer_norm(func, args, kwargs):
    shape = args[1] if len(args) > 1 else kwargs.get("normalized_shape")
    value = args[0]
    if type(value) is Sharded and len(tuple(shape)) < value.dim():
        return _row_wise(func, args, kwargs)
    return _materialized(func, args, kwargs)


def _normalisation(func, args, kwargs):
    """``F.batch_norm``/``F.instance_norm``: per piece when they normalise each row by statistics given (evaluation);
    materialised when they take the batch's statistics (training), which span the rows."""
    names = ("input", "running_mean", "running_var", "weight", "bias", "training")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    if _name(func) == "batch_norm":
        training = bound.get("training", False)
    else:  # instance_norm: each row's own statistics, unless running statistics are updated from them
        training = bound.get("running_mean") is not None and kwargs.get("use_input_stats", True)
    if training:
        return _materialized(func, args, kwargs)
    return _row_wise(func, args, kwargs)


def _pad(func, args, kwargs):
    value, pad = args[0], args[1] if len(args) > 1 else kwargs.get("pad")
    if type(value) is Sharded and len(pad) // 2 < value.dim():
        return _row_wise(func, args, kwargs)
    return _materialized(func, args, kwargs)


def _where(func, args, kwargs):
    if len(args) + len(kwargs) == 1:
        return _materialized(func, args, kwargs)
    return _pointwise(func, args, kwargs)


_NAMED: dict[str, Rule] = {
    "sum": _Along(1, default=_ALL, over_rows=_sum_over_rows),
    "mean": _Along(1, default=_ALL, over_rows=_mean_over_rows),
    "nansum": _Along(1, default=_ALL),
    "nanmean": _Along(1, default=_ALL),
    "prod": _Along(1, default=_ALL),
    "amax": _Along(1, default=_ALL, over_rows=_amax),
    "amin": _Along(1, default=_ALL, over_rows=_amin),
    "any": _Along(1, default=_ALL, over_rows=_any),
    "all": _Along(1, default=_ALL, over_rows=_all),
    "max": _max_or_min(True),
    "min": _max_or_min(False),
    "count_nonzero": _count_nonzero,
    "argmax": _Along(1, default=_ALL),
    "argmin": _Along(1, default=_ALL),
    "logsumexp": _Along(1),
    "std": _Along(1, default=_ALL),
    "var": _Along(1, default=_ALL),
    "std_mean": _Along(1, default=_ALL),
    "var_mean": _Along(1, default=_ALL),
    "median": _Along(1, default=_ALL),
    "nanmedian": _Along(1, default=_ALL),
    "mode": _Along(1, default=-1),
    "kthvalue": _Along(2, default=-1),
    "topk": _Along(2, default=-1),
    "sort": _Along(1, default=-1),
    "argsort": _Along(1, default=-1),
    "norm": _Along(2, default=_ALL),
    "vector_norm": _Along(2, default=_ALL),
    "cumsum": _Along(1),
    "cumprod": _Along(1),
    "cummax": _Along(1),
    "cummin": _Along(1),
    "logcumsumexp": _Along(1),
    "softmax": _Along(1),
    "log_softmax": _Along(1),
    "softmin": _Along(1),
    "flip": _Along(1, name="dims"),
    "roll": _Along(2, name="dims", default=None),
    "diff": _Along(2, default=-1),
    "normalize": _Along(2, default=1),
    "cosine_similarity": _Along(2, default=1),
    "glu": _Along(1, default=-1),
    "cross": _Along(2, default=None),
    "take_along_dim": _Along(2, default=None),
    "narrow": _Along(1),
    "select": _Along(1),
    "index_select": _Along(1),
    "gather": _Along(1),
    "scatter": _Along(1),
    "scatter_": _Along(1),
    "scatter_add": _Along(1),
    "scatter_add_": _Along(1),
    "scatter_reduce": _Along(1),
    "index_add": _Along(1),
    "index_fill": _Along(1),
    "index_copy": _Along(1),
    "masked_select": _materialize_rule,
    "unflatten": _Along(1),
    "repeat_interleave": _Along(2, default=None),
    "chunk": _chunks,
    "split": _chunks,
    "tensor_split": _chunks,
    "unbind": _chunks,
    "cat": _cat,
    "concat": _cat,
    "concatenate": _cat,
    "stack": _cat,
    "view": _view_or_reshape,
    "reshape": _view_or_reshape,
    "view_as": _as_other,
    "reshape_as": _as_other,
    "expand_as": _as_other,
    "flatten": _flatten,
    "ravel": lambda func, args, kwargs: apply(torch.Tensor.reshape, (args[0], [-1]), {}),
    "squeeze": _squeeze,
    "unsqueeze": _unsqueeze,
    "expand": _expand,
    "repeat": _repeat,
    "permute": _permute,
    "transpose": _transpose,
    "swapaxes": _transpose,
    "swapdims": _transpose,
    "movedim": _movedim,
    "moveaxis": _movedim,
    "t": _transposed_property,
    "T": _transposed_property,
    "H": _transposed_property,
    "mT": _transposed_property,
    "mH": _transposed_property,
    "__getitem__": _getitem,
    "__setitem__": _setitem,
    "matmul": _matmul,
    "__matmul__": _matmul,
    "__rmatmul__": _matmul,
    "mm": _matmul,
    "bmm": _matmul,
    "register_hook": hooks.register_hook,
    "retain_grad": hooks.retain_grad,
    "layer_norm": _layer_norm,
    "batch_norm": _normalisation,
    "instance_norm": _normalisation,
    "pad": _pad,
    "where": _where,
    "grad": _grad,
    "backward": _backward,
}


def _is_pointwise(name: str) -> bool:
    base = _DUNDER_ATEN.get(name, name)
    if base in _POINTWISE_EXTRA:
        return True
    for candidate in (base, base[:-1] if base.endswith("_") else None):
        if not candidate:
            continue
        packet = getattr(torch.ops.aten, candidate, None)
        if packet is None:
            continue
        tags = [getattr(packet, overload).tags for overload in packet.overloads()]
        if any(torch.Tag.nondeterministic_seeded in t for t in tags):
            return False
        if any(torch.Tag.pointwise in t for t in tags):
            return True
    return False


def _classify(func: Any) -> Rule:
    name = _name(func)
    module = getattr(func, "__module__", "") or ""
    if func is torch.autograd.grad or func is _autograd_grad:
        return _grad
    if func is torch.autograd.backward or func is _autograd_backward:
        return _backward
    if name == "grad" and getattr(func, "__self__", None) is not None:  # the x.grad property
        return _set_on_pieces if getattr(func, "__name__", "") == "__set__" else _gradient_property
    if getattr(func, "__name__", "") == "__set__":
        return _set_on_pieces
    if name in _METADATA:
        return _METADATA[name]
    if name in _FIRST_PIECE:
        return _first_piece
    if name in _PROTOCOL:
        return _repr
    if name in _LOSSES and module.startswith("torch"):
        from mgpu_runtime.sharded.loss_rules import loss_rule

        return loss_rule
    if name in _NAMED:
        return _NAMED[name]
    if name in _CONVERSIONS:
        return _conversion
    if name in _ROW_WISE:
        return _row_wise
    if name in _ROW_PAIRED:
        return _row_paired
    if name in _LIKE:
        return _like_factory
    if name in _RANDOM_LIKE:
        return _random_like
    if name in _NEW:
        return _new_factory
    if _is_pointwise(name):
        return _pointwise
    return _materialize_rule


_LOSSES = frozenset(
    {
        "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
        "binary_cross_entropy", "binary_cross_entropy_with_logits", "soft_margin_loss", "kl_div",
        "poisson_nll_loss", "gaussian_nll_loss", "margin_ranking_loss", "hinge_embedding_loss",
        "cosine_embedding_loss", "triplet_margin_loss", "multi_margin_loss", "multilabel_margin_loss",
        "multilabel_soft_margin_loss",
    }
)
# Rules that never carry a value's gradient on from its pieces: metadata, a value's own gradient, factories of its
# shape, the Python protocols (``_repr`` decides for itself). A gradient hook may be given the whole gradient
# after these (``hooks.py``).
_NOT_USES = frozenset(
    {
        *_METADATA.values(), _first_piece, _gradient_property, _set_on_pieces, hooks.register_hook,
        hooks.retain_grad, _backward, _grad, _repr, _new_factory, _like_factory, _random_like,
    }
)


# --- custom autograd Functions --------------------------------------------------------------------------------------

_function_apply = torch.autograd.Function.apply


def _apply_on_global_tensors(cls, *args: Any, **kwargs: Any) -> Any:
    """``Function.apply`` with every ``Sharded`` argument made its global tensor (a function of the runtime's own is
    given its arguments as they are)."""
    if _any_sharded(args, kwargs) and not cls.__module__.startswith("mgpu_runtime."):
        args, kwargs = materialize(args), materialize(kwargs)
    return _function_apply.__func__(cls, *args, **kwargs)  # type: ignore[attr-defined]


def _any_sharded(args: tuple, kwargs: dict) -> bool:
    for value in (*args, *kwargs.values()) if kwargs else args:
        if type(value) is Sharded:
            return True
        if type(value) in (list, tuple) and any(type(part) is Sharded for part in value):
            return True
    return False


def _custom_functions_materialize() -> None:
    """torch's ``Function.apply`` (a classmethod every custom Function inherits) calls ``forward`` with its arguments
    as they are and records one node above them: given a ``Sharded`` value, ``forward`` would run under no_grad on
    its pieces and the result would carry no graph back to them ("element 0 of tensors does not require grad")."""
    if torch.autograd.Function.__dict__["apply"].__func__ is not _apply_on_global_tensors:
        torch.autograd.Function.apply = classmethod(_apply_on_global_tensors)  # type: ignore[assignment,method-assign]


_custom_functions_materialize()
