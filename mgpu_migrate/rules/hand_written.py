"""MGP107: a function that is torch's ``data_parallel`` written out by hand calls the runtime's."""

from __future__ import annotations

import ast
import functools

import libcst as cst

from mgpu_migrate.analysis.hand_written import data_parallel_by_hand
from mgpu_migrate.analysis.project import text_module
from mgpu_migrate.rules.base import BALANCED, DDP, RUNTIME_STYLE, WRAPS, Example, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME

_PRIMITIVES = ("replicate", "parallel_apply")


class HandWrittenDataParallel(Rule):
    """
    ## What it does
    Replaces the body of a function that is ``torch.nn.parallel.data_parallel`` written
    out step by step (``replicate`` the module over every GPU, ``scatter`` its inputs, ``parallel_apply`` the
    replicas, ``gather`` on the first GPU, return that), on its own arguments, with a call of
    ``mgpu_runtime.data_parallel``. Its callers are unchanged; under ``--to ddp`` each call of the function (in its
    module, or in a module that imports it) is that module's wrap: the program is set up at its entry point, its
    training loaders split and its writes made once. Any other function that replicates by hand is left with
    MGP281.

    ## Why is this bad?
    The last step gathers every output on the first GPU, as ``nn.DataParallel`` does: that is the memory the
    balanced target exists to save. The runtime's ``data_parallel`` runs the same replicas on the same chunks
    and hands back the gathered value held per device; inside a ``--to ddp`` job it runs DataParallel's forward
    over the processes, the module's gradients summed over them.

    ## Example
    ```python
    def data_parallel_workaround(model, *input):
        device_ids = list(range(torch.cuda.device_count()))
        output_device = device_ids[0]
        replicas = torch.nn.parallel.replicate(model, device_ids)
        inputs = torch.nn.parallel.scatter(input, device_ids)
        replicas = replicas[:len(inputs)]
        outputs = torch.nn.parallel.parallel_apply(replicas, inputs)
        return torch.nn.parallel.gather(outputs, output_device)
    ```

    ## Use instead
    ```python
    def data_parallel_workaround(model, *input):
        return mgpu_runtime.data_parallel(model, input)
    ```

    ## Fix safety
    Safe for the shape it matches, which is torch's ``data_parallel`` with its defaults (every GPU, the first
    for the output, dimension 0): the same replicas (or processes) run on the same chunks. References the function kept in
    globals (``_output_ref = outputs``, a workaround for a memory leak of old PyTorch) are no longer kept.
    """

    CODE = Rewrite("MGP107", helper_body=True)
    PHASE = WRAPS
    DESCRIPTION = "torch's data_parallel written by hand calls mgpu_runtime.data_parallel"
    TARGETS = (BALANCED, DDP)
    EXAMPLES = (
        Example(
            """
            import torch


            def data_parallel_workaround(model, *input):
                global _output_ref
                device_ids = list(range(torch.cuda.device_count()))
                output_device = device_ids[0]
                replicas = torch.nn.parallel.replicate(model, device_ids)
                # input.shape = (num_args, batch, ...)
                inputs = torch.nn.parallel.scatter(input, device_ids)
                replicas = replicas[:len(inputs)]
                outputs = torch.nn.parallel.parallel_apply(replicas, inputs)
                y_hat = torch.nn.parallel.gather(outputs, output_device)
                _output_ref = outputs
                return y_hat
            """,
            """
            import mgpu_runtime


            def data_parallel_workaround(model, *input):
                return mgpu_runtime.data_parallel(model, input)
            """,
            BALANCED,
            ("MGP107",),
        ),
        Example(
            """
            import torch

            _output_ref = None


            def data_parallel_workaround(model, *input):
                global _output_ref
                device_ids = list(range(torch.cuda.device_count()))
                output_device = device_ids[0]
                replicas = torch.nn.parallel.replicate(model, device_ids)
                inputs = torch.nn.parallel.scatter(input, device_ids)
                replicas = replicas[:len(inputs)]
                outputs = torch.nn.parallel.parallel_apply(replicas, inputs)
                y_hat = torch.nn.parallel.gather(outputs, output_device)
                _output_ref = outputs
                return y_hat
            """,
            """
            import mgpu_runtime

            _output_ref = None


            def data_parallel_workaround(model, *input):
                return mgpu_runtime.data_parallel(model, input)
            """,
            DDP,
            ("MGP107",),
            message="`data_parallel_workaround` is torch's data_parallel by hand",
            line=6,
            name="MGP107-ddp",
        ),
        Example(
            """
            import torch
            from torch.nn.parallel import gather, parallel_apply, replicate, scatter


            def run(net, x):
                \"\"\"The model over every GPU.\"\"\"
                devices = list(range(torch.cuda.device_count()))
                copies = replicate(net, devices)
                chunks = scatter(x, devices)
                outputs = parallel_apply(copies, chunks)
                out = gather(outputs, 0)
                return out
            """,
            """
            import mgpu_runtime


            def run(net, x):
                \"\"\"The model over every GPU.\"\"\"
                return mgpu_runtime.data_parallel(net, x)
            """,
            BALANCED,
            ("MGP107",),
        ),
        Example(
            """
            import torch


            def run(net, x):
                devices = list(range(torch.cuda.device_count()))
                copies = torch.nn.parallel.replicate(net, devices)
                chunks = torch.nn.parallel.scatter(x, devices)
                outputs = torch.nn.parallel.parallel_apply(copies, chunks)
                out = torch.nn.parallel.gather(outputs, 0)
                return out.sum(dim=1)
            """,
            None,
            BALANCED,
            name="MGP107-something-else-after-the-gather",
        ),
    )

    def apply(self) -> None:
        if self.target == DDP and self.options.style != RUNTIME_STYLE:
            return  # torch has no per-call DDP: left with MGP281 (rules/project_wrappers.py)
        if not any(primitive in self.analysis.source for primitive in _PRIMITIVES):
            return
        module = text_module(self.analysis.path, self.analysis.source)
        if module is None:
            return
        for statement in self.analysis.module.body:
            if type(statement) is not cst.FunctionDef:
                continue
            definition = module.definitions.get(statement.name.value)
            if not isinstance(definition, ast.FunctionDef):
                continue
            shape = data_parallel_by_hand(definition, module.qualified)
            if shape is None or not self.rewrite_allowed(statement):
                continue
            inputs = shape.inputs
            call = f"{RUNTIME}.data_parallel({shape.module}, {inputs})"
            self.edits.replace(statement.body, functools.partial(_returning, call=call))
            self.edits.need_import(RUNTIME)
            self.rewrote(statement, f"`{statement.name.value}` is torch's data_parallel by hand: it returns {call}")


def _returning(body: cst.BaseSuite, call: str) -> cst.BaseSuite:
    """The function's body as one ``return`` of ``call``, after its docstring if it has one."""
    statement = cst.parse_statement(f"return {call}\n")
    kept = []
    if type(body) is cst.IndentedBlock and body.body:
        first = body.body[0]
        expression = first.body[0] if type(first) is cst.SimpleStatementLine and first.body else None
        if type(expression) is cst.Expr and type(expression.value) in (cst.SimpleString, cst.ConcatenatedString):
            kept.append(first)
    if type(body) is cst.IndentedBlock:
        return body.with_changes(body=[*kept, statement])
    return cst.IndentedBlock([statement])
