"""torchvision, as far as the fixtures use it (``torchvision.utils``)."""
