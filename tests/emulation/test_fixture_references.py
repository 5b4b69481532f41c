"""The emulation on the runnable fixtures: where a script has no BatchNorm, no random draw and no loss in
its ``forward``, DataParallel on 1 or 3 devices trains as one plain process does (float64, 1e-9); where
it has them, the emulation differs as DataParallel on GPUs does. One interpreter runs every fixture in turn
(``runner.run``), so torch is imported once."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parents[2] / "fixtures" / "scripts"
# No BatchNorm (or one synchronized over the replicas), dropout, random draw or loss inside forward: the
# device counts each runs at (main_argparse asks for 2 GPUs itself: on one, torch refuses its device ids).
PLAIN_IN_FORWARD = {
    **dict.fromkeys(
        [
            "drawn_batches",
            "flat_script",
            "logged_metrics",
            "masked_mean",
            "mixup",
            "output_in_place",
            "pad_to_longest",
            "replication_callback",
            "score_noise",
            "sequence_first_rnn",
            "sum_loss_whole_data",
            "token_sum_over_count",
            "trainer_class",
            "two_headed",
            "vae_penalty",
            "weighted_tokens",
        ],
        (1, 3),  # one device (the module itself runs) and three (uneven chunks); two: test_verify, test_data_parallel
    ),
    "main_argparse": (3,),
}
# What DataParallel on several devices changes: per-chunk BatchNorm, per-device dropout and losses.
DEVICE_DEPENDENT = {"batchnorm_last_batch": (2, 3), "dropout_epochs": (1, 2, 3), "token_mean_in_forward": (2, 3)}

DRIVER = textwrap.dedent(
    """
    import json, sys
    from mgpu_runtime.emulation import compare, runner

    differences = {}
    for name, counts in json.loads(sys.argv[1]).items():
        plain = runner.run(f"{sys.argv[2]}/{name}.py", float64=True).state()
        for count in counts:
            emulated = runner.run(f"{sys.argv[2]}/{name}.py", devices=count, float64=True).state()
            found = compare.compare(plain, emulated)
            differences[f"{name} {count}"] = [found["largest"]["difference"], found["mismatches"], found["steps"]]
    print(json.dumps(differences))
    """
)


@pytest.fixture(scope="module")
def differences(tmp_path_factory):
    cases = {**PLAIN_IN_FORWARD, **DEVICE_DEPENDENT}
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(cases), str(SCRIPTS)],
        cwd=tmp_path_factory.mktemp("fixture_references"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.xdist_group("fixture_references")
@pytest.mark.parametrize("name", sorted(PLAIN_IN_FORWARD))
def test_without_device_dependent_forwards_dataparallel_trains_as_one_process(differences, name):
    for count in PLAIN_IN_FORWARD[name]:
        largest, mismatches, (plain_steps, emulated_steps) = differences[f"{name} {count}"]
        assert mismatches == [] and plain_steps == emulated_steps > 0
        assert largest <= 1e-9, (name, count, largest)


@pytest.mark.slow
@pytest.mark.xdist_group("fixture_references")
@pytest.mark.parametrize("name", sorted(DEVICE_DEPENDENT))
def test_batchnorm_dropout_and_forward_losses_train_differently_on_several_devices(differences, name):
    for count in DEVICE_DEPENDENT[name]:
        largest, mismatches, _ = differences[f"{name} {count}"]
        assert mismatches == [] and largest > 1e-3, (name, count, largest)
