import pytest

from mgpu_runtime.emulation import data_parallel


@pytest.fixture
def emulate():
    """``emulate(W)``: W emulated devices and the emulated DataParallel for this test, uninstalled after it."""
    yield data_parallel.install
    data_parallel.uninstall()
