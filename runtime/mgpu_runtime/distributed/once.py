"""Side effects done once, by the main process, where the DataParallel original did them once.

``on_main_process(function, *args, **kwargs)`` calls a function that writes (``save_image``, ``cv2.imwrite``, a
project's ``save_pred``) on the main process only; ``main_process_only(factory, *args, **kwargs)`` builds an
object that writes (a TensorBoard ``SummaryWriter``, a log file, a project's ``Logger``) on the main process
only, and gives every process a stand-in for it, so the script's code that uses the object runs unchanged on
every process. ``main_process_first(factory, *args, **kwargs)`` builds what every process needs and the first
build of which writes files (a dataset built with ``download=True``): the main process builds it first, alone,
then the others, which find the files there.

Both are called by every process, where the original made the call, and both first make whole the global
values among the arguments (``mgpu_runtime.sharded``: the distributed loader's batches and the wrapped model's
outputs, held in pieces): that is a collective, which every process must join, so it cannot wait for the main
process alone inside the writer. The main process then writes what the original wrote, from the same values.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from mgpu_runtime.distributed.process_group import barrier, is_main_process, world_size
from mgpu_runtime.distributed.readings import main_process_result
from mgpu_runtime.sharded.tensor import materialize


def _whole(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments with every global value in them made whole: the same collectives, in the same order, on
    every process (nothing at all where they hold none)."""
    return materialize(args), {key: materialize(value) for key, value in kwargs.items()}


def on_main_process(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` on the main process only; every process waits for it.

    Called by every process where the original called ``function``. The global values among the arguments
    are made whole first, on every process; then the main process calls ``function`` and the others wait at a
    barrier, so what it wrote is complete for everyone when this returns (a file another process reads next is
    there). Returns what ``function`` returned on the main process, and None on the others: a result that every
    process uses is no side effect, and the codemod does not move such a call here. In a single process, the
    call itself."""
    args, kwargs = _whole(args, kwargs)
    result = function(*args, **kwargs) if is_main_process() else None
    barrier()
    return result


class MainProcessOnly:
    """An object only the main process holds (``held``), or its stand-in on the other processes (``held`` None).

    Every process uses it as the original used the object: an attribute of it is another ``MainProcessOnly``
    (of the attribute, on the main process), and calling one makes the global values among its arguments whole
    on every process, then calls the attribute on the main process only, returning its result there and None
    elsewhere. So ``writer.add_scalar("loss", loss, step)`` writes once, and the loss is computed, as before, by
    every process. A ``with`` block over it enters and leaves the object on the main process; at its end every
    process waits for the main one, so a file written in the block is complete for all of them. Nothing else
    waits: a file written outside a ``with`` and read by another process needs ``mgpu_runtime.barrier()``.

    What a skipped call would also have done to the script's own objects is done on the other processes too:
    TensorBoard's ``add_figure`` closes the matplotlib figures it is given (unless ``close=False``), so the
    stand-in of a TensorBoard writer closes them there as well (``kind``); else every process but the main one
    would keep each figure the loop drew, and matplotlib would warn of too many open figures.

    A visdom client's method calls return the main process's result on every process (``kind``): what
    ``viz.line(...)`` returns is the id of the window it drew, which the script keeps and hands back
    (``viz.line(..., win=window, update="append")``) or tests (``if window is None:``), as the original did with
    its one client. It travels through the job's store (``main_process_result``), so a call only the main process
    makes pairs with nothing. So does a TensorBoard writer's log directory (``writer.get_logdir()``,
    ``writer.file_writer.get_logdir()``), where a script saves its best model (pytorch-semseg).
    """

    __slots__ = ("_held", "_kind")

    def __init__(self, held: Any, kind: str | None = None) -> None:
        object.__setattr__(self, "_held", held)
        object.__setattr__(self, "_kind", kind)

    def __getattr__(self, name: str) -> MainProcessOnly:
        held = object.__getattribute__(self, "_held")
        if name.startswith("__") and name.endswith("__"):
            # What Python's machinery asks of an object (``inspect.signature`` reads ``__signature__`` and
            # ``__wrapped__``; ignite checks a handler's signature when it is attached) is the stand-in's own,
            # the same on every process: none of these.
            raise AttributeError(name)
        kind = object.__getattribute__(self, "_kind")
        shared = kind if kind == _VISDOM else None
        if kind == _TENSORBOARD:
            # A TensorBoard writer's log directory (`writer.get_logdir()`, `writer.file_writer.get_logdir()`, where
            # pytorch-semseg saves its best model) is the main process's on every process; `add_figure` closes the
            # figures it is given there too.
            shared = {"get_logdir": _LOGDIR, "file_writer": _TENSORBOARD, "add_figure": _ADD_FIGURE}.get(name)
        if is_main_process():
            return MainProcessOnly(getattr(held, name), shared if shared != _ADD_FIGURE else None)
        return MainProcessOnly(None, shared)

    def __setattr__(self, name: str, value: Any) -> None:
        if is_main_process():
            setattr(object.__getattribute__(self, "_held"), name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = _whole(args, kwargs)
        held = object.__getattribute__(self, "_held")
        if object.__getattribute__(self, "_kind") == _VISDOM and world_size() > 1:
            # A visdom client's methods return what the script keeps and hands back (the id of the window a
            # plot went to, ``win=window`` in the next call): every process gets the main process's.
            return main_process_result(lambda: held(*args, **kwargs), sys._getframe(1), "a visdom client's call", "visdom:")
        if object.__getattribute__(self, "_kind") == _LOGDIR and world_size() > 1:
            return main_process_result(lambda: held(*args, **kwargs), sys._getframe(1), "a TensorBoard writer's get_logdir()", "logdir:")
        if is_main_process():
            return held(*args, **kwargs)
        if object.__getattribute__(self, "_kind") == _ADD_FIGURE:
            _close_figures(args, kwargs)
        return None

    def __enter__(self) -> MainProcessOnly:
        held = object.__getattribute__(self, "_held")
        return MainProcessOnly(held.__enter__()) if is_main_process() else self

    def __exit__(self, *exception: Any) -> Any:
        held = object.__getattribute__(self, "_held")
        try:
            return held.__exit__(*exception) if is_main_process() else False
        finally:
            if exception[0] is None:
                barrier()

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        held = object.__getattribute__(self, "_held")
        return f"mgpu_runtime.MainProcessOnly({held!r})" if is_main_process() else "mgpu_runtime.MainProcessOnly(<on the main process>)"


_TENSORBOARD, _ADD_FIGURE, _VISDOM, _LOGDIR = "tensorboard", "add_figure", "visdom", "logdir"
# The writers whose add_figure(tag, figure, global_step=None, close=True, ...) closes its figures.
_TENSORBOARD_MODULES = ("torch.utils.tensorboard", "tensorboardX")


def _writer_kind(factory: Callable[..., Any]) -> str | None:
    module = getattr(factory, "__module__", None) or ""
    if module == "visdom" or module.startswith("visdom."):
        return _VISDOM
    return _TENSORBOARD if module.startswith(_TENSORBOARD_MODULES) else None


def _close_figures(args: tuple, kwargs: dict) -> None:
    """Close the figures of a TensorBoard ``add_figure(tag, figure, global_step, close, walltime)`` call, as the
    writer would have (a figure or a list of them); nothing with ``close=False``."""
    close = kwargs.get("close", args[3] if len(args) > 3 else True)
    figure = kwargs.get("figure", args[1] if len(args) > 1 else None)
    pyplot = sys.modules.get("matplotlib.pyplot")  # a figure pyplot never registered is not open there
    if not close or figure is None or pyplot is None:
        return
    for each in figure if isinstance(figure, (list, tuple)) else (figure,):
        pyplot.close(each)


def main_process_first(factory: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``factory(*args, **kwargs)`` on every process, the main process first: the others wait until it is done.

    For what every process needs and whose first build fetches or writes files that later builds only read: a
    dataset built with ``download=True`` (torchvision's, a project's), which downloads and extracts its archive
    when it is not there yet. Built by every process at once, every process downloads the same archive into the
    same path, and one reads a file another is still writing. Here the main process builds it, so the files are
    complete, then the others build it from them. Called by every process where the original built it; the
    arguments are the script's own (nothing is made whole). An exception of the main process's build is raised
    there, and the job ends with it, as with any rank's failure. In a single process, the call itself."""
    if world_size() == 1:  # also before a plain start's set-up, which does not relaunch here
        return factory(*args, **kwargs)
    if is_main_process():
        built = factory(*args, **kwargs)
        barrier()
        return built
    barrier()
    return factory(*args, **kwargs)


def main_process_only(factory: Callable[..., Any], /, *args: Any, **kwargs: Any) -> MainProcessOnly:
    """``factory(*args, **kwargs)`` built on the main process only, and a stand-in for it on every process.

    For an object that writes and that the original built once: ``SummaryWriter(log_dir)``, ``open(path,
    "a")``, a project's ``Logger(path)``. Every process gets a :class:`MainProcessOnly` and uses it as the
    original used the object; its method calls run on the main process only. The codemod uses it only where the
    script calls the object's methods for their effect and never reads what they return. In a single process,
    the object itself behind the stand-in."""
    args, kwargs = _whole(args, kwargs)
    return MainProcessOnly(factory(*args, **kwargs) if is_main_process() else None, _writer_kind(factory))
