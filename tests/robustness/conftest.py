"""The full sweep (marker ``robustness``) runs only when asked for: ``pytest -m robustness`` or
``MGPU_ROBUSTNESS=1``. Everything else in this folder is the quick slice that CI runs."""

import os

import pytest


def pytest_collection_modifyitems(config, items):
    asked = "robustness" in (config.getoption("markexpr") or "").replace("not robustness", "")
    if asked or os.environ.get("MGPU_ROBUSTNESS"):
        return
    skip = pytest.mark.skip(reason="the full robustness sweep is opt-in: pytest -m robustness, or MGPU_ROBUSTNESS=1")
    for item in items:
        if item.get_closest_marker("robustness"):
            item.add_marker(skip)
