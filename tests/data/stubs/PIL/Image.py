"""PIL.Image's fromarray and an image's save (an animation of frames too), as far as the fixtures use them."""

import numpy as np


class Image:
    def __init__(self, array):
        self.array = np.asarray(array)

    def save(self, fp, format=None, save_all=False, append_images=(), **kwargs):
        frames = [self.array, *(image.array for image in append_images)] if save_all else [self.array]
        with open(fp, "xb") as handle:
            np.save(handle, np.stack(frames))


def fromarray(array, mode=None):
    return Image(array)
