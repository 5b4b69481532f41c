"""Small builders the rules share for the code they write: runtime calls, arguments, conditions."""

from __future__ import annotations

from typing import Any, Optional

import libcst as cst

from mgpu_migrate.diagnostics import Rewrite

RUNTIME = "mgpu_runtime"
# An object that writes, built on the main process only behind a stand-in (``mgpu_runtime.main_process_only``):
# the code of ``WriterObjects`` (a SummaryWriter), also reported for a project's writer class (MGP132's rule).
MAIN_PROCESS_OBJECT = Rewrite("MGP135")

# Expressions that bind more loosely than `or` and need parentheses as one of its operands.
_LOOSER_THAN_OR = (cst.IfExp, cst.Lambda, cst.NamedExpr)
# Parents in which a `not ...` expression needs parentheses (it binds more loosely than these).
_TIGHTER_THAN_NOT = (cst.Comparison, cst.ComparisonTarget, cst.BinaryOperation, cst.Attribute, cst.Subscript, cst.Await)


def gives_download(call: cst.Call) -> bool:
    """``X(..., download=True)``, or given any value but a constant ``False``, ``None`` or ``0``: a dataset that
    downloads what it lacks when built (MGP137's; MGP132's rule leaves such a build to it)."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "download":
            value = arg.value
            falsy = (type(value) is cst.Name and value.value in ("False", "None")) or (type(value) is cst.Integer and value.value == "0")
            return not falsy
    return False


def runtime_attr(name: str) -> cst.Attribute:
    """``mgpu_runtime.<name>``."""
    return cst.Attribute(value=cst.Name(RUNTIME), attr=cst.Name(name))


def runtime_call(name: str, *args: cst.BaseExpression) -> cst.Call:
    """``mgpu_runtime.<name>(args...)``."""
    return cst.Call(runtime_attr(name), [cst.Arg(arg) for arg in args])


def on_the_main_process(
    statements: list[cst.BaseStatement], wait: bool = True, waiter: str = "barrier"
) -> list[cst.BaseStatement]:
    """``statements`` under ``if mgpu_runtime.is_main_process():`` (the first one's leading lines and comments
    above the ``if``), then, when the others wait for what they did, ``mgpu_runtime.barrier()`` (or ``waiter``:
    ``wait_for_main_process``, which waits with no time limit, after work that may take long)."""
    first, *rest = statements
    block = cst.IndentedBlock([first.with_changes(leading_lines=()), *rest])
    guarded: list[cst.BaseStatement] = [cst.If(runtime_call("is_main_process"), block, leading_lines=first.leading_lines)]
    if wait:
        guarded.append(cst.SimpleStatementLine([cst.Expr(runtime_call(waiter))]))
    return guarded


def wrap_in_runtime(name: str):
    """A replacement that wraps an expression in ``mgpu_runtime.<name>(...)``, keeping its parentheses outside."""

    def wrap(updated: cst.CSTNode) -> cst.CSTNode:
        inner = updated.with_changes(lpar=[], rpar=[])
        return cst.Call(func=runtime_attr(name), args=[cst.Arg(inner)], lpar=updated.lpar, rpar=updated.rpar)

    return wrap


def parse(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def operand(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``expr`` ready to be an operand of ``or`` or a branch of ``... if ... else ...``: parenthesized when it
    binds more loosely (a ternary, a lambda, ``:=``)."""
    if isinstance(expr, _LOOSER_THAN_OR) and not expr.lpar:
        return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return expr


def either(condition: cst.BaseExpression, alternative: str) -> cst.BooleanOperation:
    """``condition or <alternative>``."""
    return cst.BooleanOperation(operand(condition), cst.Or(), parse(alternative))


def both(condition: cst.BaseExpression, alternative: cst.BaseExpression) -> cst.BooleanOperation:
    """``condition and <alternative>``, the condition parenthesized where it binds more loosely than ``and``."""
    if type(condition) is cst.BooleanOperation and type(condition.operator) is cst.Or and not condition.lpar:
        condition = condition.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.BooleanOperation(operand(condition), cst.And(), alternative)


def negated(expr: cst.BaseExpression, parent: Optional[cst.CSTNode]) -> cst.BaseExpression:
    """``not expr``, parenthesized when its parent binds more tightly than ``not``."""
    result = cst.UnaryOperation(cst.Not(), expr)
    if isinstance(parent, _TIGHTER_THAN_NOT) or (
        type(parent) is cst.UnaryOperation and type(parent.operator) is not cst.Not
    ):
        result = result.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return result


def keyword(call: cst.Call, name: str) -> Optional[cst.Arg]:
    return next((arg for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)


def argument(call: cst.Call, name: str, position: Optional[int]) -> Optional[cst.Arg]:
    """The argument bound to parameter ``name``, passed by keyword or at ``position`` (None if unknown)."""
    found = keyword(call, name)
    if found is not None or position is None:
        return found
    leading = []
    for arg in call.args:
        if arg.keyword is not None or arg.star:
            break
        leading.append(arg)
    return leading[position] if position < len(leading) else None


def has_star_args(call: cst.Call) -> bool:
    return any(arg.star for arg in call.args)


def with_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """``call`` with ``name=value`` appended, laid out like the arguments before it."""
    new = cst.Arg(
        value, keyword=cst.Name(name), equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
    )
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    if type(last.comma) is cst.Comma:
        # A trailing comma (one argument a line): the new one goes on its own line, laid out the same.
        separator = args[-2].comma if len(args) > 1 and type(args[-2].comma) is cst.Comma else last.comma
        args[-1] = last.with_changes(comma=separator)
        args.append(new.with_changes(comma=last.comma))
    else:
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(new)
    return call.with_changes(args=args)


def keep_arguments(call: cst.Call, kept: list[int]) -> list[cst.Arg]:
    """The arguments of ``call`` at the ``kept`` indices, the list closed as the original was.

    When the arguments after the last kept one are dropped, the new last argument ends the list the way the
    old last one did (with or without a trailing comma, the closing parenthesis where it was), and keeps its
    own trailing comment; comments of dropped arguments go with them.
    """
    args = [call.args[index] for index in kept]
    if not args or kept[-1] == len(call.args) - 1:
        return args
    own, closing = args[-1], call.args[-1]
    comma = closing.comma
    own_comment = (
        type(own.comma) is cst.Comma
        and type(own.comma.whitespace_after) is cst.ParenthesizedWhitespace
        and own.comma.whitespace_after.first_line.comment is not None
    )
    if own_comment:
        # Keep the comma that carries the comment (a trailing comma is valid), with the closing line's indent.
        closing_space = comma.whitespace_after if type(comma) is cst.Comma else closing.whitespace_after_arg
        last_line = getattr(closing_space, "last_line", cst.SimpleWhitespace(""))
        comma = own.comma.with_changes(whitespace_after=own.comma.whitespace_after.with_changes(last_line=last_line))
    args[-1] = own.with_changes(comma=comma, whitespace_after_arg=closing.whitespace_after_arg)
    return args


def replace_keyword_value(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    return call.with_changes(
        args=[
            arg.with_changes(value=value) if arg.keyword is not None and arg.keyword.value == name else arg
            for arg in call.args
        ]
    )


def mentions(node: cst.CSTNode, name: str) -> bool:
    """Whether ``name`` appears as a name or attribute anywhere in ``node``."""
    if type(node) is cst.Name and node.value == name:
        return True
    return any(mentions(child, name) for child in node.children)


def torch_nn_spelling(analysis) -> tuple[str, bool]:
    """How this file can name ``torch.nn``: an import bound to it (``nn``), else ``torch.nn``; and whether
    ``import torch`` must be added for that."""
    bindings = analysis.bindings
    fallback = None
    for name in sorted(bindings.imported):
        qualified = bindings.qualified_name(name)
        if qualified == "torch.nn":
            return name, False
        if qualified == "torch" and name == "torch":
            fallback = "torch.nn"
    if fallback is not None:
        return fallback, False
    return "torch.nn", "torch" not in bindings.local


def through_runtime(name: str):
    """A replacement of ``f(a, k=v)`` by ``mgpu_runtime.<name>(f, a, k=v)`` (``on_main_process``,
    ``main_process_only``), keeping the call's parentheses, whitespace and comments."""

    def through(updated: cst.CSTNode) -> cst.CSTNode:
        assert type(updated) is cst.Call
        first = cst.Arg(updated.func.with_changes(lpar=[], rpar=[]) if hasattr(updated.func, "lpar") else updated.func)
        if updated.args:
            first = first.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return updated.with_changes(func=runtime_attr(name), args=[first, *updated.args])

    return through


def opens_for_writing(analysis: Any, call: cst.Call) -> Optional[str]:
    """The mode of ``open(path, mode)`` (or ``io.open``) when it writes (``w``, ``a``, ``x``)."""
    qualified = analysis.resolve(call.func)
    if not (
        qualified in ("open", "builtins.open", "io.open")
        or (type(call.func) is cst.Name and call.func.value == "open" and qualified is None)
    ):
        return None
    mode = argument(call, "mode", 1)
    text = mode.value.evaluated_value if mode is not None and type(mode.value) is cst.SimpleString else ""
    return text if isinstance(text, str) and set(text) & set("wax") else None
