"""Discovery of the before/after fixture pairs under fixtures/.

A case is ``NAME.py`` (the input) with, for each target, ``NAME.<target>.py`` (the expected output; a file
the tool leaves alone has none) and ``NAME.<target>.diagnostics`` (expected ``line:col: CODE`` lines).
Adding a case is adding files; ``pytest --update-fixtures`` writes the expected files from the tool's
current output, to be reviewed in the diff.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mgpu_migrate.options import TARGETS

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


@dataclass(frozen=True)
class Case:
    source: Path
    target: str

    @property
    def id(self) -> str:
        return f"{self.source.relative_to(FIXTURES).with_suffix('')}-{self.target}"

    @property
    def expected(self) -> Path:
        return self.source.with_name(f"{self.source.stem}.{self.target}.py")

    @property
    def expected_diagnostics(self) -> Path:
        return self.source.with_name(f"{self.source.stem}.{self.target}.diagnostics")


def is_input(path: Path) -> bool:
    return path.suffix == ".py" and not any(path.stem.endswith(f".{target}") for target in TARGETS)


def cases() -> list[Case]:
    inputs = sorted(p for p in FIXTURES.rglob("*.py") if is_input(p))
    return [Case(source, target) for source in inputs for target in TARGETS]
