import os

import pytest

# One thread for torch's operations, in the workers and in every process a test starts (they inherit it; torchrun
# sets the same for its workers): the suite runs two workers on two cores, whose processes would otherwise each
# run a thread per core against the others'. A test that needs another value sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The test harness's sitecustomize (tests/data/harness), first on the PYTHONPATH of every process a test starts: the
# garbage collector runs less often while torch is imported, and leaves the objects still alive at the exit out of
# its last collections: 30% of the CPU time of a short torchrun job. A test that sets its own PYTHONPATH puts
# HARNESS first too (tests/fixture_cases.py).
_HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "harness")
if _HARNESS not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_HARNESS, os.environ.get("PYTHONPATH")]))


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
        balanced = sys.modules.get("mgpu_runtime.balanced.devices")
        if balanced is not None:
            balanced._emulating = False


@pytest.fixture(scope="session")
def e2e_runs(tmp_path_factory):
    """Every end-to-end training run (``tests/codemod/e2e_runs.py``), started at once, the first time a test of
    the xdist group ``e2e`` asks: the tests of that group run on one worker and share them."""
    pytest.importorskip("torch")
    from tests.codemod.e2e_runs import run_all

    runs = run_all(tmp_path_factory.mktemp("e2e"))
    assert not runs.problems, "\n\n".join(runs.problems)
    return runs
