"""Conditions that decide who runs a piece of code: GPU guards around a wrap, main-process-only blocks.

A DataParallel script wraps its model only when there is something to parallelize (``if n_gpu > 1:``,
``if torch.cuda.device_count() > 1:``, ``if len(gpu_ids) > 1:``, ``if args.multi_gpu:``, ``if use_cuda:``).
Under DDP every process of a multi-process run must wrap, even one that sees a single GPU (SLURM gives
each task its own) or none (CPU processes): the guard is read as a GPU guard when its names say so.

A distributed script runs some code on the main process only (``if args.local_rank in [-1, 0]:``,
``if dist.get_rank() == 0:``, ``if is_main_process():``); a collective there waits for processes that
never come.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from mgpu_migrate.analysis.entrypoint import is_main_guard

if TYPE_CHECKING:
    from mgpu_migrate.analysis.file import FileAnalysis

_GPU_WORDS = re.compile(r"gpu|cuda|device|parallel|multi", re.IGNORECASE)
_RANK_WORDS = re.compile(r"rank", re.IGNORECASE)
# Words of a condition that is true exactly when there is a single process.
_SINGLE_PROCESS_WORDS = re.compile(r"rank|distributed|world_size|ddp", re.IGNORECASE)
_MAIN_PROCESS_NAMES = {
    "is_main_process",
    "is_master",
    "is_main",
    "main_process",
    "master_process",
    "is_rank_zero",
    "is_world_process_zero",
    "is_local_main_process",
}


def identifiers(expr: cst.CSTNode) -> Iterator[str]:
    """The names and attribute names an expression reads (``args``, ``n_gpu`` for ``args.n_gpu > 1``)."""
    if isinstance(expr, cst.Name):
        yield expr.value
    for child in expr.children:
        yield from identifiers(child)


def is_gpu_condition(test: cst.BaseExpression) -> bool:
    """A condition about GPUs: the count, a list of ids, a flag such as ``multi_gpu`` or ``use_cuda``."""
    return any(_GPU_WORDS.search(name) for name in identifiers(test))


def gpu_guards(analysis: FileAnalysis, node: cst.CSTNode) -> list[tuple[cst.If | cst.IfExp, bool]]:
    """The conditions around ``node`` in its function (``if`` statements, the main guard excepted, and
    ``... if ... else ...``), innermost first, each with whether ``node`` sits in its ``else``/``elif`` part."""
    return [(guard, in_else) for guard, in_else in analysis.tree.enclosing_ifs(node) if not is_main_guard(guard)]


def _is_zero(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Integer) and node.evaluated_value == 0


def _is_first_ranks(node: cst.BaseExpression) -> bool:
    """``[-1, 0]``, ``(0, -1)``, ``{0}``: ranks that mean "main process or no distribution"."""
    if not isinstance(node, (cst.List, cst.Tuple, cst.Set)) or not node.elements:
        return False
    for element in node.elements:
        value = element.value
        negative = isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus)
        number = value.expression if negative else value
        if not isinstance(number, cst.Integer) or (-1 if negative else 1) * number.evaluated_value not in (-1, 0):
            return False
    return True


def _mentions(expr: cst.CSTNode, words: re.Pattern) -> bool:
    return any(words.search(name) for name in identifiers(expr))


def _names_main_process(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.Call):
        expr = expr.func
    if isinstance(expr, cst.Attribute):
        return expr.attr.value in _MAIN_PROCESS_NAMES
    return isinstance(expr, cst.Name) and expr.value in _MAIN_PROCESS_NAMES


def is_main_process_condition(test: cst.BaseExpression) -> bool:
    """True for conditions that hold on the main process only (when there are several)."""
    if _names_main_process(test):
        return True
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        left, target = test.left, test.comparisons[0]
        right, operator = target.comparator, target.operator
        if isinstance(operator, (cst.Equal, cst.LessThanEqual)):
            return (_is_zero(right) and _mentions(left, _RANK_WORDS)) or (
                _is_zero(left) and _mentions(right, _RANK_WORDS)
            )
        if isinstance(operator, cst.In):
            return _is_first_ranks(right) and _mentions(left, _RANK_WORDS)
        if isinstance(operator, cst.LessThan):
            return isinstance(right, cst.Integer) and right.evaluated_value == 1 and _mentions(left, _RANK_WORDS)
        return False
    if isinstance(test, cst.BooleanOperation):
        left, right = test.left, test.right
        if isinstance(test.operator, cst.And):
            return is_main_process_condition(left) or is_main_process_condition(right)
        # `local_rank == -1 or get_rank() == 0`: the single-process case, or the main one of many.
        return (is_main_process_condition(left) and _mentions(right, _SINGLE_PROCESS_WORDS)) or (
            is_main_process_condition(right) and _mentions(left, _SINGLE_PROCESS_WORDS)
        )
    return False


def main_process_blocks(analysis: FileAnalysis) -> list[cst.If]:
    """The ``if`` statements whose body runs on the main process only."""
    return [node for node in analysis.tree.nodes(cst.If) if is_main_process_condition(node.test)]


def under_main_process_block(analysis: FileAnalysis, node: cst.CSTNode) -> bool:
    """Whether ``node`` sits in the body of a main-process-only ``if`` in its function."""
    return any(
        isinstance(guard, cst.If) and not in_else and is_main_process_condition(guard.test)
        for guard, in_else in analysis.tree.enclosing_ifs(node)
    )
