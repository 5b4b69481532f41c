"""Discovery of the before/after fixture pairs under fixtures/.

A case is ``NAME.py`` (the input) with, for each target, ``NAME.<target>.py`` (the expected output; a file
the tool leaves alone has none) and ``NAME.<target>.diagnostics`` (expected ``line:col: CODE`` lines).
Adding a case is adding files; ``pytest --update-fixtures`` writes the expected files from the tool's
current output, to be reviewed in the diff.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mgpu_migrate.options import DDP, DEFAULT_OPTIONS, RUNTIME_STYLE, TARGETS, TORCH_STYLE, Options

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
# The test harness's sitecustomize (the garbage collector's settings: tests/data/harness/sitecustomize.py), on the
# PYTHONPATH of every process the suite starts.
HARNESS = ROOT / "tests" / "data" / "harness"


@dataclass(frozen=True)
class Case:
    source: Path
    target: str
    style: str = RUNTIME_STYLE

    @property
    def variant(self) -> str:
        """``ddp``, or ``ddp-torch`` for ``--to ddp --style torch``."""
        return self.target if self.style == RUNTIME_STYLE else f"{self.target}-{self.style}"

    @property
    def options(self) -> Options:
        return DEFAULT_OPTIONS if self.style == RUNTIME_STYLE else Options(style=self.style)

    @property
    def id(self) -> str:
        return f"{self.source.relative_to(FIXTURES).with_suffix('')}-{self.variant}"

    @property
    def expected(self) -> Path:
        return self.source.with_name(f"{self.source.stem}.{self.variant}.py")

    @property
    def expected_diagnostics(self) -> Path:
        return self.source.with_name(f"{self.source.stem}.{self.variant}.diagnostics")


# The scripts also run through --to ddp --style torch (NAME.ddp-torch.py); the shapes and projects do not.
TORCH_STYLE_FIXTURES = FIXTURES / "scripts"
_VARIANTS = (*TARGETS, f"{DDP}-{TORCH_STYLE}")


def is_input(path: Path) -> bool:
    return path.suffix == ".py" and not any(path.stem.endswith(f".{variant}") for variant in _VARIANTS)


def cases() -> list[Case]:
    inputs = sorted(p for p in FIXTURES.rglob("*.py") if is_input(p))
    torch_style = [Case(source, DDP, TORCH_STYLE) for source in inputs if source.parent == TORCH_STYLE_FIXTURES]
    return [Case(source, target) for source in inputs for target in TARGETS] + torch_style
