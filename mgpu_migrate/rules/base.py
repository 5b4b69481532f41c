"""What every rule is: a code, a one-line description, its doc, and examples that are also its tests."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst

from mgpu_migrate.analysis import FileAnalysis
from mgpu_migrate.edits import Edits
from mgpu_migrate.options import DEFAULT_OPTIONS, Options

BALANCED = "balanced"
DDP = "ddp"
TARGETS = (BALANCED, DDP)


@dataclass(frozen=True)
class Example:
    """A before/after pair for one target; ``after=None`` means the rule leaves the code as it is.

    ``codes`` lists the diagnostic codes the example must produce (rewrite and review codes alike);
    ``options`` are the user's choices the example runs with (``--sync-bn`` ...).
    """

    before: str
    after: str | None
    target: str
    codes: tuple[str, ...] = ()
    options: Options = DEFAULT_OPTIONS


class Rule(ABC):
    """Base class. The class docstring is the rule's documentation (shown by ``--explain CODE``) and
    follows fixed sections: What it does / Why is this bad? / Example / Use instead / Fix safety."""

    CODE: ClassVar[str]
    # Codes the rule emits for sites it leaves alone, with what each means.
    REVIEW_CODES: ClassVar[dict[str, str]] = {}
    DESCRIPTION: ClassVar[str]
    TARGETS: ClassVar[tuple[str, ...]] = TARGETS
    EXAMPLES: ClassVar[tuple[Example, ...]] = ()

    def __init__(self, target: str, analysis: FileAnalysis, edits: Edits, options: Options = DEFAULT_OPTIONS) -> None:
        self.target = target
        self.analysis = analysis
        self.edits = edits
        self.options = options

    @abstractmethod
    def apply(self) -> None:
        """Record this rule's edits and diagnostics for the file."""

    # -- helpers for subclasses ------------------------------------------------------------------
    def rewrite_allowed(self, node: cst.CSTNode, code: str | None = None) -> bool:
        """False when a ``# noqa`` comment at the site silences this rewrite."""
        return not self.analysis.silenced(node, code or self.CODE)

    def rewrote(self, node: cst.CSTNode, message: str, code: str | None = None) -> None:
        line, col = self.analysis.position(node)
        self.edits.report(line, col, code or self.CODE, message)

    def left(self, node: cst.CSTNode, code: str, message: str) -> None:
        """Report a site this rule did not rewrite, unless a ``# noqa`` silences the code there."""
        if self.analysis.silenced(node, code):
            return
        line, col = self.analysis.position(node)
        self.edits.report(line, col, code, message)
