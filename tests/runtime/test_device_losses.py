"""The 0-dim loss that stands for DataParallel's vector of per-device losses (``device_losses.py``)."""

from __future__ import annotations

import copy
import io

import pytest

torch = pytest.importorskip("torch")

from mgpu_runtime.device_losses import DeviceLosses, mark_device_losses


def _loss(weight: torch.Tensor) -> torch.Tensor:
    return mark_device_losses(
        (weight * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).mean()
    )


def test_a_gradient_of_equal_per_device_values_is_their_sum() -> None:
    weight = torch.ones(3, dtype=torch.float64, requires_grad=True)
    loss = (
        1.0 / 3 * _loss(weight)
    )  # espnet: loss = 1. / ngpu * model(x); loss.backward(loss.new_ones(ngpu))
    assert type(loss) is DeviceLosses
    loss.backward(loss.new_ones(3))
    plain = torch.ones(3, dtype=torch.float64, requires_grad=True)
    (plain * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).mean().backward()
    assert torch.equal(weight.grad, plain.grad)
    weight.grad = None
    _loss(weight).backward(gradient=torch.full((2,), 0.5, dtype=torch.float64))
    assert torch.equal(weight.grad, plain.grad)


def test_unequal_per_device_weights_raise() -> None:
    loss = _loss(torch.ones(3, dtype=torch.float64, requires_grad=True))
    with pytest.raises(ValueError, match="not all equal"):
        loss.backward(torch.tensor([1.0, 2.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="not all equal"):
        loss.backward(loss.new_ones(0))


def test_only_scalars_are_marked_and_copies_are_plain_tensors() -> None:
    loss = _loss(torch.ones(3, dtype=torch.float64, requires_grad=True))
    assert type(torch.stack([loss, loss])) is torch.Tensor
    assert type(loss > 0) is torch.Tensor
    assert type(mark_device_losses(torch.ones(2))) is torch.Tensor
    assert type(copy.deepcopy(loss.detach())) is torch.Tensor
    saved = io.BytesIO()
    torch.save({"loss": loss.detach()}, saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=True)["loss"]
    assert type(loaded) is torch.Tensor and loaded.item() == loss.item()


def test_outputs_without_a_loss_are_returned_as_they_are() -> None:
    class Output(dict):
        def __init__(self, logits, extra):  # a constructor that a rebuild could not call
            super().__init__(logits=logits)
            self.extra = extra

    output = Output(torch.ones(2, 3), "kept")
    assert mark_device_losses(output) is output
    marked = mark_device_losses((torch.ones(2), torch.tensor(1.5)))
    assert type(marked) is tuple and type(marked[1]) is DeviceLosses and type(marked[0]) is torch.Tensor
