"""The library functions and methods that write a file they are given the path of: what a process runs once where the original
ran it once. One list, read by the file's own rule (MGP134) and by project reading (a helper that writes, MGP132)."""

from __future__ import annotations

LIBRARY_WRITERS = frozenset(
    {
        "numpy.save",
        "numpy.savez",
        "numpy.savez_compressed",
        "numpy.savetxt",
        "torchvision.utils.save_image",
        "cv2.imwrite",
        "imageio.imwrite",
        "imageio.imsave",
        "imageio.mimsave",
        "imageio.mimwrite",
        "imageio.v2.imwrite",
        "imageio.v2.mimsave",
        "scipy.misc.imsave",
        "scipy.io.savemat",  # Face_Pytorch's and MobileFaceNet's features for the LFW evaluation
        "skimage.io.imsave",
        "matplotlib.pyplot.savefig",
        "soundfile.write",
        "scipy.io.wavfile.write",
        "torchaudio.save",
        "librosa.output.write_wav",  # librosa before 0.8 (WaveRNN's save_wav)
        "shutil.copyfile",
        "shutil.copy",
        "shutil.copy2",
        "shutil.copytree",
        # A file removed (yolact's old checkpoint, `--keep_latest`): by every process, all but one fail to find it.
        "os.remove",
        "os.unlink",
    }
)

# Shell commands run by a statement of the file itself (dgcnn's `os.system('cp main.py checkpoints/.../main.py.backup')`):
# the original ran each once, and every process would copy, move, fetch or delete alike. Only the file's own rule
# (MGP134) moves them: a project helper that runs one (a `wget` of missing weights inside `load_darknet_weights`)
# does more than write, and project reading does not count it as a writer.
SHELL_COMMANDS = frozenset({"os.system", "subprocess.call", "subprocess.run", "subprocess.check_call"})

# The library objects that write once built: TensorBoard's writers, visdom's client (it sends each point to its server),
# ignite's checkpoint handler. Built in the file, MGP135 builds them on the main process only; built in a project
# class's ``__init__`` (Face_Pytorch's ``Visualizer`` over ``visdom.Visdom``), that class's construction writes.
WRITER_OBJECTS = frozenset(
    {
        "torch.utils.tensorboard.SummaryWriter",
        "torch.utils.tensorboard.writer.SummaryWriter",
        "tensorboardX.SummaryWriter",
        "tensorboard_logger.Logger",
        "tensorboard_logger.tensorboard_logger.Logger",
        "visdom.Visdom",
        "ignite.handlers.ModelCheckpoint",
        "ignite.handlers.checkpoint.ModelCheckpoint",
    }
)

# Methods that write a file they are given the path of, known by their name alone: a figure's (``savefig``), a
# ``pathlib.Path``'s, a pandas data frame's (mean-teacher's ``TrainLog.save``: ``df.to_msgpack(path)``).
LIBRARY_WRITING_METHODS = frozenset(
    {
        "savefig",
        "write_text",
        "write_bytes",
        "to_csv",
        "to_pickle",
        "to_msgpack",
        "to_parquet",
        "to_hdf",
        "to_excel",
        "to_feather",
    }
)

# A logger's methods (``logging.getLogger(...)``'s, or the ``logging`` module's own): a call of one only says
# something, into the logger's handlers.
LOGGING_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "exception", "log"})

# Methods of text (and of a time) that compute a file's name and do nothing else: a line that only names a path
# (``best_name = "_".join((prefix, mode.lower(), "model_best.pth.tar"))``) may run where the file is written.
TEXT_METHODS = frozenset(
    {"format", "join", "split", "rsplit", "strip", "lstrip", "rstrip", "replace", "lower", "upper", "strftime",
     "isoformat", "startswith", "endswith"}
)
