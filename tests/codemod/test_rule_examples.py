"""Each rule's own examples (its documentation) are checked as tests, Fixit-style: each runs through the wrap
rules and its own rule only (a check also through the program rules), so a new rule never changes them."""

import ast
import importlib
import inspect

import pytest

from mgpu_migrate.diagnostics import REVIEW_PREFIXES, Review, Rewrite
from mgpu_migrate.pipeline import run_pipeline
from mgpu_migrate.rules import RULES
from mgpu_migrate.rules.base import PHASES

EXAMPLES = [(rule, example) for rule in RULES for example in rule.EXAMPLES]


def example_id(item):
    rule, example = item
    return example.name or f"{rule.CODE.code}-{example.target}-{rule.EXAMPLES.index(example)}"


def isolated(rule, example, source):
    return run_pipeline(source, example.target, "example.py", example.options, only=(rule,))


@pytest.mark.parametrize("item", EXAMPLES, ids=[example_id(item) for item in EXAMPLES])
def test_rule_example(item):
    rule, example = item
    result = isolated(rule, example, example.before)
    assert result.error is None
    assert result.output == (example.after if example.after is not None else example.before)
    assert sorted({d.code for d in result.diagnostics}) == sorted(set(example.codes))
    if example.message is not None or example.line is not None:
        said = [(d.line, d.message) for d in result.diagnostics]
        assert any(
            (example.message is None or example.message in message) and example.line in (None, line)
            for line, message in said
        ), said
    assert isolated(rule, example, result.output).output == result.output


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.CODE.code)
def test_rule_is_documented(rule):
    doc = inspect.cleandoc(rule.__doc__ or "")
    for section in ("## What it does", "## Why is this bad?", "## Example", "## Use instead", "## Fix safety"):
        assert section in doc, f"{rule.__name__} doc lacks {section!r}"
    assert rule.DESCRIPTION and rule.EXAMPLES
    assert rule.PHASE in PHASES
    # A rule rewrites under an MGP1 code, or only reports: then its code is one of its review codes.
    assert type(rule.CODE) is Rewrite or rule.CODE in rule.REVIEW_CODES
    assert all(type(code) is Review and code.code.startswith(REVIEW_PREFIXES) for code in rule.REVIEW_CODES)
    assert all(example.before.endswith("\n") for example in rule.EXAMPLES)


def test_examples_are_written_as_indented_blocks():
    """``before`` and ``after`` are triple-quoted blocks starting on a new line (dedented by ``Example``), or another
    example's code; not strings of ``\\n`` escapes, which no reader can check by eye."""
    for module in sorted({rule.__module__ for rule in RULES}):
        tree = ast.parse(inspect.getsource(importlib.import_module(module)))
        for call in ast.walk(tree):
            if type(call) is ast.Call and type(call.func) is ast.Name and call.func.id == "Example":
                for code in call.args[:2]:
                    if type(code) is ast.Constant and code.value is not None:
                        assert code.value.startswith("\n"), f"{module}, line {code.lineno}: not a block"
