"""What the rules that count the global batch share (``--to ddp``): what a count of a tensor is, the sample
counters a training schedule compares, and the code of their rewrite, MGP140, which GlobalCount makes for a count
that divides a loss and TrainingData for a sample counter of a loop it splits."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from mgpu_migrate.analysis.batch import is_row_count
from mgpu_migrate.analysis.tree import contains
from mgpu_migrate.diagnostics import Rewrite

if TYPE_CHECKING:
    from mgpu_migrate.analysis import FileAnalysis

# GlobalCount's rewrite (its page is that rule's doc): a count of the batch summed over the processes.
GLOBAL_COUNT = Rewrite("MGP140")
# Methods that count (a full reduction with no argument), and what may follow them without changing the count.
_COUNTS = frozenset({"sum", "numel", "count_nonzero", "nelement"})
_CONVERSIONS = frozenset({"item", "float", "double", "long", "int", "detach", "cpu"})
_BUILTIN_CONVERSIONS = frozenset({"int", "float"})
# Calls that count what they are called on (``mask.sum()``, ``x.numel()``), and those that make a mask to count.
_COUNTING = frozenset({"sum", "count_nonzero", "numel", "nelement"})
_MASKS = frozenset({"ne", "eq", "gt", "ge", "lt", "le", "bool"})
# What may follow a sample count (unlike a count that divides a loss, not ``.double()``).
_SAMPLE_CONVERSIONS = frozenset({"item", "int", "float", "long", "cpu", "detach"})


def is_count(expr: cst.BaseExpression) -> bool:
    """``x.sum()``, ``x.ne(PAD).sum().item()``, ``int(mask.sum())``, ``torch.sum(mask)`` ...: a count of a tensor."""
    while type(expr) is cst.Call:
        func = expr.func
        if type(func) is cst.Name and func.value in _BUILTIN_CONVERSIONS and len(expr.args) == 1:
            expr = expr.args[0].value
            continue
        if type(func) is not cst.Attribute:
            return False
        method = func.attr.value
        if method in _CONVERSIONS and not expr.args:
            expr = func.value
            continue
        if method in _COUNTS:
            on_torch = type(func.value) is cst.Name and func.value.value == "torch"
            return len(expr.args) == (1 if on_torch else 0)
        return False
    return False


def sample_counters(analysis: FileAnalysis, loop: cst.For) -> list[cst.AugAssign]:
    """``used_sample += real_image.shape[0]``, ``self.tokens += (y >= 0).sum()`` in a training loop whose
    data is split (or in the function of this file that runs its backward pass), whose total the file
    compares with something (a progressive-growing phase, a warm-up ``if``): counted on each process's
    share, the schedule it drives would run W times slower, and differ between processes."""
    tree = analysis.tree
    code = analysis.code_of
    regions: list[cst.CSTNode | None] = [loop.body]
    regions += [
        function
        for function in (tree.function(call) for call in analysis.loaders.backward_calls(loop))
        if function is not tree.function(loop)
    ]
    found: list[cst.AugAssign] = []
    for region in dict.fromkeys(regions):
        if region is None:
            continue
        added = contains(region, lambda n: type(n) is cst.AugAssign and type(n.operator) is cst.AddAssign)
        found += [node for node in added if node not in found and _counts_samples(analysis, node.value)]
    if not found:
        return found
    # Which of them the file compares with something: only names ending like a counter are generated.
    tails = {_tail(node.target) for node in found}
    compared = {
        code(node)
        for comparison in tree.nodes(cst.Comparison)
        for node in contains(comparison, lambda n: type(n) in (cst.Name, cst.Attribute) and _tail(n) in tails)
    }
    return [node for node in found if code(node.target) in compared]


def _tail(node: cst.CSTNode) -> str | None:
    """``used_sample`` of ``used_sample``, ``tokens`` of ``self.tokens``."""
    if type(node) is cst.Name:
        return node.value
    return node.attr.value if type(node) is cst.Attribute else None


def _counts_samples(analysis: FileAnalysis, value: cst.BaseExpression) -> bool:
    while type(value) is cst.Call:
        func = value.func
        if type(func) is cst.Name and func.value in _BUILTIN_CONVERSIONS and len(value.args) == 1:
            value = value.args[0].value
        elif type(func) is cst.Attribute and func.attr.value in _SAMPLE_CONVERSIONS and not value.args:
            value = func.value
        else:
            break
    if is_row_count(analysis, value):
        return True
    if type(value) is not cst.Call or type(value.func) is not cst.Attribute or value.args:
        return False
    counted, receiver = value.func.attr.value, value.func.value
    if counted in ("numel", "nelement"):
        return True
    if counted not in _COUNTING:
        return False
    return type(receiver) is cst.Comparison or (
        type(receiver) is cst.Call
        and type(receiver.func) is cst.Attribute
        and receiver.func.attr.value in _MASKS
    )
