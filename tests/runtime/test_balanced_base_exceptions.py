"""A SystemExit or KeyboardInterrupt raised inside one balanced replica (a thread) reaches the caller, with the
replica named, instead of vanishing and resurfacing later as an AttributeError on a missing output."""

from __future__ import annotations

import sys

import pytest

from mgpu_runtime import DataParallelModel
from tests.runtime.conftest_balanced import Classifier, features, use_cpu_replicas


@pytest.fixture
def three_replicas(monkeypatch):
    use_cpu_replicas(monkeypatch, 3)


class ExitsOnNegativeFirstFeature(Classifier):
    def __init__(self, stop):
        super().__init__()
        self.stop = stop

    def forward(self, x):
        if (x[:, 0] < 0).all():
            self.stop()
        return super().forward(x)


def _third_piece_negative():
    x = features(6).abs()
    x[4:, 0] = -1.0
    return x


def test_sys_exit_in_a_replica_exits_with_its_code_and_names_the_replica(three_replicas):
    with pytest.raises(SystemExit) as caught:
        DataParallelModel(ExitsOnNegativeFirstFeature(lambda: sys.exit(3)))(_third_piece_negative())
    assert caught.value.code == 3
    assert isinstance(caught.value.__cause__, SystemExit)
    if sys.version_info >= (3, 11):
        assert caught.value.__notes__ == ["in cpu replica 2: SystemExit: 3"]


def test_keyboard_interrupt_in_a_replica_is_raised_naming_the_replica(three_replicas):
    def interrupt():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt, match="in cpu replica 2: KeyboardInterrupt"):
        DataParallelModel(ExitsOnNegativeFirstFeature(interrupt))(_third_piece_negative())
