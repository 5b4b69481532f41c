"""Conditions that decide who runs a piece of code: GPU guards around a wrap, main-process-only blocks.

A DataParallel script wraps its model only when there is something to parallelize (``if n_gpu > 1:``,
``if torch.cuda.device_count() > 1:``, ``if len(gpu_ids) > 1:``, ``if args.multi_gpu:``, ``if use_cuda:``).
Under DDP every process of a multi-process run must wrap, even one that sees a single GPU (SLURM gives
each task its own) or none (CPU processes): the guard is read as a GPU guard when its names say so.

Extending such a guard (``or mgpu_runtime.world_size() > 1``) also runs the rest of its body where the
condition is false; ``guard_reliance`` finds what there needs the condition to hold (``net.to(gpu_ids[0])``
under ``if len(gpu_ids) > 0:``, ``model.cuda()`` or ``assert torch.cuda.is_available()`` under ``if use_cuda:``).

A distributed script runs some code on the main process only (``if args.local_rank in [-1, 0]:``,
``if dist.get_rank() == 0:``, ``if is_main_process():``); a collective there waits for processes that
never come.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from mgpu_migrate.analysis.entrypoint import HARMLESS_CUDA, is_main_guard
from mgpu_migrate.analysis.tree import is_zero
from mgpu_migrate.analysis.walk import DEFINITIONS

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
    if type(expr) is cst.Name:
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


# -- what a guard's body needs from its condition -------------------------------------------------
# A device string that names a GPU.
_GPU_STRING = re.compile(r"cuda(:\d+)?")
# Calls whose arguments are only shown (a value read there needs nothing from the condition).
_LOG_METHODS = {"debug", "info", "warning", "warn", "error", "critical", "log", "write"}


@dataclass(frozen=True)
class Reliance:
    """A part of a guard's body that cannot run where the guard's condition is false."""

    node: cst.CSTNode
    reason: str


def _dotted_name(node: cst.CSTNode) -> str | None:
    """``args.n_gpu`` for a chain of names and attributes; None for anything else."""
    if type(node) is cst.Name:
        return node.value
    if type(node) is cst.Attribute:
        head = _dotted_name(node.value)
        return f"{head}.{node.attr.value}" if head is not None else None
    return None


def _operands(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The children of ``node`` that are read as values: not an attribute's name, an argument's keyword, or
    the function a call calls (when that is a plain dotted name)."""
    if type(node) is cst.Attribute:
        return [node.value]
    if type(node) is cst.Arg:
        return [node.value]
    if type(node) is cst.Call:
        callee = [] if _dotted_name(node.func) is not None else [node.func]
        return callee + list(node.args)
    return list(node.children)


def _reads(node: cst.CSTNode, ignored: Collection[cst.CSTNode]) -> Iterator[tuple[cst.CSTNode, str]]:
    """The dotted names ``node`` reads, outermost chain only (``self.gpu_ids`` in ``self.gpu_ids[0]``), in
    source order; skipping ``ignored`` nodes, nested definitions and what is only printed or logged."""
    if node in ignored or type(node) in DEFINITIONS or only_shows(node):
        return
    dotted = _dotted_name(node)
    if dotted is not None:
        yield node, dotted
        return
    for child in _operands(node):
        yield from _reads(child, ignored)


def only_shows(node: cst.CSTNode) -> bool:
    """``print(...)``, ``logger.info(...)``."""
    if type(node) is not cst.Call:
        return False
    func = node.func
    return (type(func) is cst.Name and func.value == "print") or (
        type(func) is cst.Attribute and func.attr.value in _LOG_METHODS
    )


def tested_names(test: cst.BaseExpression) -> set[str]:
    """The names a condition tests: ``gpu_ids`` in ``len(gpu_ids) > 0``, ``args.n_gpu`` in ``args.n_gpu > 1``;
    not the functions it calls (``len``, ``torch.cuda.device_count``)."""
    return {dotted for _, dotted in _reads(test, ())}


def _nodes(node: cst.CSTNode, ignored: Collection[cst.CSTNode]) -> Iterator[cst.CSTNode]:
    """``node`` and the nodes under it, in source order, without ``ignored`` ones and nested definitions."""
    if node in ignored or type(node) in DEFINITIONS:
        return
    yield node
    for child in node.children:
        yield from _nodes(child, ignored)


def _needs_gpu(analysis: FileAnalysis, node: cst.CSTNode) -> str | None:
    """Why ``node`` fails without a GPU: ``.cuda()``, a ``torch.cuda`` call that binds or queries a device, an
    assertion about CUDA, a device string naming a GPU."""
    if type(node) is cst.Call:
        if type(node.func) is cst.Attribute and node.func.attr.value == "cuda":
            return "calls `.cuda()`, which needs a GPU"
        qualified = analysis.resolve(node.func) or ""
        if qualified.startswith("torch.cuda.") and qualified.rsplit(".", 1)[1] not in HARMLESS_CUDA:
            return f"calls `{qualified}`, which needs a GPU"
    if type(node) is cst.Assert and any(
        (analysis.resolve(call.func) or "").startswith("torch.cuda.")
        for call in _nodes(node.test, ())
        if type(call) is cst.Call
    ):
        return "asserts that CUDA is there"
    if type(node) is cst.SimpleString and _GPU_STRING.fullmatch(str(node.evaluated_value)):
        return f"names the GPU {node.value}"
    return None


def guard_reliance(
    analysis: FileAnalysis, guard: cst.If | cst.IfExp, ignored: Collection[cst.CSTNode] = ()
) -> Reliance | None:
    """The first part of ``guard``'s body (its ``if`` branch) that needs the condition to hold: a use of a name
    the condition tests (``net.to(gpu_ids[0])`` under ``if len(gpu_ids) > 0:``), or something that needs a GPU
    (``model.cuda()``, ``assert torch.cuda.is_available()``); None when the body runs as well where the
    condition is false. ``ignored`` nodes (the parts of a wrap that its rewrite drops) are not looked at."""
    tested = tested_names(guard.test)
    body = guard.body
    parts = list(body.body) if type(body) in (cst.IndentedBlock, cst.SimpleStatementSuite) else [body]
    for part in parts:
        for node, dotted in _reads(part, ignored):
            name = next((name for name in tested if dotted == name or dotted.startswith(f"{name}.")), None)
            if name is not None:
                return Reliance(node, f"uses `{name}`, which the condition tests")
        for node in _nodes(part, ignored):
            reason = _needs_gpu(analysis, node)
            if reason is not None:
                return Reliance(node, reason)
    return None


def _is_first_ranks(node: cst.BaseExpression) -> bool:
    """``[-1, 0]``, ``(0, -1)``, ``{0}``: ranks that mean "main process or no distribution"."""
    if type(node) not in (cst.List, cst.Tuple, cst.Set) or not node.elements:
        return False
    for element in node.elements:
        value = element.value
        negative = type(value) is cst.UnaryOperation and type(value.operator) is cst.Minus
        number = value.expression if negative else value
        if type(number) is not cst.Integer or (-1 if negative else 1) * number.evaluated_value not in (-1, 0):
            return False
    return True


def _mentions(expr: cst.CSTNode, words: re.Pattern) -> bool:
    return any(words.search(name) for name in identifiers(expr))


def _names_main_process(expr: cst.BaseExpression) -> bool:
    if type(expr) is cst.Call:
        expr = expr.func
    if type(expr) is cst.Attribute:
        return expr.attr.value in _MAIN_PROCESS_NAMES
    return type(expr) is cst.Name and expr.value in _MAIN_PROCESS_NAMES


def is_main_process_condition(test: cst.BaseExpression) -> bool:
    """True for conditions that hold on the main process only (when there are several)."""
    if _names_main_process(test):
        return True
    if type(test) is cst.Comparison and len(test.comparisons) == 1:
        left, target = test.left, test.comparisons[0]
        right, operator = target.comparator, target.operator
        if type(operator) in (cst.Equal, cst.LessThanEqual):
            return (is_zero(right) and _mentions(left, _RANK_WORDS)) or (
                is_zero(left) and _mentions(right, _RANK_WORDS)
            )
        if type(operator) is cst.In:
            return _is_first_ranks(right) and _mentions(left, _RANK_WORDS)
        if type(operator) is cst.LessThan:
            return type(right) is cst.Integer and right.evaluated_value == 1 and _mentions(left, _RANK_WORDS)
        return False
    if type(test) is cst.BooleanOperation:
        left, right = test.left, test.right
        if type(test.operator) is cst.And:
            return is_main_process_condition(left) or is_main_process_condition(right)
        # `local_rank == -1 or get_rank() == 0`: the single-process case, or the main one of many.
        return (is_main_process_condition(left) and _mentions(right, _SINGLE_PROCESS_WORDS)) or (
            is_main_process_condition(right) and _mentions(left, _SINGLE_PROCESS_WORDS)
        )
    return False


def is_other_processes_condition(test: cst.BaseExpression) -> bool:
    """True for conditions that hold on every process but the main one: ``local_rank not in [-1, 0]``,
    ``rank != 0``, ``rank > 0``, ``not is_main_process()``."""
    if type(test) is cst.UnaryOperation and type(test.operator) is cst.Not:
        return is_main_process_condition(test.expression)
    if type(test) is cst.Comparison and len(test.comparisons) == 1:
        left, target = test.left, test.comparisons[0]
        right, operator = target.comparator, target.operator
        if type(operator) is cst.NotIn:
            return _is_first_ranks(right) and _mentions(left, _RANK_WORDS)
        if type(operator) in (cst.NotEqual, cst.GreaterThan):
            return is_zero(right) and _mentions(left, _RANK_WORDS)
    return False


def main_process_blocks(analysis: FileAnalysis) -> list[cst.If]:
    """The ``if`` statements whose body runs on the main process only."""
    return [node for node in analysis.tree.nodes(cst.If) if is_main_process_condition(node.test)]


def main_process_caller(analysis: FileAnalysis, node: cst.CSTNode) -> cst.Call | None:
    """A call of the function holding ``node``, by its name in this file, under a main-process-only block
    (``if args.local_rank in [-1, 0]: save_model(model, path)``): the other processes never reach ``node``
    from there, so a wait for them at ``node`` would last forever."""
    function = analysis.tree.function(node)
    if function is None:
        return None
    return next(
        (
            caller
            for caller in analysis.calls
            if type(caller.func) is cst.Name
            and caller.func.value == function.name.value
            and under_main_process_block(analysis, caller)
        ),
        None,
    )


def under_main_process_block(analysis: FileAnalysis, node: cst.CSTNode) -> bool:
    """Whether ``node`` sits in the body of a main-process-only ``if`` in its function."""
    return any(
        type(guard) is cst.If and not in_else and is_main_process_condition(guard.test)
        for guard, in_else in analysis.tree.enclosing_ifs(node)
    )
