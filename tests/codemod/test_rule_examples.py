"""Each rule's own examples (its documentation) are checked as tests, Fixit-style: each runs through the wrap
rules and its own rule only (a check also through the program rules), so a new rule never changes them."""

import inspect

import pytest

from mgpu_migrate.diagnostics import REVIEW_PREFIXES, Review, Rewrite
from mgpu_migrate.pipeline import run_pipeline
from mgpu_migrate.rules import RULES
from mgpu_migrate.rules.base import PHASES

EXAMPLES = [(rule, example) for rule in RULES for example in rule.EXAMPLES]


def example_id(item):
    rule, example = item
    return f"{rule.CODE.code}-{example.target}-{rule.EXAMPLES.index(example)}"


def isolated(rule, example, source):
    return run_pipeline(source, example.target, "example.py", example.options, only=(rule,))


@pytest.mark.parametrize("item", EXAMPLES, ids=[example_id(item) for item in EXAMPLES])
def test_rule_example(item):
    rule, example = item
    result = isolated(rule, example, example.before)
    assert result.error is None
    assert result.output == (example.after if example.after is not None else example.before)
    assert sorted({d.code for d in result.diagnostics}) == sorted(set(example.codes))
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
    # Examples are written as dedented blocks, each ending its last line.
    assert all(example.before.endswith("\n") and not example.before.startswith("\n") for example in rule.EXAMPLES)
