"""Each rule's own examples (its documentation) are checked as tests, Fixit-style."""

import inspect

import pytest

from mgpu_migrate.engine import migrate_source
from mgpu_migrate.rules import RULES

EXAMPLES = [(rule, example) for rule in RULES for example in rule.EXAMPLES]


def example_id(item):
    rule, example = item
    return f"{rule.CODE}-{example.target}-{rule.EXAMPLES.index(example)}"


@pytest.mark.parametrize("item", EXAMPLES, ids=[example_id(item) for item in EXAMPLES])
def test_rule_example(item):
    rule, example = item
    result = migrate_source(example.before, example.target, "example.py", options=example.options)
    assert result.error is None
    assert result.output == (example.after if example.after is not None else example.before)
    assert sorted({d.code for d in result.diagnostics}) == sorted(set(example.codes))
    again = migrate_source(result.output, example.target, "example.py", options=example.options)
    assert again.output == result.output


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.CODE)
def test_rule_is_documented(rule):
    doc = inspect.cleandoc(rule.__doc__ or "")
    for section in ("## What it does", "## Why is this bad?", "## Example", "## Use instead", "## Fix safety"):
        assert section in doc, f"{rule.__name__} doc lacks {section!r}"
    assert rule.DESCRIPTION and rule.EXAMPLES
    # A rule rewrites under an MGP1 code, or only reports: then its code is one of its review codes.
    assert rule.CODE.startswith("MGP1") or rule.CODE in rule.REVIEW_CODES
    assert all(code.startswith("MGP2") for code in rule.REVIEW_CODES)
