"""MGP126: "is this model wrapped?" checks stay true for the wrappers the migration puts in place."""

from __future__ import annotations

import os
from typing import Optional

import libcst as cst

from mgpu_migrate.analysis import names
from mgpu_migrate.analysis.own_path import wraps_beside
from mgpu_migrate.analysis.project import Importer, importers
from mgpu_migrate.rules.base import BALANCED, CHECKS, DDP, RUNTIME_STYLE, Example, Review, Rewrite, Rule
from mgpu_migrate.rules.syntax import RUNTIME, negated, runtime_attr

WRAPPERS = f"{RUNTIME}.PARALLEL_WRAPPERS"
# The wrapper classes a migration replaces, per target. Under balanced, isinstance checks need nothing:
# DataParallelModel derives from nn.DataParallel; only exact type checks do.
_REPLACED = {
    DDP: {names.DATA_PARALLEL, names.ENCODING_MODEL, names.APEX_DDP},
    BALANCED: {names.DATA_PARALLEL},
}
_POSITIVE = (cst.Equal, cst.Is, cst.In)
_NEGATIVE = (cst.NotEqual, cst.IsNot, cst.NotIn)


WRAPPER_CHECK_BY_NAME = Review(
    "MGP243",
    name="wrapper-check-by-name",
    summary="a wrapper check by class name the tool does not rewrite",
    why=(
        "The code checks the wrapper by its class name (`type(m).__name__ == 'DataParallel'`); the runtime's "
        "wrappers have other names."
    ),
    todo="Use `isinstance(m, mgpu_runtime.PARALLEL_WRAPPERS)`.",
)


_RUNTIME_WRAPPER = f"{RUNTIME}.DistributedDataParallel"


class WrapperCheck(Rule):
    """
    ## What it does
    Rewrites checks for a DataParallel wrapper so that they also recognize the runtime's wrappers:
    ``isinstance(m, nn.DataParallel)`` becomes ``isinstance(m, mgpu_runtime.PARALLEL_WRAPPERS)`` (``--to ddp``;
    other classes in a tuple are kept), and exact type checks, ``type(m) in (nn.DataParallel, DDP)``,
    ``type(m) == nn.DataParallel``, ``m.__class__ is nn.DataParallel``, become ``isinstance`` checks against
    ``mgpu_runtime.PARALLEL_WRAPPERS`` (both targets). ``hasattr(m, "module")`` needs nothing: every wrapper
    has ``.module``. In a module whose every importer sets up distributed training of its own (SimCLR's
    ``model.py``), the check is left as it is, or, where one of them migrates its DataParallel fallback beside
    an own path it starts itself (MGP120), given the runtime's wrapper alone:
    ``isinstance(m, (nn.DataParallel, mgpu_runtime.DistributedDataParallel))``, so that the own path's torch DDP
    is still no wrapper to it, as it was not to the original.

    ## Why is this bad?
    Code that unwraps a model before saving or inspecting it (``model.module if isinstance(model,
    nn.DataParallel) else model``) would take the wrapped model for a bare one after the migration, and save
    ``module.``-prefixed keys, or miss attributes of the bare model.

    ## Example
    ```python
    bare = model.module if type(model) in (nn.DataParallel, DDP) else model
    ```

    ## Use instead
    ```python
    bare = model.module if isinstance(model, (mgpu_runtime.PARALLEL_WRAPPERS, DDP)) else model
    ```

    ## Fix safety
    Safe: ``PARALLEL_WRAPPERS`` holds ``nn.DataParallel``, torch's ``DistributedDataParallel`` and the
    runtime's wrappers, so every check that was true stays true, and it becomes true for the new wrappers.
    An exact type check becomes an ``isinstance`` check, which a subclass of a wrapper also passes. A check of
    the class name as a string (``type(m).__name__ == "DataParallel"``) is left with MGP243.
    """

    CODE = Rewrite("MGP126", helper_body=True)  # a check of a helper module makes it no program
    PHASE = CHECKS
    USES = ("bindings",)
    REVIEW_CODES = (WRAPPER_CHECK_BY_NAME,)
    DESCRIPTION = "isinstance/type checks for DataParallel kept true for the runtime's wrappers"
    EXAMPLES = (
        Example(
            """
            import torch.nn as nn
            bare = m.module if isinstance(m, nn.DataParallel) else m
            """,
            """
            import mgpu_runtime
            bare = m.module if isinstance(m, mgpu_runtime.PARALLEL_WRAPPERS) else m
            """,
            DDP,
            ("MGP126",),
        ),
        Example(
            """
            import torch.nn as nn
            bare = m.module if isinstance(m, nn.DataParallel) else m
            """,
            None,
            BALANCED,
        ),
        Example(
            """
            import torch.nn as nn
            from torch.nn.parallel import DistributedDataParallel as DDP
            if type(m) not in [nn.DataParallel, DDP]:
                pass
            """,
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            import mgpu_runtime
            if not isinstance(m, (mgpu_runtime.PARALLEL_WRAPPERS, DDP)):
                pass
            """,
            BALANCED,
            ("MGP126",),
        ),
        Example(
            """
            import torch
            wrapped = m.__class__ == torch.nn.DataParallel
            """,
            """
            import mgpu_runtime
            wrapped = isinstance(m, mgpu_runtime.PARALLEL_WRAPPERS)
            """,
            DDP,
            ("MGP126",),
        ),
        Example(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            if type(model).__name__ == 'DataParallel':
                pass
            """,
            """
            import mgpu_runtime
            model = mgpu_runtime.DistributedDataParallel(model)
            if type(model).__name__ == 'DataParallel':
                pass
            """,
            DDP,
            ("MGP101", "MGP243"),
        ),
    )

    def apply(self) -> None:
        replaced = _REPLACED[self.target]
        beside = False
        if self.target == DDP:
            found = self._for_own_paths_only(replaced)
            if found:
                beside = self.options.style == RUNTIME_STYLE and any(wraps_beside(importer.path) for importer in found)
                if not beside:
                    return
        for call in self.analysis.calls:
            if self.target == DDP and self._is_builtin(call.func, ("isinstance", "issubclass")) and len(call.args) == 2:
                self._rewrite_isinstance(call, replaced, beside)
        if beside:
            return  # the own paths' exact type checks see their own classes
        if not any(word in self.analysis.source for word in ("type(", "__class__", "__name__")):
            return  # no exact type check here, and the tree's other facts are not needed
        for comparison in self.analysis.tree.nodes(cst.Comparison):
            if len(comparison.comparisons) != 1:
                continue
            if self._is_class_name_check(comparison):
                self.left(
                    comparison,
                    WRAPPER_CHECK_BY_NAME,
                    f"a check of the wrapper's class name: the runtime's wrappers have other names; use "
                    f"`isinstance(m, {WRAPPERS})`",
                )
                continue
            subject = self._type_subject(comparison.left)
            if subject is not None and self._refers_to_wrapper(comparison.comparisons[0], replaced):
                self._rewrite_type_check(comparison, replaced)

    def _for_own_paths_only(self, replaced: set[str]) -> list[Importer]:
        """The modules of the project that import this one, when it wraps nothing itself and every one of them
        sets up distributed training of its own (SimCLR's model.py, whose ``save_model`` checks ``isinstance(model,
        DataParallel)``, imported only by main.py, which calls ``init_process_group``); else none. Under ``--to
        ddp`` those keep their own DDP, so a check rewritten to ``PARALLEL_WRAPPERS`` would take it for a wrapper
        too and change what that path saves. Where one of them migrates its fallback beside its own path
        (``wraps_beside``), the check is given the runtime's wrapper alone beside the original's class; where
        none does, they keep their DataParallel fallback too, and the check means what it meant."""
        if not os.path.isfile(self.analysis.path) or any(self.analysis.resolve(call.func) in replaced for call in self.analysis.calls):
            return []
        found = importers(self.analysis.path, "")
        return found if found and all(importer.own_process_group for importer in found) else []

    # -- isinstance(m, nn.DataParallel) ---------------------------------------------------------------
    def _rewrite_isinstance(self, call: cst.Call, replaced: set[str], beside: bool = False) -> None:
        classes = call.args[1].value
        elements = [e.value for e in classes.elements] if type(classes) is cst.Tuple else [classes]
        found = [element for element in elements if self.analysis.resolve(element) in replaced]
        if not found or not self.rewrite_allowed(call):
            return
        if beside:
            # Torch's own DDP is the importers' own path's, which the original's check did not take for a wrapper.
            if any(self.analysis.resolve(element) == _RUNTIME_WRAPPER for element in elements):
                return  # given it already
            listed = ", ".join(self.analysis.code_of(element) for element in elements)
            self.edits.replace(classes, lambda _: cst.parse_expression(f"({listed}, {RUNTIME}.DistributedDataParallel)"))
            self.edits.need_import(RUNTIME)
            self.rewrote(call, f"the check also recognizes the runtime's wrapper ({RUNTIME}.DistributedDataParallel), not the own path's DDP")
            return
        self.edits.need_import(RUNTIME)
        for element in found:
            self.edits.replace(element, lambda _: runtime_attr("PARALLEL_WRAPPERS"))
        self.rewrote(call, f"the check also recognizes the runtime's wrappers ({WRAPPERS})")

    # -- type(m) in (...), type(m) == ... ------------------------------------------------------------------
    def _type_subject(self, node: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        """``m`` for ``type(m)`` or ``m.__class__``."""
        if (
            type(node) is cst.Call
            and self._is_builtin(node.func, ("type",))
            and len(node.args) == 1
            and not node.args[0].keyword
        ):
            return node.args[0].value
        if type(node) is cst.Attribute and node.attr.value == "__class__":
            return node.value
        return None

    def _refers_to_wrapper(self, target: cst.ComparisonTarget, replaced: set[str]) -> bool:
        operator, comparator = target.operator, target.comparator
        if type(operator) in (cst.In, cst.NotIn):
            return type(comparator) in (cst.Tuple, cst.List, cst.Set) and any(
                self.analysis.resolve(e.value) in replaced
                for e in comparator.elements
                if type(e) is not cst.StarredElement
            )
        return isinstance(operator, _POSITIVE + _NEGATIVE) and self.analysis.resolve(comparator) in replaced

    def _rewrite_type_check(self, comparison: cst.Comparison, replaced: set[str]) -> None:
        if "isinstance" in self.analysis.bindings.local or not self.rewrite_allowed(comparison):
            return
        resolve = self.analysis.resolve
        negative = isinstance(comparison.comparisons[0].operator, _NEGATIVE)
        parent = self.analysis.tree.parent(comparison)
        original_comparator = comparison.comparisons[0].comparator
        keep = (
            [resolve(e.value) not in replaced for e in original_comparator.elements]
            if type(original_comparator) in (cst.Tuple, cst.List, cst.Set)
            else None
        )

        def rewrite(updated: cst.Comparison) -> cst.BaseExpression:
            subject = self._type_subject(updated.left)
            comparator = updated.comparisons[0].comparator
            wrappers = runtime_attr("PARALLEL_WRAPPERS")
            if keep is None:
                classes: cst.BaseExpression = wrappers
            else:
                kept = [e.value for e, is_kept in zip(comparator.elements, keep) if is_kept]
                classes = cst.Tuple([cst.Element(value) for value in [wrappers, *kept]]) if kept else wrappers
            check: cst.BaseExpression = cst.Call(cst.Name("isinstance"), [cst.Arg(subject), cst.Arg(classes)])
            if negative:
                check = negated(check, None if updated.lpar else parent)
            return check.with_changes(lpar=updated.lpar, rpar=updated.rpar) if updated.lpar else check

        self.edits.replace(comparison, rewrite)
        self.edits.need_import(RUNTIME)
        self.rewrote(comparison, f"exact type check replaced with isinstance(..., {WRAPPERS})")

    # -- type(m).__name__ == "DataParallel" --------------------------------------------------------
    def _is_class_name_check(self, comparison: cst.Comparison) -> bool:
        sides = (comparison.left, comparison.comparisons[0].comparator)
        names_checked = any(type(side) is cst.Attribute and side.attr.value == "__name__" for side in sides)
        return names_checked and any(
            type(side) is cst.SimpleString and side.evaluated_value in ("DataParallel", "DataParallelModel")
            for side in sides
        )

    def _is_builtin(self, func: cst.BaseExpression, choices: tuple[str, ...]) -> bool:
        bindings = self.analysis.bindings
        return (
            type(func) is cst.Name
            and func.value in choices
            and func.value not in bindings.local
            and func.value not in bindings.imported
        )
