"""A plotting client held by the main process only, whose method results the script keeps and hands back, as a
visdom client's window ids are (``window = viz.line(...)``, then ``viz.line(..., win=window, update="append")``):
its stand-in (``MainProcessOnly`` of the visdom kind, what ``main_process_only(visdom.Visdom)`` gives) returns the
main process's result on every process. visdom itself is not installed here (its sdist needs pkg_resources to
build); ``Windows`` draws into a file as a visdom server would keep a window's points.

argv: the drawing file. Prints, per process, the window ids it was given."""

import sys

import mgpu_runtime
from mgpu_runtime.distributed.once import MainProcessOnly


class Windows:
    """Numbers each new window, appends a point to the one named ``win``."""

    def __init__(self, path):
        self.path = path
        self.count = 0

    def line(self, X, Y, win=None, update=None):
        if win is None:
            self.count += 1
            win = f"window_{self.count}"
        with open(self.path, "a") as drawing:
            drawing.write(f"{win} {update} {X} {Y}\n")
        return win


mgpu_runtime.setup()
viz = MainProcessOnly(Windows(sys.argv[1]) if mgpu_runtime.is_main_process() else None, "visdom")
seen = []
window = None
for step in range(3):
    if window is None:
        window = viz.line(X=[step], Y=[step * 0.5])
    else:
        seen.append(viz.line(X=[step], Y=[step * 0.5], win=window, update="append"))
    if mgpu_runtime.is_main_process():
        viz.line(X=[step], Y=[1.0])  # made by the main process alone: nothing to pair with
    seen.append(window)
other = viz.line(X=[0], Y=[2.0])
print(f"rank {mgpu_runtime.rank()} windows {seen} {other}", flush=True)
