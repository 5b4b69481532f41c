"""The library functions that write a file they are given the path of: what a process runs once where the original
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
