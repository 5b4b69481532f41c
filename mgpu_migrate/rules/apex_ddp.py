"""MGP128: apex's ``DistributedDataParallel`` becomes the runtime's (``--to ddp``)."""

from __future__ import annotations

import libcst as cst

from mgpu_migrate.analysis import names
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.rules.base import DDP, WRAPS, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, runtime_attr

# apex.parallel.DistributedDataParallel(module, message_size, delay_allreduce, shared_param,
#   allreduce_trigger_params, retain_allreduce_buffers, allreduce_always_fp32, num_allreduce_streams,
#   allreduce_communicators, gradient_average, gradient_predivide_factor, gradient_average_split_factor, prof)
_PARAMETERS = (
    "module",
    "message_size",
    "delay_allreduce",
    "shared_param",
    "allreduce_trigger_params",
    "retain_allreduce_buffers",
    "allreduce_always_fp32",
    "num_allreduce_streams",
    "allreduce_communicators",
    "gradient_average",
    "gradient_predivide_factor",
    "gradient_average_split_factor",
    "prof",
)
# How communication is scheduled: torch's DDP buckets and overlaps on its own.
_SCHEDULING = {
    "message_size",
    "delay_allreduce",
    "shared_param",
    "allreduce_trigger_params",
    "retain_allreduce_buffers",
    "num_allreduce_streams",
    "allreduce_communicators",
    "prof",
}
# Numerics: each has a default under which dropping it changes nothing.
_NUMERIC_DEFAULTS = {
    "allreduce_always_fp32": ("False",),
    "gradient_predivide_factor": ("1", "1.0"),
    "gradient_average_split_factor": ("None",),
    "gradient_average": ("True",),
}


APEX_NUMERICS_DROPPED = Review(
    "MGP246",
    name="apex-numerics-dropped",
    summary="an apex argument that changes the numerics of the gradient reduction was dropped",
    why=(
        "An apex argument that changes the numerics of the gradient reduction (`allreduce_always_fp32`, "
        "`gradient_predivide_factor` ...) was dropped: the runtime reduces gradients in their own precision, "
        "divided once."
    ),
    todo="Check that the training still converges as before.",
)
APEX_UNMAPPABLE = Review(
    "MGP247",
    name="apex-unmappable",
    summary="an apex DistributedDataParallel the tool cannot map (gradient_average=False, unknown arguments)",
    why=(
        "The apex DistributedDataParallel has an argument with no equivalent in the runtime's wrapper "
        "(`gradient_average=False`, an argument the tool does not know), or no module argument."
    ),
    todo="Migrate it by hand, or drop the argument if its default is fine.",
)
AMBIGUOUS_APEX_NAME = Review(
    "MGP251",
    name="ambiguous-apex-name",
    summary="the name is bound both to apex's DistributedDataParallel and to something else in this file",
    why=(
        "The same name is bound to apex's DistributedDataParallel and to something else in this file, so the "
        "call may not be apex's."
    ),
    todo="Bind the name once, then run the tool again.",
)


class ApexDDP(Rule):
    """
    ## What it does
    Replaces ``apex.parallel.DistributedDataParallel(module, ...)`` with
    ``mgpu_runtime.DistributedDataParallel(module)``. Arguments that only schedule communication
    (``message_size``, ``delay_allreduce``, ``num_allreduce_streams`` ...) are dropped; arguments that change
    the numerics are dropped only at their defaults.

    ## Why is this bad?
    apex's DDP is unmaintained, and a file that mixes it with a DataParallel fallback cannot move that
    fallback to the runtime without moving apex's wrapper too.

    ## Example
    ```python
    from apex.parallel import DistributedDataParallel as DDP
    model = DDP(model, delay_allreduce=True)
    ```

    ## Use instead
    ```python
    model = mgpu_runtime.DistributedDataParallel(model)
    ```

    ## Fix safety
    Safe for what is dropped: the runtime's wrapper averages gradients as apex does by default, with torch's
    bucketing. ``allreduce_always_fp32=True`` and ``gradient_predivide_factor`` other than 1 are dropped with
    MGP246 (the reduction then runs in the gradients' own precision, divided once). ``gradient_average=False``
    (a sum over processes) or an argument the tool does not know leaves the call as it is, with MGP247.
    """

    CODE = Rewrite("MGP128")
    PHASE = WRAPS
    REVIEW_CODES = (APEX_NUMERICS_DROPPED, APEX_UNMAPPABLE, AMBIGUOUS_APEX_NAME)
    DESCRIPTION = "apex.parallel.DistributedDataParallel replaced with the runtime's wrapper"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            try:
                from apex.parallel import DistributedDataParallel as DDP
            except ImportError:
                DDP = None
            model = DDP(model)
            """,
            None,
            DDP,
            ("MGP251",),
        ),
        Example(
            """
            from apex.parallel import DistributedDataParallel as DDP
            model = DDP(model, delay_allreduce=True)
            """,
            """
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            """,
            DDP,
            ("MGP128",),
        ),
        Example(
            """
            import apex
            model = apex.parallel.DistributedDataParallel(model, allreduce_always_fp32=True)
            """,
            """
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            """,
            DDP,
            ("MGP128", "MGP246"),
        ),
        Example(
            """
            from apex.parallel import DistributedDataParallel as DDP
            model = DDP(model, gradient_average=False)
            """,
            None,
            DDP,
            ("MGP247",),
        ),
    )

    def apply(self) -> None:
        code = self.analysis.code_of
        for call in self.analysis.calls_to(names.APEX_DDP):
            module, numeric, unknown = None, [], []
            for index, arg in enumerate(call.args):
                name = (
                    arg.keyword.value
                    if arg.keyword
                    else (_PARAMETERS[index] if index < len(_PARAMETERS) and not arg.star else None)
                )
                value = code(arg.value)
                if name == "module":
                    module = arg
                elif name in _NUMERIC_DEFAULTS and value not in _NUMERIC_DEFAULTS[name]:
                    (unknown if name == "gradient_average" else numeric).append(f"{name}={value}")
                elif name not in _SCHEDULING and name not in _NUMERIC_DEFAULTS:
                    unknown.append(value if name is None else f"{name}={value}")
            if module is None or unknown:
                what = ", ".join(unknown) or "no module argument"
                self.left(
                    call,
                    APEX_UNMAPPABLE,
                    f"apex DistributedDataParallel with {what}: no equivalent in the runtime's wrapper; not rewritten",
                )
                continue
            if not self.rewrite_allowed(call):
                continue
            position = call.args.index(module)
            self.edits.replace(call, lambda updated, position=position: _only_module(updated, position))
            self.edits.need_import(RUNTIME)
            self.rewrote(call, f"apex DistributedDataParallel replaced with {RUNTIME}.DistributedDataParallel")
            if numeric:
                self.left(
                    call,
                    APEX_NUMERICS_DROPPED,
                    f"dropped {shorten(', '.join(numeric), 60)}: check that the training still converges as before",
                )
        for call in self.analysis.ambiguous_calls(names.APEX_DDP):
            self.left(
                call, AMBIGUOUS_APEX_NAME, "this name is bound to apex's DistributedDataParallel and to something else; not rewritten"
            )


def _only_module(call: cst.Call, index: int) -> cst.Call:
    module = call.args[index]
    return call.with_changes(
        func=runtime_attr("DistributedDataParallel"),
        args=[module.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT, comma=cst.MaybeSentinel.DEFAULT)],
    )
