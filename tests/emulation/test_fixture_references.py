"""The emulation on the runnable fixtures: where a script has no BatchNorm, no random draw and no loss in
its ``forward``, DataParallel on 1, 2 or 3 devices trains as one plain process does (float64, 1e-9); where
it has them, the emulation differs as DataParallel on GPUs does. The runs are the end-to-end tests'
(``tests/codemod/e2e_runs.py``: every original plain and emulated, in one interpreter)."""

import pytest

from tests.codemod.e2e_runs import compare, difference

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

# No BatchNorm (or one synchronized over the replicas), dropout, random draw or loss inside forward: the
# device counts each runs at (main_argparse asks for 2 GPUs itself: on one, torch refuses its device ids).
PLAIN_IN_FORWARD = {
    **dict.fromkeys(
        [
            "batch_draws",
            "batch_hard_triplet",
            "ctc_loss",
            "distillation",
            "drawn_batches",
            "flat_script",
            "focal_num_pos",
            "logged_metrics",
            "masked_mean",
            "memory_bank",
            "mixup",
            "ohem_topk",
            "output_in_place",
            "pad_to_longest",
            "replication_callback",
            "score_noise",
            "seq2seq_tokens",
            "sequence_first_rnn",
            "simclr_contrastive",
            "step_decisions",
            "sum_loss_whole_data",
            "token_sum_over_count",
            "trainer_class",
            "two_headed",
            "unroll_gradient_hooks",
            "vae_penalty",
            "weighted_tokens",
        ],
        (1, 2, 3),
    ),
    "main_argparse": (2, 3),
}
# What DataParallel on several devices changes: per-chunk BatchNorm, per-device dropout and draws, losses
# computed in forward (their mean over the devices is not the batch's).
DEVICE_DEPENDENT = {
    "batchnorm_last_batch": (2, 3),
    "dropout_epochs": (1, 2, 3),
    "hf_style": (2, 3),
    "hf_unguarded": (2, 3),
    "per_device_losses": (2, 3),
    "per_row_noise": (2, 3),
    "token_mean_in_forward": (2, 3),
}


@pytest.mark.parametrize("name", sorted(PLAIN_IN_FORWARD))
def test_without_device_dependent_forwards_dataparallel_trains_as_one_process(e2e_runs, name):
    for count in PLAIN_IN_FORWARD[name]:
        assert compare(e2e_runs, name, "original", f"emulated{count}") == [], count


@pytest.mark.parametrize("name", sorted(DEVICE_DEPENDENT))
def test_batchnorm_dropout_and_forward_losses_train_differently_on_several_devices(e2e_runs, name):
    plain = e2e_runs(name, "original").weights()
    for count in DEVICE_DEPENDENT[name]:
        assert difference(plain, e2e_runs(name, f"emulated{count}").weights()) > 1e-3, count
