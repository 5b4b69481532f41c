"""The emulated devices: the count a script sees, a random stream per device, seeding as torch seeds GPUs."""

import pytest
import torch

from mgpu_runtime.emulation import devices
from mgpu_runtime.emulation.devices import on_device


def draws(seed: int, *shapes) -> list[torch.Tensor]:
    """What a stream seeded with ``seed`` gives for ``torch.rand(shape)`` after ``torch.rand`` of each earlier shape."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(shape, generator=generator) for shape in shapes]


def test_the_device_count_is_emulated_while_cuda_stays_unavailable(emulate):
    cuda_count = torch.cuda.device_count
    emulate(3)
    assert (torch.cuda.device_count(), torch.cuda.is_available(), devices.count()) == (3, False, 3)
    emulate(3)  # idempotent
    with pytest.raises(RuntimeError, match="uninstall"):
        emulate(2)
    devices.uninstall()
    assert torch.cuda.device_count is cuda_count and torch.cuda.device_count() == 0 and devices.count() == 0


def test_torch_manual_seed_seeds_every_device_as_it_seeds_the_gpus(emulate):
    emulate(3)
    torch.manual_seed(123)
    assert torch.cuda.initial_seed() == 123
    for index in range(3):
        with on_device(index):
            assert torch.cuda.current_device() == index and torch.cuda.initial_seed() == 123
            assert torch.equal(torch.rand(4), draws(123, 4)[0])  # alike seeded devices draw alike
    assert torch.equal(torch.rand(4), draws(123, 4)[0])  # the process's own stream, untouched by the devices'


def test_installed_devices_start_at_the_seed_torch_last_gave_every_device(emulate):
    torch.manual_seed(77)  # before the devices exist: torch.manual_seed seeds every GPU with the CPU's seed
    torch.rand(5)  # the CPU's own draws move no GPU's stream
    emulate(3)
    for index in range(3):
        with on_device(index):
            assert torch.cuda.initial_seed() == 77 and torch.equal(torch.rand(2), draws(77, 2)[0])


def test_cuda_manual_seed_seeds_the_current_device_only_and_seed_all_gives_all_one_new_seed(emulate):
    emulate(3)
    torch.cuda.manual_seed_all(5)
    with on_device(1):
        torch.cuda.manual_seed(9)
    assert [seed_of(index) for index in range(3)] == [5, 9, 5]
    torch.cuda.seed_all()
    new = {seed_of(index) for index in range(3)}
    assert len(new) == 1 and new != {5}
    with on_device(2):
        torch.cuda.seed()
    assert seed_of(2) != seed_of(0) == seed_of(1)


def seed_of(index: int) -> int:
    with on_device(index):
        return torch.cuda.initial_seed()


def test_torch_seed_hands_the_cpus_new_seed_to_every_device(emulate):
    emulate(2)
    cpu_seed = torch.seed()
    assert [seed_of(0), seed_of(1), torch.initial_seed()] == [cpu_seed] * 3


def test_a_device_block_draws_its_stream_on_and_the_process_stream_goes_on_after_it(emulate):
    emulate(2)
    torch.manual_seed(7)
    with on_device(1):
        first = torch.rand(3)
    outside = torch.rand(2)
    with on_device(1):
        second = torch.rand(5)
    expected_first, expected_second = draws(7, 3, 5)
    assert torch.equal(first, expected_first) and torch.equal(second, expected_second)
    assert torch.equal(outside, draws(7, 2)[0])


def test_blocks_nest_and_each_device_keeps_its_place(emulate):
    emulate(2)
    torch.manual_seed(11)
    with on_device(0):
        a = torch.rand(2)
        with on_device(1):
            b = torch.rand(2)
            with on_device(1):
                c = torch.rand(2)
            assert torch.cuda.current_device() == 1
        d = torch.rand(2)
        assert torch.cuda.current_device() == 0
    assert torch.cuda.current_device() == 0
    zero_a, zero_d = draws(11, 2, 2)
    one_b, one_c = draws(11, 2, 2)
    assert all(torch.equal(x, y) for x, y in ((a, zero_a), (d, zero_d), (b, one_b), (c, one_c)))
    assert torch.equal(torch.rand(2), draws(11, 2)[0])


def test_the_rng_state_functions_read_and_write_the_stream_that_is_drawing(emulate):
    emulate(2)
    torch.manual_seed(3)
    with on_device(1):
        torch.rand(4)
        assert torch.equal(torch.cuda.get_rng_state(1), torch.get_rng_state())
        assert torch.equal(torch.cuda.get_rng_state(), torch.get_rng_state())  # 'cuda': the current device
        saved = torch.cuda.get_rng_state_all()
        again = torch.rand(3)
    torch.cuda.set_rng_state_all(saved)
    with on_device(1):
        assert torch.equal(torch.rand(3), again)
    torch.cuda.set_rng_state(torch.cuda.get_rng_state("cuda:1"), torch.device("cuda", 0))
    assert seed_of(0) == 3


def test_fork_rng_forks_the_emulated_devices(emulate):
    emulate(2)
    torch.manual_seed(1)
    with torch.random.fork_rng(devices=[0, 1]):
        with on_device(1):
            torch.rand(100)
    with on_device(1):
        assert torch.equal(torch.rand(2), draws(1, 2)[0])


def test_on_device_refuses_a_device_that_is_not_emulated(emulate):
    emulate(2)
    with pytest.raises(ValueError, match="not one of the 2 emulated devices"):
        on_device(2)
