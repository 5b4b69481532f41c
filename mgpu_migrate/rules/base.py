"""What every rule is: a code, its phase, a one-line description, its doc, and examples that are also its tests.

The pipeline runs rules in three phases, each phase seeing only what the earlier ones decided:

* ``WRAPS``: each wrap and criterion site is decided on its own (rewritten, or left with a reason);
* ``PROGRAM`` (``--to ddp``): the rules that make the file a distributed program (set-up, data, saves,
  guards ...); they receive the file's one verdict, ``self.program`` (``mgpu_migrate.program``);
* ``CHECKS``: rules that review the file as the earlier phases rewrite it (``self.rewritten``).
"""

from __future__ import annotations

import textwrap
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst

from mgpu_migrate.analysis import FileAnalysis
from mgpu_migrate.diagnostics import Code, Review, Rewrite
from mgpu_migrate.edits import Edits
from mgpu_migrate.options import BALANCED, DDP, DEFAULT_OPTIONS, RUNTIME_STYLE, STYLES, TARGETS, TORCH_STYLE, Options
from mgpu_migrate.program import Program, on_own_path

WRAPS, PROGRAM, CHECKS = "wraps", "program", "checks"
PHASES = (WRAPS, PROGRAM, CHECKS)
# The analyses of ``FileAnalysis`` a rule declares in ``USES``: each is built on first use, for every rule after.
ANALYSES = ("bindings", "entry_point", "flow", "handed", "loaders", "losses", "models", "values")


@dataclass(frozen=True)
class Example:
    """A before/after pair for one target; ``after=None`` means the rule leaves the code as it is.

    ``before`` and ``after`` are written as indented triple-quoted blocks that start on a new line: they are
    dedented here. The example runs through the wrap rules and its own rule only (the other program rules and
    checks do not run), so adding a rule never changes another rule's examples. ``codes`` lists the diagnostic
    codes that run produces (rewrite and review codes alike); ``options`` are the user's choices it runs with
    (``--sync-bn`` ...); ``message`` and ``line`` pin what one of its diagnostics says, and where.
    """

    before: str
    after: str | None
    target: str
    codes: tuple[str | Code, ...] = ()
    options: Options = DEFAULT_OPTIONS
    # What one of the run's diagnostics says (a part of its message) and on which line, as Fixit's
    # ``Invalid(expected_message=..., range=...)``: a message is the site's own facts, which a code cannot pin.
    message: str | None = None
    line: int | None = None
    # The test's name (else the rule's code, the target and the example's index).
    name: str | None = None

    def __post_init__(self) -> None:
        # A code object or its number: another rule's code is named by its number (rules never import each other).
        object.__setattr__(self, "codes", tuple(code if isinstance(code, str) else code.code for code in self.codes))
        object.__setattr__(self, "before", _dedented(self.before))
        if self.after is not None:
            object.__setattr__(self, "after", _dedented(self.after))


def _dedented(code: str) -> str:
    return textwrap.dedent(code).lstrip("\n") if code.startswith("\n") else code


class Rule(ABC):
    """Base class. The class docstring is the rule's documentation (shown by ``--explain CODE``) and
    follows fixed sections: What it does / Why is this bad? / Example / Use instead / Fix safety."""

    # Its rewrite code, or, for a rule that only reports, its main review code (one of REVIEW_CODES).
    CODE: ClassVar[Code]
    PHASE: ClassVar[str]
    # The codes the rule emits for sites it leaves alone (each declared once, in the rule's module).
    REVIEW_CODES: ClassVar[tuple[Review, ...]] = ()
    # The analyses of the file it reads (``self.analysis.<name>``, in the rule and its module's functions), after
    # LibCST's METADATA_DEPENDENCIES: some of ``ANALYSES``. What every rule may read is not named (the tree,
    # ``resolve``, ``calls``, ``calls_to``, ``code_of``, ``position``). ``tests/test_rules_stand_alone.py`` holds it
    # to what the code reads.
    USES: ClassVar[tuple[str, ...]] = ()
    DESCRIPTION: ClassVar[str]
    TARGETS: ClassVar[tuple[str, ...]] = TARGETS
    # The ``--style`` values it runs under (a ``--to ddp`` rule that writes runtime calls has a torch twin).
    STYLES: ClassVar[tuple[str, ...]] = STYLES
    EXAMPLES: ClassVar[tuple[Example, ...]] = ()

    def __init__(
        self,
        target: str,
        analysis: FileAnalysis,
        edits: Edits,
        options: Options = DEFAULT_OPTIONS,
        program: Program | None = None,
        rewritten: frozenset[cst.CSTNode] = frozenset(),
        reported: frozenset[Code] = frozenset(),
    ) -> None:
        self.target = target
        self.analysis = analysis
        self.edits = edits
        self.options = options
        self._program = program
        # The nodes the earlier phases rewrote (criteria handed to the runtime, loaders split ...).
        self.rewritten = rewritten
        # A check's: the codes the earlier phases reported (read by what they say, never by number).
        self.reported = reported

    @property
    def program(self) -> Program:
        """The file's verdict, which the program rules and the checks receive (the wrap rules decide it)."""
        if self._program is None:
            raise TypeError(f"{type(self).__name__} is a {self.PHASE} rule: the verdict comes after the wrap rules")
        return self._program

    @abstractmethod
    def apply(self) -> None:
        """Record this rule's edits and diagnostics for the file."""

    # -- helpers for subclasses ------------------------------------------------------------------
    def rewrite_allowed(self, node: cst.CSTNode, code: Code | None = None) -> bool:
        """False when a ``# noqa`` comment at the site silences this rewrite, or when the site is on the own
        distributed path that the file starts itself beside its migrated fallback (``Program.beside``): that path
        stays the script's."""
        if self._program is not None and self._program.beside is not None and on_own_path(self.analysis, self._program.beside, node):
            return False
        return not self.analysis.silenced(node, (code or self.CODE).code)

    def rewrote(self, node: cst.CSTNode, message: str, code: Rewrite | None = None) -> None:
        self.edits.report_at(node, code or self.CODE, message)

    def left(self, node: cst.CSTNode, code: Review, message: str) -> None:
        """Report a site this rule did not rewrite, unless a ``# noqa`` silences the code there."""
        if self.analysis.silenced(node, code.code):
            return
        self.edits.report_at(node, code, message)

    def left_at_line(self, line: int, code: Review, message: str) -> None:
        """Report a line of the file itself (a comment, which is no node): what a ``# noqa`` there said."""
        self.edits.report(line, 1, code, message)


# The targets and styles are re-exported for the rules, which name them beside the phases.
__all__ = [
    "ANALYSES",
    "BALANCED",
    "CHECKS",
    "DDP",
    "PHASES",
    "PROGRAM",
    "RUNTIME_STYLE",
    "TARGETS",
    "TORCH_STYLE",
    "WRAPS",
    "Example",
    "Review",
    "Rewrite",
    "Rule",
]
