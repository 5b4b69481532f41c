import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--update-fixtures",
        action="store_true",
        help="rewrite the expected fixture outputs (fixtures/**/NAME.<target>.py and .diagnostics) from the tool",
    )


@pytest.fixture
def update_fixtures(request):
    return request.config.getoption("--update-fixtures")


def pytest_collection_modifyitems(config, items):
    """The slow (multi-process) tests first, each in its place among them, then the others: under xdist the
    long tests are spread from the start and the many short ones even out the end, instead of one worker
    finishing a long test alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _no_emulated_devices_left():
    """A test that made the runtime emulate devices (MGPU_CPU_REPLICAS, an in-process job) leaves none behind:
    the next test sees the machine as it is."""
    yield
    import sys

    emulated = sys.modules.get("mgpu_runtime.emulation.devices")
    if emulated is not None and emulated.count():
        emulated.uninstall()
