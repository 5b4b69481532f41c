"""MGP127: explicit ``cuda:0`` devices become this process's device (``--to ddp``)."""

from __future__ import annotations

import ast
import os

import libcst as cst

from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.devices import device_ids, every_visible
from mgpu_migrate.analysis.project import project_of
from mgpu_migrate.analysis.rebased import rebased_machinery
from mgpu_migrate.analysis.entrypoint import sets_cuda_visible_devices
from mgpu_migrate.analysis.tree import is_zero
from mgpu_migrate.diagnostics import shorten
from mgpu_migrate.program import Program
from mgpu_migrate.rules.base import DDP, PROGRAM, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, argument, keyword, runtime_call

FIRST_GPU = "cuda:0"
# In a statement of its own a string is a docstring, not a device.
_NOT_A_DEVICE_PARENTS = frozenset({cst.Expr, cst.ConcatenatedString, cst.FormattedString})


EXPLICIT_OTHER_GPU = Review(
    "MGP244",
    name="explicit-other-gpu",
    summary="an explicit GPU other than the first: under DDP each process uses its own device",
    why=(
        "An explicit GPU other than the first: under DDP each process uses its own device, so a fixed GPU "
        "number puts every process on the same one."
    ),
    todo=(
        "Use `mgpu_runtime.device()` (or `'cuda'` and `.cuda()` for the current one); choose the GPUs with "
        "`CUDA_VISIBLE_DEVICES` in the launch environment."
    ),
)
FIRST_GPU_OF_A_MODULE = Review(
    "MGP242",
    name="first-gpu-of-a-module",
    summary="a value imported from another module of the project names GPU 0 ('cuda:0'): every process would use it",
    why=(
        "A configuration module's device (face.evoLVe's `DEVICE = torch.device(\"cuda:0\" ...)` in config.py, read as "
        "`cfg['DEVICE']`) was where DataParallel kept the module and gathered the outputs. Under DDP each process "
        "runs on its own GPU, and `.to(DEVICE)` with GPU 0 written out would put every process's model and batches "
        "there. The tool rewrites `'cuda:0'` in the files it migrates, not in a module it does not migrate."
    ),
    todo=(
        "In the module the message names, write `'cuda'` (the current device: each process's own, bound by "
        "`mgpu_runtime.setup()`) for `'cuda:0'`, then mark the import `# noqa: MGP242`."
    ),
)

VISIBLE_DEVICES_AFTER_SETUP = Review(
    "MGP245",
    name="visible-devices-after-setup",
    summary=(
        "CUDA_VISIBLE_DEVICES set after mgpu_runtime.setup() has bound the process to a GPU, or in a file "
        "that leaves setup() to the runtime, where it may come after setup()"
    ),
    why=(
        "`CUDA_VISIBLE_DEVICES` chooses the GPUs only before the process binds to one. It is set after "
        "`mgpu_runtime.setup()`, or in a file that leaves `setup()` to the runtime, where a program whose entry "
        "point calls `setup()` has bound the process by then."
    ),
    todo="Set it before the program starts, in the launch environment.",
)


class ExplicitDevice(Rule):
    """
    ## What it does
    Rewrites the ways a DataParallel script names the first GPU so that they name this process's GPU:
    ``"cuda:0"`` becomes ``"cuda"`` (the current device, which ``mgpu_runtime.setup()`` binds), ``.cuda(0)``
    becomes ``.cuda()``, ``torch.device("cuda", 0)`` becomes ``torch.device("cuda")``, the GPU number 0 where a
    device goes (``torch.device(0)``, ``x.to(0)``, ``.to(device=0)``, ``torch.zeros(2, device=0)``, and
    ``0 if use_cuda else "cpu"`` there) becomes ``"cuda"``, and ``torch.cuda.set_device(0)`` becomes
    ``torch.cuda.set_device(mgpu_runtime.device())``.

    ## Why is this bad?
    DataParallel keeps the model and the gathered outputs on the first GPU, so its scripts name
    ``cuda:0``. Under DDP each process owns one GPU; a process that puts its tensors on ``cuda:0`` crowds the
    first GPU and mixes devices with its model.

    ## Example
    ```python
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    ```

    ## Use instead
    ```python
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ```

    ## Fix safety
    ``torch.cuda.set_device(args.gpu)`` (a GPU picked by a setting) in a file whose every wrap is a DataParallel
    over every visible GPU becomes ``torch.cuda.set_device(mgpu_runtime.device())`` too: the replicas ran on
    every GPU whatever it named (the module on the first, which DataParallel requires), so it only picked
    where the script's own tensors went before the scatter; the diagnostic says it, since a one-GPU run of the
    original could use it to pick the GPU (choose GPUs with ``CUDA_VISIBLE_DEVICES``).

    Safe: in a single process the current device is the first GPU, as before. Another explicit GPU
    (``"cuda:1"``, ``.cuda(args.gpu)``, ``f"cuda:{i}"``, ``x.to(1)``) is left with MGP244, and a ``CUDA_VISIBLE_DEVICES``
    assignment that would run after ``mgpu_runtime.setup()`` (too late to choose the GPUs) with MGP245 (one in a
    function of the file runs when the calls of that function do: ``visible_gpus()`` called where the set-up
    goes right after, runs before it). So is one
    in a file where no ``setup()`` is inserted (a module of helpers), with a note that says so: the runtime
    then calls ``setup()`` when first used (the wrapper, when it is built), so the assignment still chooses the
    GPUs if it runs before that, but not in a program whose entry point calls ``setup()`` before any helper runs.
    """

    CODE = Rewrite("MGP127")
    PHASE = PROGRAM
    USES = ("flow",)
    REVIEW_CODES = (EXPLICIT_OTHER_GPU, VISIBLE_DEVICES_AFTER_SETUP, FIRST_GPU_OF_A_MODULE)
    DESCRIPTION = "explicit cuda:0 devices replaced with the process's own device"
    TARGETS = (DDP,)
    EXAMPLES = (
        Example(
            """
            import torch

            model = torch.nn.DataParallel(model.to('cuda:0'))
            x = x.cuda(0)
            """,
            """
            import mgpu_runtime

            model = mgpu_runtime.DistributedDataParallel(model.to('cuda'))
            x = x.cuda()
            """,
            DDP,
            ("MGP101", "MGP127"),
        ),
        Example(
            """
            import torch

            torch.cuda.set_device(0)
            model = torch.nn.DataParallel(model).cuda(args.gpu)
            """,
            """
            import torch
            import mgpu_runtime

            torch.cuda.set_device(mgpu_runtime.device())
            model = mgpu_runtime.DistributedDataParallel(model).cuda(args.gpu)
            """,
            DDP,
            ("MGP101", "MGP127", "MGP244"),
        ),
        Example(
            """
            import torch

            torch.cuda.set_device(args.gpu)
            model = torch.nn.DataParallel(model).cuda()
            """,
            """
            import torch
            import mgpu_runtime

            torch.cuda.set_device(mgpu_runtime.device())
            model = mgpu_runtime.DistributedDataParallel(model).cuda()
            """,
            DDP,
            ("MGP101", "MGP127"),
            message="`set_device(args.gpu)` binds the process's GPU",
            name="the current GPU picked by a setting, under a DataParallel over every GPU",
        ),
        Example(
            """
            import torch

            torch.cuda.set_device(args.gpu)
            model = torch.nn.DataParallel(model, device_ids=args.gpus).cuda()
            """,
            """
            import torch
            import mgpu_runtime

            torch.cuda.set_device(args.gpu)
            model = mgpu_runtime.DistributedDataParallel(model).cuda()
            """,
            DDP,
            ("MGP101", "MGP244"),
            name="the current GPU picked beside GPUs chosen for the wrap: said",
        ),
        Example(
            """
            import torch

            device = torch.device(0 if use_cuda else 'cpu')
            model = torch.nn.DataParallel(model)
            x = x.to(0, non_blocking=True)
            """,
            """
            import torch
            import mgpu_runtime

            device = torch.device('cuda' if use_cuda else 'cpu')
            model = mgpu_runtime.DistributedDataParallel(model)
            x = x.to("cuda", non_blocking=True)
            """,
            DDP,
            ("MGP101", "MGP127"),
        ),
        Example(
            """
            import os
            import torch.nn as nn


            def pick():
                os.environ['CUDA_VISIBLE_DEVICES'] = '1'


            def main():
                model = nn.DataParallel(nn.Linear(2, 2))
                pick()


            if __name__ == '__main__':
                main()
            """,
            """
            import os
            import torch.nn as nn
            import mgpu_runtime


            def pick():
                os.environ['CUDA_VISIBLE_DEVICES'] = '1'


            def main():
                model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))
                pick()


            if __name__ == '__main__':
                main()
            """,
            DDP,
            ("MGP101", "MGP245",),
            message="CUDA_VISIBLE_DEVICES is set after mgpu_runtime.setup() (inserted before line 15)",
            line=6,
            name="visible-devices-after-the-inserted-setup",
        ),
        Example(
            """
            import os
            import torch.nn as nn


            def main():
                os.environ['CUDA_VISIBLE_DEVICES'] = '1'
                model = nn.DataParallel(nn.Linear(2, 2))


            if __name__ == '__main__':
                main()
            """,
            """
            import os
            import torch.nn as nn
            import mgpu_runtime


            def main():
                os.environ['CUDA_VISIBLE_DEVICES'] = '1'
                model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))


            if __name__ == '__main__':
                main()
            """,
            DDP,
            ("MGP101",),
            name="visible-devices-before-the-inserted-setup",
        ),
        Example(
            """
            import os
            import mgpu_runtime
            import torch.nn as nn


            def main():
                mgpu_runtime.setup()
                os.environ['CUDA_VISIBLE_DEVICES'] = '1'
                model = nn.DataParallel(nn.Linear(2, 2))
            """,
            """
            import os
            import mgpu_runtime
            import torch.nn as nn


            def main():
                mgpu_runtime.setup()
                os.environ['CUDA_VISIBLE_DEVICES'] = '1'
                model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))
            """,
            DDP,
            ("MGP101", "MGP245",),
            message="CUDA_VISIBLE_DEVICES is set after mgpu_runtime.setup() (called at line 7)",
            line=8,
            name="visible-devices-after-the-files-own-setup",
        ),
        Example(
            """
            import os
            import torch.nn as nn


            def build():
                os.environ['CUDA_VISIBLE_DEVICES'] = '1'
                model = nn.DataParallel(nn.Linear(2, 2))
            """,
            """
            import os
            import torch.nn as nn
            import mgpu_runtime


            def build():
                os.environ['CUDA_VISIBLE_DEVICES'] = '1'
                model = mgpu_runtime.DistributedDataParallel(nn.Linear(2, 2))
            """,
            DDP,
            ("MGP101", "MGP245",),
            message="may have run before it (at the latest by the wrapper at line 7)",
            line=6,
            name="visible-devices-where-the-runtime-sets-up-when-first-used",
        ),
    )

    def apply(self) -> None:
        program = self.program
        if not program.migrates:
            return
        self._strings()
        for call in self.analysis.calls:
            func = call.func
            qualified = self.analysis.resolve(func)
            if qualified == "torch.cuda.set_device":
                self._set_device(call)
            elif qualified == "torch.device":
                self._device_index(call)
            elif type(func) is cst.Attribute and func.attr.value == "cuda" and qualified is None:
                self._cuda_method(call)
            elif type(func) is cst.Attribute and func.attr.value == "to" and qualified is None:
                self._integer_device(argument(call, "device", 0))
            elif qualified is not None and qualified.startswith("torch."):
                self._integer_device(keyword(call, "device"))
        self._visible_devices(program)
        self._first_gpu_of_a_module()

    def _first_gpu_of_a_module(self) -> None:
        """MGP242 at each name imported from another module of the project whose module-level value holds
        ``'cuda:0'`` (a configuration's ``torch.device("cuda:0" if ... else "cpu")``)."""
        project = project_of(self.analysis.path)
        if project is None:
            return
        for node in self.analysis.tree.nodes(cst.ImportFrom):
            if node.relative or node.module is None or type(node.names) is cst.ImportStar:
                continue
            module = project.module(self.analysis.code_of(node.module))
            if module is None or os.path.abspath(module.path) == os.path.abspath(self.analysis.path):
                continue
            for alias in node.names:
                if type(alias.name) is not cst.Name:
                    continue
                line = next(
                    (
                        found.lineno
                        for value in module.assigned.get(alias.name.value, [])
                        for found in ast.walk(value)
                        if type(found) is ast.Constant and found.value == FIRST_GPU
                    ),
                    None,
                )
                if line is not None and self.rewrite_allowed(alias, FIRST_GPU_OF_A_MODULE):
                    where = shorten(os.path.relpath(module.path, os.path.dirname(os.path.abspath(self.analysis.path))), 40)
                    self.left(
                        alias,
                        FIRST_GPU_OF_A_MODULE,
                        f"`{shorten(alias.name.value, 30)}` holds 'cuda:0' ({where}:{line}): every process would use GPU 0; write "
                        "'cuda' there, each process's own",
                    )

    def _strings(self) -> None:
        tree = self.analysis.tree
        for string in tree.nodes(cst.SimpleString):
            parent = tree.parent(string)
            if type(parent) in _NOT_A_DEVICE_PARENTS or (
                type(parent) is cst.DictElement and parent.key is string
            ):
                continue
            value = string.evaluated_value
            if value == FIRST_GPU and self.rewrite_allowed(string):
                self.edits.replace(string, lambda node: node.with_changes(value=node.value.replace(FIRST_GPU, "cuda")))
                self.rewrote(string, "'cuda:0' is now 'cuda': this process's own GPU")
            elif isinstance(value, str) and value.startswith("cuda:") and value != FIRST_GPU:
                self._other_gpu(string, repr(value))
        for string in tree.nodes(cst.FormattedString):
            if string.start.endswith(("'", '"')) and self.analysis.code_of(string)[
                len(string.start) :
            ].startswith("cuda:"):
                self._other_gpu(string, self.analysis.code_of(string))

    def _set_device(self, call: cst.Call) -> None:
        alone = self.program.one_process
        if alone is not None and any(found is alone and in_else for found, in_else in self.analysis.tree.enclosing_ifs(call)):
            return  # a branch that stays one process (MGP120's `setup(processes=1)`) keeps the GPU it chose
        arg = argument(call, "device", 0)
        if arg is not None and _is_first_gpu(arg.value):
            return  # becomes set_device("cuda"), the current device, with the other strings
        if arg is not None and not arg.star and not is_zero(arg.value) and self._every_wrap_on_every_gpu(arg.value):
            if self.rewrite_allowed(call):
                code = shorten(self.analysis.code_of(arg.value), 20)
                if alone is not None:
                    # darts' `set_device(args.gpu)` before `if args.parallel:`: without it the one process keeps its GPU
                    test = alone.test
                    self.edits.replace(arg.value, lambda value: cst.IfExp(test.deep_clone(), runtime_call("device"), value))
                    self.edits.need_import(RUNTIME)
                    self.rewrote(
                        call,
                        f"`set_device({code})` binds the process's GPU, {RUNTIME}.device(), under "
                        f"`{shorten(self.analysis.code_of(test), 20)}`; otherwise one process on {code}, as it was",
                    )
                    return
                self.edits.replace(arg.value, lambda _: runtime_call("device"))
                self.edits.need_import(RUNTIME)
                self.rewrote(
                    call,
                    f"`set_device({code})` binds the process's GPU, {RUNTIME}.device(): DataParallel used every GPU "
                    f"whatever it named (pick via CUDA_VISIBLE_DEVICES)",
                )
            return
        if arg is None or not is_zero(arg.value):
            self._other_gpu(call, self.analysis.code_of(arg.value if arg else call))
            return
        if self.rewrite_allowed(call):
            self.edits.replace(arg.value, lambda _: runtime_call("device"))
            self.edits.need_import(RUNTIME)
            self.rewrote(call, f"the process's GPU is {RUNTIME}.device(), bound by {RUNTIME}.setup()")

    def _every_wrap_on_every_gpu(self, value: cst.BaseExpression) -> bool:
        """``torch.cuda.set_device(args.gpu)`` in a file whose every wrap is a DataParallel over every visible GPU
        (no ``device_ids``): the number picked only the current device, where the script's own ``.cuda()``
        tensors went before the scatter (darts' ``train_imagenet.py``); the replicas ran on every GPU, with the
        module on the first, whatever it named. A GPU written as a number (``set_device(1)``) stays said."""
        if type(value) is cst.Integer or not self.program.wraps:
            return False
        for wrap in self.program.wraps:
            if self.analysis.resolve(wrap.func) not in (names.DATA_PARALLEL, names.CALLBACK_DATA_PARALLEL):
                return False
            chosen = device_ids(wrap)
            if chosen is not None and not every_visible(self.analysis, chosen):
                return False
        return True

    def _device_index(self, call: cst.Call) -> None:
        """``torch.device("cuda", 0)``, ``torch.device(0)``."""
        if len(call.args) == 1 and not call.args[0].keyword:
            self._integer_device(call.args[0])
        if len(call.args) != 2 or type(call.args[0].value) is not cst.SimpleString:
            return
        if call.args[0].value.evaluated_value != "cuda":
            return
        self._drop_first_gpu(call, call.args[1])

    def _cuda_method(self, call: cst.Call) -> None:
        """``tensor.cuda(0)``, ``model.cuda(device=0)``."""
        arg = argument(call, "device", 0)
        if arg is not None:
            self._drop_first_gpu(call, arg)

    def _integer_device(self, arg: cst.Arg | None) -> None:
        """A GPU named by its number where a device goes: ``x.to(0)``, ``torch.device(0)``, ``device=0``, and
        ``0 if use_cuda else "cpu"`` there. GPU 0 becomes ``"cuda"``, the current one; another is left."""
        if arg is None or arg.star:
            return
        value, quote = arg.value, '"'
        if type(value) is cst.IfExp:
            branches = (value.body, value.orelse)
            numbers = [branch for branch in branches if type(branch) is cst.Integer]
            others = [branch for branch in branches if _is_cpu(branch)]
            if len(numbers) != 1 or len(others) != 1:
                return
            value, quote = numbers[0], others[0].quote
        if type(value) is not cst.Integer:
            return
        if not is_zero(value):
            self._other_gpu(value, self.analysis.code_of(value))
            return
        if self.rewrite_allowed(value):
            self.edits.replace(value, lambda node: cst.SimpleString(f"{quote}cuda{quote}", lpar=node.lpar, rpar=node.rpar))
            self.rewrote(value, "GPU 0 is now 'cuda': this process's own GPU")

    def _drop_first_gpu(self, call: cst.Call, arg: cst.Arg) -> None:
        if not is_zero(arg.value):
            self._other_gpu(call, self.analysis.code_of(arg.value))
            return
        if not self.rewrite_allowed(call):
            return
        position = call.args.index(arg)

        def drop(updated: cst.Call) -> cst.Call:
            args = [a for index, a in enumerate(updated.args) if index != position]
            if args and position == len(updated.args) - 1:
                args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return updated.with_changes(args=args)

        self.edits.replace(call, drop)
        self.rewrote(call, "the first GPU is now the current one: this process's own GPU")

    def _other_gpu(self, node: cst.CSTNode, code: str) -> None:
        if self.analysis.tree.function(node) in rebased_machinery(self.analysis, self.rewritten):
            return  # a rebased subclass's own scatter or gather: the runtime gives each process its GPU there
        self.left(
            node,
            EXPLICIT_OTHER_GPU,
            f"explicit GPU `{shorten(code)}`: under DDP each process uses its own GPU ({RUNTIME}.device())",
        )

    def _visible_devices(self, program: Program) -> None:
        tree = self.analysis.tree
        setup = program.setup_statement(self.analysis)
        for statement in tree.nodes(cst.SimpleStatementLine):
            if not sets_cuda_visible_devices(statement):
                continue
            block = tree.parent(statement)
            if type(block) is cst.Module:
                continue
            if setup is None:
                self._before_lazy_setup(statement, program)
                continue
            anchor, place = setup
            if self._runs_before(statement, anchor, place == "inserted after"):
                continue
            line, _ = self.analysis.position(anchor)
            self.left(
                statement,
                VISIBLE_DEVICES_AFTER_SETUP,
                f"CUDA_VISIBLE_DEVICES is set after {RUNTIME}.setup() ({place} line {line}) has bound this process to "
                "a GPU",
            )

    def _runs_before(
        self, statement: cst.CSTNode, anchor: cst.CSTNode, after_anchor: bool, seen: tuple[cst.CSTNode, ...] = ()
    ) -> bool:
        """Whether ``statement`` runs before setup() placed next to ``anchor``: it, or the statement holding it
        (an ``if`` in the same block), comes earlier in the anchor's block, or is the anchor with setup after; or
        it is in a function of this file (``visible_gpus()``) that runs only from calls that do."""
        tree = self.analysis.tree
        block = tree.parent(anchor)
        for node in (statement, *tree.ancestors(statement)):
            if tree.parent(node) is block:
                body = list(block.body)
                position, mark = body.index(node), body.index(anchor)
                return position < mark or (position == mark and after_anchor)
        function = tree.function(statement)
        if function is None or function in seen or function in tree.ancestors(anchor):
            return False
        calls = self.analysis.flow.call_sites(function)
        return bool(calls) and all(
            self._runs_before(call, anchor, after_anchor, (*seen, function)) for call, _, _ in calls
        )

    def _before_lazy_setup(self, statement: cst.SimpleStatementLine, program: Program) -> None:
        """No setup() in this file: the runtime calls it when it is first used, which may come after this."""
        line, _ = self.analysis.position(program.wraps[0])
        self.left(
            statement,
            VISIBLE_DEVICES_AFTER_SETUP,
            f"CUDA_VISIBLE_DEVICES is set where {RUNTIME}.setup() may have run before it (at the latest by the "
            f"wrapper at line {line})",
        )


def _is_cpu(node: cst.BaseExpression) -> bool:
    return type(node) is cst.SimpleString and node.evaluated_value == "cpu"


def _is_first_gpu(node: cst.BaseExpression) -> bool:
    return type(node) is cst.SimpleString and node.evaluated_value == FIRST_GPU
