"""A migrated file's tree is freed when its migration returns, by reference counting alone, and the garbage
collector is left as the caller had it.

A reference cycle through the analysis (its flows refer back to it; a generator's frame holding its object)
keeps the whole tree alive until a full collection: over many files, the collector then walks every live tree
again and again (0.4 s of the 100 benchmark scripts' 5 s, benchmarks/RESULTS.md).
"""

from __future__ import annotations

import gc
from pathlib import Path

import libcst as cst
import pytest

from mgpu_migrate.engine import migrate_source

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
# A file each target rewrites, and one that --to ddp leaves as it is (with diagnostics and their positions).
CASES = [
    ("scripts/flat_script.py", "ddp"),
    ("scripts/flat_script.py", "balanced"),
    ("shapes/subclasses.py", "ddp"),
    ("shapes/cutmix_rows.py", "ddp"),
]


def _live_modules() -> int:
    return sum(1 for thing in gc.get_objects() if type(thing) is cst.Module)


@pytest.mark.parametrize("name, target", CASES)
def test_the_tree_is_freed_without_the_garbage_collector(name, target):
    source = (FIXTURES / name).read_text()
    gc.collect()
    before = _live_modules()
    gc.disable()
    try:
        result = migrate_source(source, target, name)
        after = _live_modules()
    finally:
        gc.enable()
    assert result.error is None
    assert result.diagnostics or result.changed
    assert after == before, f"{after - before} parsed module(s) of {name} still alive: a reference cycle holds them"


def test_the_collector_is_left_as_the_caller_had_it():
    source = (FIXTURES / "scripts/flat_script.py").read_text()
    assert gc.isenabled()
    migrate_source(source, "ddp", "train.py")
    assert gc.isenabled()
    gc.disable()
    try:
        migrate_source(source, "ddp", "train.py")
        assert not gc.isenabled()
    finally:
        gc.enable()
