"""mgpu-migrate: move PyTorch training code off ``nn.DataParallel``."""

from mgpu_migrate._version import __version__

__all__ = ["__version__"]
