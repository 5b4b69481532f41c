"""MGP350 and MGP351: what the file's ``# noqa`` comments did, said where it reaches past their line."""

from __future__ import annotations

from mgpu_migrate.rules.base import CHECKS, DDP, Example, Review, Rule

UNUSED_NOQA = Review(
    "MGP350",
    name="unused-noqa",
    summary="a `# noqa` code that silences nothing at its line, or no code of mgpu-migrate",
    why=(
        "The rule that has the code looked at this file and found nothing at that line to silence, or the code "
        "is none of mgpu-migrate's; the comment does nothing (ruff's RUF100)."
    ),
    todo=(
        "Remove the code from the comment, or correct it (`--list-codes`). Codes of other tools and a bare "
        "`# noqa` are left alone."
    ),
)
KEPT_BY_NOQA = Review(
    "MGP351",
    name="wrap-kept-by-noqa",
    summary="a `# noqa` keeps this DataParallel wrap, so --to ddp leaves the whole file as it is",
    why=(
        "`--to ddp` migrates a file entirely or not at all: a DataParallel wrap that a `# noqa` keeps leaves every "
        "other site of the file as it was, which the comment on one line does not show."
    ),
    todo=(
        "Remove the `# noqa` from the wrap to migrate the file, or add MGP351 to it (`# noqa: MGP101, MGP351`) "
        "when the file is to stay DataParallel."
    ),
)


class NoqaComments(Rule):
    """
    ## What it does
    Reports the ``# noqa: CODE`` comments of a migrated file that silence nothing: a code no rewrite or review
    at that line has (a typo, a line that moved, a site the tool now handles), or a code mgpu-migrate does not
    have (MGP350). And under ``--to ddp``, a ``# noqa`` that keeps a DataParallel wrap, which leaves the whole
    file as it is (MGP351): the comment's reach is the file, not its line.

    ## Why is this bad?
    A comment that silences nothing misleads its reader, and stays when its reason is gone (ruff's RUF100).
    A wrap kept by ``# noqa`` keeps every other site of the file as it was too, with no other line printed:
    nothing would say why the file did not change.

    ## Example
    ```python
    model = nn.DataParallel(model)  # noqa: MGP101
    criterion = nn.CrossEntropyLoss()  # noqa: MGP999
    ```

    ## Use instead
    Remove a ``# noqa`` that silences nothing, or name the code the line has. Remove the one on the wrap to
    migrate the file, or add ``MGP351`` to it (``# noqa: MGP101, MGP351``) to say the file stays on purpose.

    ## Fix safety
    Nothing is rewritten. Codes of other tools (``F401``) and a bare ``# noqa`` are not judged; an MGP code is
    judged only when the rule that has it looked at a site of the file, so a comment is never called unused
    because its rule did not run.
    """

    CODE = UNUSED_NOQA
    PHASE = CHECKS
    REVIEW_CODES = (UNUSED_NOQA, KEPT_BY_NOQA)
    DESCRIPTION = "# noqa comments that silence nothing, or that keep a whole file"
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model)  # noqa: MGP101
            """,
            None,
            DDP,
            (KEPT_BY_NOQA.code,),
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.DataParallel(model)  # noqa: MGP999
            print(model)  # noqa: MGP101, F401
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DataParallelModel(model)  # noqa: MGP999
            print(model)  # noqa: MGP101, F401
            """,
            "balanced",
            ("MGP101", UNUSED_NOQA.code, UNUSED_NOQA.code),
        ),
    )

    def apply(self) -> None:
        noqa = self.analysis.noqa
        if not noqa:
            return
        if self.target == DDP and self.program.left_whole:
            for call in self.program.kept:
                self._kept_by_noqa(call)
        from mgpu_migrate.codes import lookup  # the registry reads every rule: imported when a noqa is judged

        used, asked = self.analysis.noqa_used, self.analysis.noqa_asked
        for line, codes in sorted(noqa.items()):
            for code in sorted(codes or ()):
                if not code.startswith("MGP") or (line, code) in used:
                    continue
                if lookup(code) is None:
                    self.left_at_line(line, UNUSED_NOQA, f"`# noqa: {code}`: mgpu-migrate has no code {code} (--list-codes)")
                elif code in asked:
                    self.left_at_line(line, UNUSED_NOQA, f"`# noqa: {code}` silences nothing on this line: remove it")

    def _kept_by_noqa(self, call) -> None:
        lines = self.analysis.noqa_lines(call)
        self.analysis.noqa_asked.add(KEPT_BY_NOQA.code)
        silenced = sorted({code for line, code in self.analysis.noqa_used if line in lines})
        if not silenced:
            return  # kept for a reason a diagnostic of its own gives (dim != 0, a subclass ...)
        for line in lines:
            if KEPT_BY_NOQA.code in (self.analysis.noqa.get(line) or ()):
                self.analysis.noqa_used.add((line, KEPT_BY_NOQA.code))  # said on purpose: the file stays
                return
        self.left(
            call,
            KEPT_BY_NOQA,
            f"the `# noqa` here ({', '.join(silenced)}) keeps this DataParallel, so the whole file is left as it is: "
            f"remove it, or add {KEPT_BY_NOQA.code} to mean it",
        )
