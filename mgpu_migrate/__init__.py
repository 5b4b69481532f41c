"""mgpu-migrate: move PyTorch training code off ``nn.DataParallel``."""

__version__ = "0.1.0"
