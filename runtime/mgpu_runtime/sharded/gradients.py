"""Gradients over processes: every rank's gradient is a part, and the parts sum to the one global loss's.

Every rank computes the same global loss (the loop's values are global, ``rules.py``), but each holds only
its rows of the batch, so its backward reaches only its own pieces. The convention that makes this exact
for any loop: a value every rank holds alike (a parameter, the loss, anything the loop computed from
collectives) has on each rank a gradient *part*, and the parts sum over the ranks to its true gradient; a
piece's gradient is whole on its rank. So:

* a backward from values held alike starts at ``1/W`` on every rank (``Gradients.install`` wraps
  ``torch.autograd.backward`` and ``torch.autograd.grad``, so ``loss.backward()``, ``scaler.scale(loss).backward()``
  and ``torch.autograd.grad(loss, ...)`` all do); one from a ``Sharded`` value starts at its pieces' gradients;
* a collective's backward sums the parts again (``groups.py``);
* the wrapped model's parameters are summed by DDP's reduction (``distributed/ddp.py``), or, for a wrapper
  whose one forward feeds several backward passes (``reduce_each_backward=True``), at the end of each backward
  pass, so that ``.grad`` is whole after each, as DataParallel's was; so is a parameter outside every wrapped
  model that a backward pass reaches through the loop's own computation (a loss head outside the wrap, a
  learnable temperature, class centres), from that pass on, so a ``clip_grad_norm_`` or a logged norm reads the
  whole (``_follow_the_loop``); any other parameter an optimizer steps is summed at the step;
  a gradient ``torch.autograd.grad`` returns for a value held alike is summed before it is returned.

Gradient hooks see whole gradients, as DataParallel's did: a hook on a ``Sharded`` value is its piece's
(``hooks.py``), and one on a value held alike that the loop computed (a loss, a materialised value: a tensor
with a ``grad_fn``) is given the part summed over the ranks, and what the hooks make of the whole goes on as
this rank's share of it; its retained ``.grad`` is the whole (``_HeldAlike``). A parameter's hook sees its part,
as under DDP.

Inside the wrapped model's forward (each rank's own computation, as each device's was) and inside a backward
already running (a checkpoint's recomputation), autograd is left as it is.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_pre_hook

from mgpu_runtime.sharded.groups import Group
from mgpu_runtime.sharded.hooks import TORCH_REGISTER_HOOK, TORCH_RETAIN_GRAD, Handle
from mgpu_runtime.sharded.rules import _autograd_backward, _autograd_grad, roots
from mgpu_runtime.sharded.rules import _grad as _sharded_grad
from mgpu_runtime.sharded.scatter_gather import MODEL_OUTPUT
from mgpu_runtime.sharded.tensor import Sharded

class Gradients:
    """Autograd's convention for the processes of one group (see the module doc), from ``install()`` until
    ``uninstall()``: one per job (the process group's)."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self._synchronised: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        """Parameters whose gradients DDP sums (registered by the wrapper), by id (a tensor's ``==`` is
        element-wise)."""
        self._local = threading.local()
        self._hook: Any = None
        self._each_backward: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        """Parameters whose gradients are summed at the end of each backward pass (``sum_each_backward``)."""
        self._whole: dict[int, tuple[int, int]] = {}
        """For a DDP-summed parameter whose ``.grad`` is whole (summed over the ranks by the last backward pass,
        and not changed since): the id and version of that gradient tensor (``_kept_whole``)."""
        self._reduced: set[int] = set()
        """The parameters whose DDP buckets the running backward pass has summed (``note_reduced``)."""

    def note_synchronised(self, parameters: Sequence[torch.Tensor]) -> None:
        """These parameters' gradients are summed by DDP's reduction; the step must not sum them again."""
        self._synchronised.update((id(parameter), parameter) for parameter in parameters)

    def sum_each_backward(self, parameters: Sequence[torch.Tensor]) -> None:
        """These parameters' gradients are summed over the ranks at the end of each backward pass (a model whose
        one forward feeds several, which DDP's reducer cannot follow), and not again at the step."""
        self._each_backward.update((id(parameter), parameter) for parameter in parameters)
        self.note_synchronised(parameters)

    def note_reduced(self, parameters: Sequence[torch.Tensor]) -> None:
        """DDP's reduction summed these parameters' bucket in this backward pass (the wrapper's comm hook)."""
        self._reduced.update(id(parameter) for parameter in parameters)

    @contextmanager
    def _kept_whole(self) -> Iterator[None]:
        """Around one backward pass: gradients accumulated over several passes before a step (``loss.backward()``
        each micro-batch, ``optimizer.step()`` every k) are summed once each. DDP's reducer sums what ``.grad``
        holds after the pass, and a ``.grad`` the last pass left is whole already: summed again over W ranks it
        would count W times (torch's own DDP averages, which forgives it). So a DDP-summed parameter's whole
        gradient is set aside before the pass (``.grad`` None), and added back to what the pass sums. Whole
        means: summed by the last pass and unchanged since (the same tensor at the same version); one changed in
        place since (zeroed, or accumulated locally under ``no_sync()``) is summed as it is, as before."""
        kept = []
        for key, parameter in list(self._synchronised.items()):
            gradient = parameter.grad
            if key in self._each_backward or gradient is None:
                continue
            if self._whole.get(key) == (id(gradient), gradient._version):
                kept.append((key, parameter, gradient))
                parameter.grad = None
        self._reduced.clear()
        try:
            yield
        finally:
            for _key, parameter, gradient in kept:
                if parameter.grad is None:
                    parameter.grad = gradient
                else:
                    parameter.grad.add_(gradient)
            reduced, self._reduced = self._reduced, set()
            for key, parameter in list(self._synchronised.items()):
                gradient = parameter.grad
                if key in reduced and gradient is not None:
                    self._whole[key] = (id(gradient), gradient._version)
                else:
                    self._whole.pop(key, None)

    def _follow_the_loop(self, roots_: Sequence[torch.Tensor]) -> None:
        """The parameters outside every wrapped model that this backward pass reaches through the loop's own
        computation (a loss head, a learnable margin or temperature, class centres) are summed at the end of each
        pass from now on (``sum_each_backward``), so their ``.grad`` is whole when ``backward()`` returns, as
        under DataParallel: a ``clip_grad_norm_`` over them, or a logged gradient norm, reads the whole. The walk
        of the graph stops at the model's outputs (``MODEL_OUTPUT``): behind them is the wrapped forward, whose
        parameters DDP sums. Every rank walks the same graph (the loop's values are global), so every rank finds
        the same parameters in the same order."""
        stack: list[Any] = [root.grad_fn for root in reversed(roots_) if root.grad_fn is not None]
        seen: set[Any] = set()
        found: list[torch.Tensor] = []
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            variable = getattr(node, "variable", None)  # an AccumulateGrad: a leaf's gradient goes here
            if variable is not None:
                if (
                    isinstance(variable, torch.nn.Parameter)
                    and variable.requires_grad
                    and self._synchronised.get(id(variable)) is not variable
                ):
                    found.append(variable)
                continue
            if type(node).__name__ == "AliasBackward0" and node.metadata.get(MODEL_OUTPUT):
                continue
            stack.extend(next_node for next_node, _ in reversed(node.next_functions))
        if found:
            self.sum_each_backward(found)

    @contextmanager
    def _whole_after_backward(self) -> Iterator[None]:
        """Around one backward pass: the ``sum_each_backward`` parameters' gradients it adds are summed over the
        ranks and added to what ``.grad`` held before it (whole already). Which parameters the pass reached is
        summed too, so one that no rank's pass reached keeps its ``.grad`` as it was (``None`` stays ``None``)."""
        parameters = [parameter for parameter in self._each_backward.values() if parameter.requires_grad]
        if not parameters:
            yield
            return
        before = [parameter.grad for parameter in parameters]
        for parameter in parameters:
            parameter.grad = None
        try:
            yield
        finally:
            added = [parameter.grad for parameter in parameters]
            for parameter, held in zip(parameters, before):
                parameter.grad = held
        reached = torch.tensor([float(gradient is not None) for gradient in added], dtype=torch.float64, device=self.group.device)
        by_kind: dict[tuple[torch.dtype, torch.device], list[int]] = {}
        for index, parameter in enumerate(parameters):
            by_kind.setdefault((parameter.dtype, parameter.device), []).append(index)
        given = [gradient if gradient is not None else torch.zeros_like(parameter) for gradient, parameter in zip(added, parameters)]
        flats = [torch.cat([given[i].reshape(-1) for i in members]) for members in by_kind.values()]
        dist.all_reduce(reached)
        for flat in flats:
            dist.all_reduce(flat)
        anywhere = reached.tolist()
        for members, flat in zip(by_kind.values(), flats):
            offset = 0
            for i in members:
                size = parameters[i].numel()
                whole = flat[offset : offset + size].view_as(parameters[i])
                offset += size
                held = before[i]
                if not anywhere[i]:
                    continue
                if held is None:
                    parameters[i].grad = whole.clone()
                else:
                    held.add_(whole)

    @contextmanager
    def own_computation(self) -> Iterator[None]:
        """The wrapped model's forward: each rank's own computation, whose autograd is left alone."""
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1

    def _left_alone(self) -> bool:
        return getattr(self._local, "depth", 0) > 0 or torch._C._current_graph_task_id() != -1

    def install(self) -> None:
        """Make autograd follow the convention for the processes of the group."""
        group = self.group

        def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None, inputs=None):
            if self._left_alone():
                return _autograd_backward(tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs)
            outputs = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
            given = grad_tensors if grad_tensors is not None else grad_variables
            listed = list(given) if isinstance(given, (list, tuple)) else [given]
            roots_, grads = roots(outputs, listed if given is not None else [None] * len(outputs), group)
            self._follow_the_loop(roots_)
            with self._kept_whole(), self._whole_after_backward():
                return _autograd_backward(roots_, grads, retain_graph, create_graph, inputs=inputs)

        def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, only_inputs=True,
                 allow_unused=None, is_grads_batched=False, materialize_grads=False):
            if self._left_alone():
                return _autograd_grad(outputs, inputs, grad_outputs, retain_graph, create_graph, only_inputs,
                                      allow_unused, is_grads_batched, materialize_grads)
            outputs_ = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
            inputs_ = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            if any(type(value) is Sharded for value in (*outputs_, *inputs_)):
                # A gradient penalty's ``autograd.grad(critic(points), points)``: a Sharded input's gradient is
                # whole on each rank already, piece by piece; only the plain inputs' parts are summed.
                return _sharded_grad(torch.autograd.grad, (outputs_, inputs_), dict(
                    grad_outputs=grad_outputs, retain_graph=retain_graph, create_graph=create_graph,
                    only_inputs=only_inputs, allow_unused=allow_unused, is_grads_batched=is_grads_batched,
                    materialize_grads=materialize_grads))
            given = list(grad_outputs) if isinstance(grad_outputs, (list, tuple)) else [grad_outputs] * len(outputs_)
            roots_, grads = roots(outputs_, given if grad_outputs is not None else [None] * len(outputs_), group)
            found = _autograd_grad(roots_, inputs, grads, retain_graph, create_graph, only_inputs, allow_unused,
                                   is_grads_batched, materialize_grads)
            present = [gradient for gradient in found if gradient is not None]
            whole = iter(whole_gradients(group, present))
            return tuple(None if gradient is None else next(whole) for gradient in found)

        def register_hook(tensor, hook):
            if not self._held_alike(tensor):
                return TORCH_REGISTER_HOOK(tensor, hook)
            return _HeldAlike.of(tensor, group).add(hook)

        def retain_grad(tensor):
            TORCH_RETAIN_GRAD(tensor)
            if self._held_alike(tensor):
                _HeldAlike.of(tensor, group).retain()

        torch.autograd.backward = backward
        torch.autograd.grad = grad
        register_hook.__name__, retain_grad.__name__ = "register_hook", "retain_grad"
        torch.Tensor.register_hook = register_hook  # type: ignore[method-assign]
        torch.Tensor.retain_grad = retain_grad  # type: ignore[method-assign]
        self._hook = register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: self._sum_unsynchronised(optimizer))

    def _held_alike(self, tensor: torch.Tensor) -> bool:
        """A plain value of the loop computed with autograd: every rank holds it alike, its gradient in parts."""
        return type(tensor) is not Sharded and tensor.grad_fn is not None and not self._left_alone()

    def uninstall(self) -> None:
        """Give autograd torch's own functions back (at teardown)."""
        torch.autograd.backward = _autograd_backward
        torch.autograd.grad = _autograd_grad
        torch.Tensor.register_hook = TORCH_REGISTER_HOOK  # type: ignore[method-assign]
        torch.Tensor.retain_grad = TORCH_RETAIN_GRAD  # type: ignore[method-assign]
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _sum_unsynchronised(self, optimizer: torch.optim.Optimizer) -> None:
        """Before a step: sum over the ranks the gradient parts of parameters DDP did not reduce."""
        gradients = [
            parameter.grad
            for group in optimizer.param_groups
            for parameter in group["params"]
            if parameter.grad is not None and self._synchronised.get(id(parameter)) is not parameter
        ]
        by_kind: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for gradient in gradients:
            by_kind.setdefault((gradient.dtype, gradient.device), []).append(gradient)
        for members in by_kind.values():
            flat = torch.cat([gradient.reshape(-1) for gradient in members])
            dist.all_reduce(flat)
            offset = 0
            for gradient in members:
                gradient.copy_(flat[offset : offset + gradient.numel()].view_as(gradient))
                offset += gradient.numel()


class _HeldAlike:
    """The gradient hooks of one value every rank holds alike. Its gradient on a rank is a part; one hook of torch's
    sums the parts over the ranks, runs the script's hooks, in the order they were registered, on the whole, and
    hands on what they made of it as this rank's share (``1/W`` of it, so the parts sum to it again); once the
    value's node has run, a retained ``.grad`` is given the whole in place of torch's part."""

    def __init__(self, tensor: torch.Tensor, group: Group) -> None:
        self.group = group
        self.hooks: dict[int, Any] = {}
        self._keys = itertools.count()
        self._tensor = weakref.ref(tensor)
        self._retained = False
        self._kept: tuple[torch.Tensor | None, torch.Tensor] | None = None
        """The retained ``.grad`` before this backward, and the whole gradient after the hooks."""
        TORCH_REGISTER_HOOK(tensor, self._run)

    @staticmethod
    def of(tensor: torch.Tensor, group: Group) -> _HeldAlike:
        found = tensor.__dict__.get("_mgpu_held_alike")
        if found is None:
            found = tensor.__dict__["_mgpu_held_alike"] = _HeldAlike(tensor, group)
        return found

    def add(self, hook: Any) -> Handle:
        key = next(self._keys)
        self.hooks[key] = hook

        def remove() -> None:
            self.hooks.pop(key, None)

        return Handle([], remove)

    def retain(self) -> None:
        tensor = self._tensor()
        if not self._retained and tensor is not None and tensor.grad_fn is not None:
            self._retained = True
            tensor.grad_fn.register_hook(self._write_retained)

    def _run(self, part: torch.Tensor) -> torch.Tensor | None:
        if not self.hooks and not self._retained:
            return None
        (whole,) = self.group.sum([part])
        changed = False
        for hook in list(self.hooks.values()):
            result = hook(whole)
            if result is not None:
                if tuple(result.shape) != tuple(part.shape):
                    raise RuntimeError(f"hook '{getattr(hook, '__name__', type(hook).__name__)}' has changed the size of value")
                whole, changed = result, True
        if self._retained:
            tensor = self._tensor()
            before = None if tensor is None or tensor.grad is None else tensor.grad.clone()
            self._kept = (before, whole)
        return whole * self.group.seed_scale if changed else None

    def _write_retained(self, grad_inputs: Any, grad_outputs: Any) -> None:
        tensor, kept = self._tensor(), self._kept
        self._kept = None
        if tensor is not None and kept is not None:
            before, whole = kept
            tensor.grad = whole.detach().clone() if before is None else before + whole


def whole_gradients(group: Group, parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Gradient parts of values held alike, summed over the processes (differentiable); in one process, as they are."""
    if not parts or group.seed_scale == 1.0:
        return list(parts)
    return group.sum(*([part] for part in parts))
