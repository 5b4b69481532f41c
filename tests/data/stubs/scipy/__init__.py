"""scipy, as far as the fixtures use it: ``scipy.io``'s savemat and loadmat."""
