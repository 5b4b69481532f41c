"""Parameters a ``forward`` rebinds with ``.data = ...``, kept as DataParallel kept them.

Some layers store a value by rebinding a parameter's data inside ``forward``: the SpectralNorm of SAGAN and of
many GAN repositories (``u.data = l2normalize(...)``, the power iteration's vectors kept as parameters), weight
clippers, running estimates. Under ``nn.DataParallel`` on several devices each replica's parameters are other
tensors than the module's: in a training forward, aliases made by the broadcast (a view on the first device, a
copy on the others), so the rebinding is lost with the replica and the module's parameter never changes; under
``torch.no_grad()`` the first replica holds the module's own parameters, and its rebinding stays.

Under the runtime each process runs its module itself, so such a rebinding would stay at every step: the power
iteration that DataParallel never advanced would advance, and the training would differ without a word. So, in
a training forward over several processes, each such parameter is shadowed by a view of itself for the length
of the forward (the module's ``__dict__`` is read before its ``_parameters``): the rebinding lands on the view,
the gradient still reaches the parameter, and the view is dropped afterwards.

The layers are found by reading their classes' source for ``.data =`` once, at the wrap: a class torch ships
does not rebind, and one whose source cannot be read is taken as it is.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Iterator

import torch
from torch import nn

_REBINDS = re.compile(r"\.data\s*=(?!=)")


class HeldParameters:
    """The parameters of ``module``'s layers that rebind ``.data`` in their code (and of those layers'
    submodules), each with the module that holds it and its name there."""

    def __init__(self, module: nn.Module) -> None:
        self._held: list[tuple[nn.Module, str, torch.Tensor]] = []
        seen: set[tuple[int, str]] = set()
        read: dict[type, bool] = {}  # each class's source read once per wrap
        for layer in module.modules():
            kind = type(layer)
            if kind not in read:
                read[kind] = _rebinds(kind)
            if not read[kind]:
                continue
            for holder in layer.modules():
                for name, parameter in holder._parameters.items():
                    if parameter is not None and (id(holder), name) not in seen:
                        seen.add((id(holder), name))
                        self._held.append((holder, name, parameter))

    def rebinding_dropped(self) -> contextlib.AbstractContextManager[None]:
        """For a training forward: each held parameter read as a view of itself, whose rebinding is dropped after
        (nothing to enter on the common path: no such layer, or no gradient recorded)."""
        if not self._held or not torch.is_grad_enabled():
            return contextlib.nullcontext()  # under no_grad the first replica held the module's own: it stayed
        return self._shadowed()

    @contextlib.contextmanager
    def _shadowed(self) -> Iterator[None]:
        shadowed = []
        try:
            for holder, name, parameter in self._held:
                if holder._parameters.get(name) is parameter and name not in holder.__dict__:
                    holder.__dict__[name] = parameter.view_as(parameter)
                    shadowed.append((holder, name))
            yield
        finally:
            for holder, name in shadowed:
                holder.__dict__.pop(name, None)

def _rebinds(cls: type) -> bool:
    """Whether a class of the module's own (not torch's) assigns ``.data`` somewhere in its source."""
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] in ("torch", "builtins"):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if _REBINDS.search(source):
            return True
    return False
