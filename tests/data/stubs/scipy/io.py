"""scipy.io's savemat and loadmat, as far as the fixtures use them: the arrays pickled, each file created
exclusively, so a second process writing it fails the run."""

import pickle

import numpy as np


def savemat(file_name, mdict, **kwargs):
    with open(file_name, "xb") as handle:
        pickle.dump({key: np.asarray(value) for key, value in mdict.items()}, handle)


def loadmat(file_name, **kwargs):
    with open(file_name, "rb") as handle:
        return pickle.load(handle)
