"""The registry of codes: every code a rule declares or the tool emits is registered and has its own page,
and every diagnostic is one short line."""

import functools
import importlib
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import mgpu_migrate

from mgpu_migrate.cli import main
from mgpu_migrate.diagnostics import Code, Review, Rewrite
from mgpu_migrate.codes import CODES, ERROR, RETIRED, REVIEW, REWRITE, lookup, registry
from mgpu_migrate.engine import migrate_source
from mgpu_migrate.rules import RULES
from tests.fixture_cases import cases

PACKAGE = Path(mgpu_migrate.__file__).parent
MAX_MESSAGE = 160
SECTIONS = {
    REWRITE: ("## What it does", "## Why is this bad?", "## Example", "## Use instead", "## Fix safety"),
    REVIEW: ("## Why it was left", "## What to do"),
    ERROR: ("## What happened", "## What to do"),
    RETIRED: ("## Why it is retired", "## What to do"),
}


# The tests that read every_run() run on one worker, which migrates the fixtures for them once.
EVERY_RUN = pytest.mark.xdist_group("every_run")


@functools.cache
def every_run():
    """Every fixture and every rule example, migrated as the tool runs them (once, when a test first asks)."""
    runs = [(case.id, migrate_source(case.source.read_text(), case.target, str(case.source), case.options)) for case in cases()]
    for rule in RULES:
        for index, example in enumerate(rule.EXAMPLES):
            runs.append((f"{rule.__name__}-{index}", migrate_source(example.before, example.target, "example.py", example.options)))
    return runs


def test_every_declared_code_is_registered_to_its_rule():
    for rule in RULES:
        for code in {rule.CODE, *rule.REVIEW_CODES}:
            assert code.code in CODES, f"{rule.__name__} declares {code.code}, which is not registered"
            assert CODES[code.code].rule == rule.__name__
            assert CODES[code.code].kind == (REWRITE if type(code) is Rewrite else REVIEW)
            assert (type(code) is Rewrite) == code.code.startswith("MGP1")


def _declared_codes():
    """Every code object at the top level of a module of the tool, with where it is."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        module = importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        found += [(f"{module.__name__}.{name}", value) for name, value in vars(module).items() if isinstance(value, Code)]
    for rule in RULES:
        found += [(f"{rule.__module__}.{rule.__name__}.CODE", rule.CODE)]
    return found


def test_no_code_is_declared_twice_and_every_declared_code_has_its_page():
    objects = {}
    for where, code in _declared_codes():
        assert objects.setdefault(code.code, code) is code, f"{code.code} is declared twice (again at {where})"
        # Declared but not a rule's: it would have no page (and no owner to say it).
        assert code.code in CODES and CODES[code.code].kind != ERROR, f"{where} ({code.code}) is no rule's code"
        if type(code) is Review:
            assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", code.name), f"{code.code}'s name {code.name!r}"
            assert code.summary and code.why and code.todo, f"{code.code}'s page lacks its summary, why or what to do"
    rewrites = [rule.CODE.code for rule in RULES if type(rule.CODE) is Rewrite]
    assert len(rewrites) == len(set(rewrites))


def test_the_registry_refuses_a_code_declared_twice():
    class Twice(RULES[0]):
        CODE = Rewrite(RULES[0].CODE.code)

    with pytest.raises(ValueError, match=f"{RULES[0].CODE.code} is declared twice"):
        registry([RULES[0], Twice])


def test_a_retired_number_is_never_reused():
    retired = next(code for code, info in CODES.items() if info.kind == RETIRED)

    class Reusing(RULES[0]):
        CODE = Rewrite(retired)

    with pytest.raises(ValueError, match=f"{retired} is retired"):
        registry([Reusing])


@EVERY_RUN
@pytest.mark.parametrize("code", sorted(code for code, info in CODES.items() if info.kind == RETIRED))
def test_a_retired_code_is_explained_never_emitted_and_its_noqa_is_harmless(code, tmp_path):
    explained = CliRunner().invoke(main, ["--explain", code])
    assert explained.exit_code == 0 and explained.output.startswith(f"# {code} (") and ": retired: " in explained.output
    assert code not in {d.code for _, result in every_run() for d in result.diagnostics}
    # A `# noqa` naming it, and a `select`/`ignore` of it, written when it was reported, still run as they did.
    script = tmp_path / "train.py"
    script.write_text(f"import torch.nn as nn\nmodel = nn.DataParallel(model)  # noqa: {code}\n")
    (tmp_path / "pyproject.toml").write_text(f'[tool.mgpu-migrate]\nignore = ["{code}"]\n' if code[3] != "1" else "")
    result = CliRunner().invoke(main, [str(script), "--to", "ddp", "--diff"])
    assert result.exit_code == 1 and "MGP101" in result.output, result.output


@EVERY_RUN
def test_every_emitted_code_is_registered():
    emitted = {d.code for _, result in every_run() for d in [*result.diagnostics, *filter(None, [result.error])]}
    assert emitted - set(CODES) == set()


@pytest.mark.parametrize("code", sorted(CODES))
def test_each_code_has_a_page_with_its_sections(code):
    info = CODES[code]
    assert re.fullmatch(r"MGP[0-3][0-9]{2}", code)
    assert info.page.startswith(f"# {code} ({info.name}): ")
    for section in SECTIONS[info.kind]:
        assert section in info.page, f"{code}'s page lacks {section!r}"
    assert info.summary and "\n" not in info.summary
    assert lookup(code.lower()) is info


@pytest.mark.parametrize("code", ["MGP001", "MGP101", "MGP232", "MGP264"])
def test_explain_prints_the_codes_own_page(code):
    result = CliRunner().invoke(main, ["--explain", code.lower()])
    assert result.exit_code == 0
    assert result.output == CODES[code].page


@pytest.mark.parametrize("arguments", [["--explain"], ["--list-codes"]])
def test_explain_without_a_code_lists_them_all(arguments):
    result = CliRunner().invoke(main, arguments)
    assert result.exit_code == 0
    listed = [line.split()[:2] for line in result.output.splitlines()]
    assert listed == [[info.code, info.kind] for info in CODES.values()]


def test_explain_an_unknown_code_is_a_usage_error():
    assert CliRunner().invoke(main, ["--explain", "MGP999"]).exit_code == 2
    assert lookup("MGP999") is None


@EVERY_RUN
def test_every_diagnostic_is_one_short_line():
    too_long = [
        f"{name}: {d.code} ({len(d.message)}) {d.message}"
        for name, result in every_run()
        for d in result.diagnostics
        if len(d.message) > MAX_MESSAGE or "\n" in d.message or "\r" in d.message
    ]
    assert too_long == []
