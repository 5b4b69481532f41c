"""The rewrite rules, one module each, run in this order over one shared analysis."""

from __future__ import annotations

from mgpu_migrate.rules.base import TARGETS, Rule
from mgpu_migrate.rules.wrapper_swap import WrapperSwap

RULES: tuple[type[Rule], ...] = (WrapperSwap,)


def rules_for(target: str) -> list[type[Rule]]:
    return [rule for rule in RULES if target in rule.TARGETS]


def rule_for_code(code: str) -> type[Rule] | None:
    """The rule that rewrites with ``code`` or reports it for review."""
    code = code.upper()
    for rule in RULES:
        if rule.CODE == code or code in rule.REVIEW_CODES:
            return rule
    return None


__all__ = ["RULES", "TARGETS", "Rule", "rule_for_code", "rules_for"]
