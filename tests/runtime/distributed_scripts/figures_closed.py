"""A TensorBoard writer built on the main process only (``mgpu_runtime.main_process_only``) that is given
matplotlib figures: ``add_figure`` closes them on the main process, and its stand-in closes them on the others,
so no process keeps the figures the loop drew (FastSpeech2's ``synth_one_sample`` draws one a logging step).

Prints, per process, the figures still open: only the one logged with ``close=False``, as in one process."""

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

import mgpu_runtime  # noqa: E402

mgpu_runtime.setup()
writer = mgpu_runtime.main_process_only(SummaryWriter, sys.argv[1])
for step in range(4):
    figure, axes = plt.subplots(2, 1, squeeze=False)
    axes[0][0].plot([step, step + 1])
    writer.add_figure("synthesised", figure, step)
pair = [plt.figure(), plt.figure()]
writer.add_figure("pair", pair, global_step=4)
kept = plt.figure()
writer.add_figure("kept", kept, 5, False)
writer.close()
print(f"rank {mgpu_runtime.rank()} open figures {plt.get_fignums() == [kept.number]}", flush=True)
