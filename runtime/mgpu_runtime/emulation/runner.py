"""Run a script as ``python script.py`` would, optionally on emulated devices, and capture its models.

``python -m mgpu_runtime.emulation [--devices W] [--float64] [--steps N] [--state OUT] script.py [args...]``

* ``--devices W``: W emulated devices and the emulated DataParallel (``data_parallel.install``) before the
  script runs: the original of a migration, as it runs under ``nn.DataParallel`` on W GPUs. Without it the
  script runs on torch as it is: a migrated script, under torchrun or with ``MGPU_CPU_REPLICAS``, where the
  runtime decides what the script sees.
* ``--float64``: ``torch.set_default_dtype(torch.float64)`` first.
* ``--steps N``: the run ends right after the N-th optimizer step (any optimizer's ``step()``, counted by a
  global step hook): the step raises ``StepLimitReached``, a ``BaseException``, so a script's ``except
  Exception`` lets it through.
* ``--state OUT``: at that step, or when the script ends without reaching it, ``torch.save`` writes to OUT
  ``{"steps": steps made, "models": [{"wrapper": class name, "state": state_dict}, ...]}``: for every
  wrapped model, in the order the wrappers took their module, the ``state_dict()`` of the bare module inside
  (keys without ``module.``). A wrapper is an ``nn.DataParallel`` (the emulated one included), torch's
  ``DistributedDataParallel``, or one of ``mgpu_runtime.PARALLEL_WRAPPERS`` (once the script imported
  ``mgpu_runtime``); wrappers of one module are counted once. Beside them, ``"outside"``: each parameter an
  optimizer stepped that no wrapped model holds (a head trained after the wrap), by its place
  (``optimizer 0 parameter 3``: the optimizers in the order of their first step). Under torchrun only rank
  0 writes OUT.

The script runs as ``__main__`` (``runpy``) with its absolute path as ``__file__`` and ``sys.argv[0]``, its
arguments after it, and its directory in place of this command's first ``sys.path`` entry, as ``python
script.py`` has them (but for ``sys.argv[0]``, which python leaves as it was typed).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from collections.abc import Sequence

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from mgpu_runtime.emulation import data_parallel
from mgpu_runtime.pickling import COPY_MARK


class StepLimitReached(BaseException):
    """Raised out of ``optimizer.step()`` once the run has made its steps, to end the script there."""


def _wrapper_types() -> tuple[type, ...]:
    wrappers = sys.modules.get("mgpu_runtime.wrappers")
    listed = wrappers.PARALLEL_WRAPPERS if wrappers is not None else ()
    return (data_parallel._TorchDataParallel, nn.parallel.DistributedDataParallel, *listed)


class Capture:
    """The wrapped models of a run, in the order their wrappers took their module, and its optimizer steps."""

    def __init__(self, step_limit: int | None, state_path: str | None) -> None:
        self.step_limit = step_limit
        self.state_path = state_path
        self.steps = 0
        self.written = False
        self.wrappers: list[nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.hooks = [
            nn.modules.module.register_module_module_registration_hook(self._module_set),
            register_optimizer_step_post_hook(self._step_made),
        ]

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()

    def _module_set(self, parent: nn.Module, name: str, child: nn.Module) -> None:
        if parent.__dict__.get(COPY_MARK):
            return  # a deep copy of a wrapper (an averaged model): the original's copy is no wrap of the script's either
        if name == "module" and isinstance(parent, _wrapper_types()) and all(parent is not seen for seen in self.wrappers):
            self.wrappers.append(parent)

    def _step_made(self, optimizer, args, kwargs) -> None:
        if all(optimizer is not seen for seen in self.optimizers):
            self.optimizers.append(optimizer)
        self.steps += 1
        if self.step_limit is not None and self.steps >= self.step_limit:
            self.write()
            raise StepLimitReached

    def models(self) -> list[tuple[nn.Module, nn.Module]]:
        """Each wrapper with the bare module inside it; a module wrapped more than once comes once, first."""
        types = _wrapper_types()
        found: list[tuple[nn.Module, nn.Module]] = []
        for wrapper in self.wrappers:
            module: nn.Module | None = wrapper
            while isinstance(module, types):
                # The functional data_parallel's wrapper holds its module only during a call
                # (distributed/functional.py): between calls it wraps nothing, as torch's function made none.
                module = module._modules.get("module")
            if module is not None and all(module is not seen for _, seen in found):
                found.append((wrapper, module))
        return found

    def state(self) -> dict:
        """What ``--state`` writes: the steps made, each wrapped model's wrapper and ``state_dict()``, and the
        parameters the optimizers stepped outside them."""
        found = self.models()
        models = [{"wrapper": type(wrapper).__name__, "state": module.state_dict()} for wrapper, module in found]
        wrapped = {id(parameter) for _, module in found for parameter in module.parameters()}
        outside = {}
        for index, optimizer in enumerate(self.optimizers):
            parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
            for place, parameter in enumerate(parameters):
                if id(parameter) not in wrapped:
                    outside[f"optimizer {index} parameter {place}"] = parameter.detach()
        return {"steps": self.steps, "models": models, "outside": outside}

    def write(self) -> None:
        """Write the state once (the first call counts), on rank 0 only."""
        if self.written or self.state_path is None or os.environ.get("RANK", "0") != "0":
            return
        self.written = True
        partial = f"{self.state_path}.{os.getpid()}.partial"
        torch.save(self.state(), partial)
        os.replace(partial, self.state_path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mgpu_runtime.emulation",
        description="Run a training script as `python script.py` would, on emulated DataParallel devices (--devices) "
        "or as it is, stop it after N optimizer steps and write its wrapped models' state.",
    )
    parser.add_argument("--devices", type=int, metavar="W", help="emulate W CUDA devices and nn.DataParallel on them")
    parser.add_argument("--float64", action="store_true", help="torch.set_default_dtype(torch.float64) before the script")
    parser.add_argument("--steps", type=int, metavar="N", help="end the run right after the N-th optimizer step")
    parser.add_argument("--state", metavar="OUT", help="write the wrapped models' state_dicts here (rank 0 only)")
    parser.add_argument("script", help="the script to run as __main__")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return parser


def main(argv: list[str] | None = None) -> None:
    options = _parser().parse_args(argv)
    if options.steps is not None and options.steps < 1:
        _parser().error("--steps must be at least 1")
    run(options.script, options.args, options.devices, options.float64, options.steps, options.state)


def run(
    script: str,
    args: Sequence[str] = (),
    devices: int | None = None,
    float64: bool = False,
    steps: int | None = None,
    state: str | None = None,
) -> Capture:
    """Run ``script`` in this process as the command does (see the module's doc), and give torch, ``sys.argv``
    and ``sys.path`` back as they were; a ``SystemExit`` of the script is raised on."""
    saved = sys.argv, sys.path[0], torch.get_default_dtype()
    if devices is not None:
        data_parallel.install(devices)
    if float64:
        torch.set_default_dtype(torch.float64)
    capture = Capture(steps, state)
    script = os.path.abspath(script)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(script)
    try:
        runpy.run_path(script, run_name="__main__")
    except StepLimitReached:
        pass
    except SystemExit as exit:
        if exit.code in (None, 0):
            capture.write()
        raise
    else:
        capture.write()
    finally:
        capture.close()
        if devices is not None:
            data_parallel.uninstall()
        sys.argv, sys.path[0] = saved[:2]
        torch.set_default_dtype(saved[2])
    return capture
