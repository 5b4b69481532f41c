"""Positions after an in-place rewrite: a diagnostic found in the old text, moved to its line in the new one."""

from __future__ import annotations

import difflib
from dataclasses import replace

from mgpu_migrate.diagnostics import LINE_BREAK, Diagnostic


def moved_to_new_lines(diagnostics: list[Diagnostic], before: str, after: str) -> list[Diagnostic]:
    """``diagnostics`` (positions in ``before``) with their lines as they are in ``after``.

    A line kept as it was keeps its place; a rewritten line maps to the most alike line of its replacement
    (``model = nn.DataParallel(model)`` to ``model = mgpu_runtime.DistributedDataParallel(model)``, not to an
    import added above it); a removed line to the line now in its place.
    """
    old, new = LINE_BREAK.split(before), LINE_BREAK.split(after)
    # autojunk (the default) keeps this linear on huge files with many repeated lines (blank lines, `return`).
    blocks = difflib.SequenceMatcher(None, old, new).get_opcodes()

    def moved(line: int) -> int:
        index = line - 1
        for tag, i1, i2, j1, j2 in blocks:
            if i1 <= index < i2:
                if tag == "equal":
                    return j1 + (index - i1) + 1
                if tag == "replace":
                    alike = difflib.SequenceMatcher(None, old[index])
                    return max(range(j1, j2), key=lambda j: (alike.set_seq2(new[j]), alike.ratio())[1]) + 1
                return min(j1, len(new) - 1) + 1
        return line

    return [replace(d, line=moved(d.line)) for d in diagnostics]
