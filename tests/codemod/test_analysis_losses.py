"""The shared analysis of losses on wrapped models' outputs (analysis/losses.py)."""

import textwrap

import libcst as cst
import pytest

from mgpu_migrate.analysis import FileAnalysis
from mgpu_migrate.analysis.losses import class_parameters, exact_under_ddp_without_wrapper, reduction_of


def analyse(source: str) -> FileAnalysis:
    source = textwrap.dedent(source)
    return FileAnalysis("example.py", source, cst.parse_module(source))


def code(analysis: FileAnalysis, node: cst.CSTNode) -> str:
    return analysis.module.code_for_node(node)


def constructions(analysis: FileAnalysis) -> list[tuple[str | None, str]]:
    """Each construction's torch loss class and code."""
    return [(c.loss_class, code(analysis, c.value)) for criterion in analysis.losses.criteria for c in criterion.constructions]


class TestCriteria:
    def test_built_in_main_passed_to_train_and_called_there(self):
        analysis = analyse(
            """
            import torch.nn as nn
            def train(model, criterion, x, y):
                return criterion(model(x), y)
            def main():
                model = nn.DataParallel(net)
                criterion = nn.CrossEntropyLoss(ignore_index=-1).cuda()
                train(model, criterion, x, y)
            """
        )
        assert constructions(analysis) == [("CrossEntropyLoss", "nn.CrossEntropyLoss(ignore_index=-1).cuda()")]
        (criterion,) = analysis.losses.criteria
        assert {code(analysis, call.call) for call in criterion.calls} == {"criterion(model(x), y)"}

    def test_inline_arguments_defaults_and_factories_are_constructions(self):
        analysis = analyse(
            """
            import torch
            def loss_for(kind):
                return torch.nn.L1Loss() if kind == "l1" else torch.nn.MSELoss()
            def step(model, x, y, criterion=torch.nn.HuberLoss(), extra=None):
                return criterion(model(x), y) + extra(model(x), y)
            model = torch.nn.DataParallel(net)
            step(model, x, y, extra=loss_for("l1"))
            """
        )
        assert sorted(constructions(analysis)) == [
            ("HuberLoss", "torch.nn.HuberLoss()"),
            ("L1Loss", "torch.nn.L1Loss()"),
            ("MSELoss", "torch.nn.MSELoss()"),
        ]

    def test_kinds(self):
        analysis = analyse(
            """
            import torch.nn as nn
            import mgpu_runtime
            from losses import FocalLoss
            model = nn.DataParallel(net)
            a = nn.BCELoss(weight=w)
            b = nn.CTCLoss()
            c = FocalLoss()
            d = mgpu_runtime.DataParallelCriterion(nn.NLLLoss())
            loss = a(model(x), y) + b(model(x), y, n, m) + c(model(x), y) + d(model(x), y)
            """
        )
        found = [(c.loss_class, c.parallel) for criterion in analysis.losses.criteria for c in criterion.constructions]
        # torch's losses by their class (a project's loss has none), and the runtime's criterion, which takes
        # per-device outputs.
        assert found == [("BCELoss", False), ("CTCLoss", False), (None, False), (None, True)]

    def test_a_callable_not_built_as_a_criterion_here_is_not_a_loss(self):
        analysis = analyse(
            """
            import torch.nn as nn
            from metrics import accuracy
            model = nn.DataParallel(net)
            acc = accuracy(model(x), y)
            """
        )
        assert analysis.losses.calls == [] and analysis.losses.criteria == []


class TestLossCalls:
    def test_direct_and_transformed_predictions(self):
        analysis = analyse(
            """
            import torch.nn as nn
            import torch.nn.functional as F
            model = nn.DataParallel(net)
            criterion = nn.CrossEntropyLoss()
            logits, aux = model(x)
            a = criterion(logits, y)
            b = criterion(logits.view(-1, logits.size(-1)), y.view(-1))
            c = F.nll_loss(F.log_softmax(aux, 1), y)
            d = F.mse_loss(input=aux, target=y)
            """
        )
        found = {code(analysis, c.call): (bool(c.direct), bool(c.transformed), c.functional) for c in analysis.losses.calls}
        assert found == {
            "criterion(logits, y)": (True, False, None),
            "criterion(logits.view(-1, logits.size(-1)), y.view(-1))": (False, True, None),
            "F.nll_loss(F.log_softmax(aux, 1), y)": (False, True, "torch.nn.functional.nll_loss"),
            "F.mse_loss(input=aux, target=y)": (True, False, "torch.nn.functional.mse_loss"),
        }


@pytest.mark.parametrize(
    ("options", "loss_class", "reduction", "exact_under_ddp"),
    [
        ("", "MSELoss", "mean", True),
        ("reduction='sum'", "MSELoss", "sum", False),
        ("None, None, 'sum'", "MSELoss", "sum", False),
        ("reduction=mode", "L1Loss", None, False),
        ("size_average=False", "L1Loss", None, False),
        ("reduction='batchmean'", "KLDivLoss", "batchmean", True),
        ("", "CrossEntropyLoss", "mean", False),
        ("reduction='none'", "CrossEntropyLoss", "none", True),
    ],
)
def test_reductions(options, loss_class, reduction, exact_under_ddp):
    call = cst.parse_expression(f"nn.{loss_class}({options})")
    found = reduction_of(call.args, class_parameters(loss_class))
    assert found == reduction
    assert exact_under_ddp_without_wrapper(loss_class, found) is exact_under_ddp


def test_loss_tables_match_torch_signatures():
    torch = pytest.importorskip("torch")
    import inspect

    from mgpu_migrate.analysis.losses import FUNCTIONAL_ONLY, LOSS_PARAMETERS, SPLITTABLE_LOSSES

    for loss_class, function in SPLITTABLE_LOSSES.items():
        functional = list(inspect.signature(getattr(torch.nn.functional, function)).parameters)
        assert functional[:2] == ["input", "target"] and tuple(functional[2:]) == LOSS_PARAMETERS[function]
        constructor = list(inspect.signature(getattr(torch.nn, loss_class).__init__).parameters)[1:]
        assert tuple(constructor) == class_parameters(loss_class), loss_class
        assert FUNCTIONAL_ONLY.get(function, frozenset()) == set(functional[2:]) - set(constructor)
