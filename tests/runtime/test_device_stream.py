"""A rank's forward stream kept apart from its loop's on the same device (``global_view.DeviceStream``).

On GPUs, rank r > 0 draws its forward's dropout on ``cuda:r``, as replica r did under DataParallel, while its loop
draws there too where the original's loop drew on ``cuda:0`` (decision-transformer's evaluation samples actions with
``torch.multinomial`` between training steps). The stream swaps the device generator's state around the forward.
CUDA's generators are ``torch.Generator`` objects like the CPU's, so the swap is checked here on a CPU generator that
stands for the device's, against fresh generators that stand for device r's and cuda:0's streams under DataParallel.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from mgpu_runtime.distributed.global_view import DeviceStream  # noqa: E402


def _seeded(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def test_the_forward_draws_device_r_s_stream_whatever_the_loop_draws_between():
    device = _seeded(7)  # rank r's generator, which the loop and the forward share
    stream = DeviceStream(device)
    replica, loop = _seeded(7), _seeded(7)  # device r's stream and the loop's, under DataParallel
    for step in range(3):
        assert torch.equal(torch.rand(5, generator=device), torch.rand(5, generator=loop))  # the loop's draw
        with stream.drawing():
            assert torch.equal(torch.rand(4 + step, generator=device), torch.rand(4 + step, generator=replica))
    assert torch.equal(torch.rand(2, generator=device), torch.rand(2, generator=loop))


def test_a_seed_given_by_the_loop_starts_every_stream_over_and_one_given_in_the_forward_stays_there():
    device = _seeded(7)
    stream = DeviceStream(device)
    with stream.drawing():
        torch.rand(3, generator=device)
    torch.rand(3, generator=device)
    device.manual_seed(11)  # torch.manual_seed(11) in the loop: every device starts seed 11's stream
    torch.rand(6, generator=device)
    with stream.drawing():
        assert torch.equal(torch.rand(4, generator=device), torch.rand(4, generator=_seeded(11)))
        device.manual_seed(5)  # seeded inside the forward: the forward's stream
        first = torch.rand(2, generator=device)
    assert device.initial_seed() == 11  # the loop's stream is back
    with stream.drawing():
        assert torch.equal(torch.cat([first, torch.rand(3, generator=device)]), torch.rand(5, generator=_seeded(5)))
