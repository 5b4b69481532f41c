"""A batch's size as a script writes it, and losses normalised by it.

Under ``--to ddp`` each process holds its own rows of the batch, so ``x.size(0)``, ``x.shape[0]`` and
``len(x)`` of a batch tensor are the process's row count, not the original's. A loss summed over the rows and
divided by that count is a mean over the process's rows, which the runtime's gradient weighting makes exact
on its own; multiplied by it, the loss becomes a sum the weighting over-counts. (A constant such as
``args.batch_size`` is the original's size on every process, and is not read as a row count here.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from mgpu_migrate.analysis.tree import contains, is_zero

if TYPE_CHECKING:
    from mgpu_migrate.analysis.file import FileAnalysis


def is_row_count(analysis: FileAnalysis, expr: cst.BaseExpression, depth: int = 3) -> bool:
    """``x.size(0)``, ``x.shape[0]``, ``x.size()[0]``, ``len(x)``, or a name bound only to one of them."""
    if type(expr) is cst.Call:
        func = expr.func
        if type(func) is cst.Attribute and func.attr.value == "size" and len(expr.args) == 1:
            return is_zero(expr.args[0].value)
        return type(func) is cst.Name and func.value == "len" and len(expr.args) == 1
    if type(expr) is cst.Subscript and len(expr.slice) == 1 and type(expr.slice[0].slice) is cst.Index:
        inner = expr.value
        shaped = (type(inner) is cst.Attribute and inner.attr.value == "shape") or (
            type(inner) is cst.Call
            and type(inner.func) is cst.Attribute
            and inner.func.attr.value == "size"
            and not inner.args
        )
        return shaped and is_zero(expr.slice[0].slice.value)
    if type(expr) is cst.Name and depth > 0:
        values = analysis.values
        bound = values.of(expr, values.scope_of(expr))
        return bool(bound) and all(
            isinstance(value, cst.BaseExpression) and value is not expr and is_row_count(analysis, value, depth - 1)
            for value in bound
        )
    return False


def scaled_by_row_count(analysis: FileAnalysis, node: cst.CSTNode, operator: type) -> bool:
    """Whether ``node`` is the left side of ``node / rows`` (operator ``cst.Divide``) or either side of
    ``node * rows`` (``cst.Multiply``), ``rows`` a row count of the batch."""
    parent = analysis.tree.parent(node)
    if type(parent) is cst.Assign and len(parent.targets) == 1 and type(parent.targets[0].target) is cst.Name:
        # `soft = F.kl_div(...); return soft / x.size(0)`: every later read of the name is scaled.
        uses = _reads(analysis, parent, parent.targets[0].target.value)
        return bool(uses) and all(scaled_by_row_count(analysis, use, operator) for use in uses)
    if type(parent) is not cst.BinaryOperation or not isinstance(parent.operator, operator):
        return False
    if operator is cst.Divide:
        return parent.left is node and is_row_count(analysis, parent.right)
    other = parent.right if parent.left is node else parent.left
    return is_row_count(analysis, other)


def _reads(analysis: FileAnalysis, assign: cst.Assign, name: str) -> list[cst.Name]:
    """The reads of ``name`` after ``assign`` in its function (or module), when nothing else assigns it."""
    function = analysis.tree.function(assign)
    body = function.body if function is not None else analysis.module
    stores = contains(body, lambda n: type(n) in (cst.AssignTarget, cst.AugAssign, cst.AnnAssign))
    if len([s for s in stores if type(getattr(s, "target", None)) is cst.Name and s.target.value == name]) > 1:
        return []
    target = assign.targets[0].target
    return [
        node
        for node in contains(body, lambda n: type(n) is cst.Name and n.value == name)
        if node is not target
    ]


def split_training_loops(analysis) -> list[cst.For]:
    """Training loops over a loader (which MGP122 splits) or over data already distributed. A loop left on whole
    batches draws, in every process, the numbers the original drew for the same rows."""
    loops = []
    for trace in analysis.loaders.traces:
        if trace.training and trace.origin is not None and trace.loop not in loops:
            loops.append(trace.loop)
    return loops


def rows_of_a_tensor(expr: cst.BaseExpression) -> bool:
    """``x.size(0)``, ``x.shape[0]``, ``x.size()[0]`` or ``len(x)``."""
    if type(expr) is cst.Call and type(expr.func) is cst.Name and expr.func.value == "len":
        return True
    if type(expr) is cst.Subscript and type(expr.value) is cst.Call and not expr.value.args:
        expr = cst.Subscript(value=cst.Attribute(value=expr.value.func, attr=cst.Name("shape")), slice=expr.slice)
    if type(expr) is cst.Call and type(expr.func) is cst.Attribute and expr.func.attr.value == "size":
        return len(expr.args) == 1 and type(expr.args[0].value) is cst.Integer and expr.args[0].value.value == "0"
    return (
        type(expr) is cst.Subscript
        and type(expr.value) is cst.Attribute
        and expr.value.attr.value == "shape"
        and len(expr.slice) == 1
        and type(expr.slice[0].slice) is cst.Index
        and type(expr.slice[0].slice.value) is cst.Integer
        and expr.slice[0].slice.value.value == "0"
    )
