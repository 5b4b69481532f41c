"""End to end, --to ddp: each runnable fixture script's committed migration trains as its original does under
nn.DataParallel on the same number of devices.

The reference is the original under the emulated DataParallel on 2 and 3 devices; the migration runs under
``torchrun --nproc_per_node=2`` and ``=3`` (gloo on the CPU, uneven chunks), in float64, so the final weights
agree to 1e-9 and the printed lines are the same (``tests/codemod/e2e_runs.py`` runs them all, once). Run as
one plain process (a world of one) the migration is the plain original.
"""

from __future__ import annotations

import pytest

from tests.codemod.e2e_runs import DDP_SCRIPTS, LEGACY_ASYNC, SYNC_BN, WORLD_SIZES, compare

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

# The shapes the issues name (flat, main() with argparse and train/eval functions, a trainer class, HF style
# with the loss in the model and n_gpu guards, two heads, and the losses of issue 22), among the runnable ones.
REQUIRED = (
    "flat_script",
    "main_argparse",
    "trainer_class",
    "hf_style",
    "two_headed",
    "seq2seq_tokens",
    "focal_num_pos",
    "memory_bank",
    "batch_hard_triplet",
    "masked_mean",
    "ohem_topk",
    "ctc_loss",
    "simclr_contrastive",
    "distillation",
    "mixup",
    "step_decisions",
    "batch_draws",
)
# The shapes of real projects (issue 23) reduced to a fixture script each, with the project they come from.
REAL_PROJECT_SCRIPTS = {
    "own_group_helpers": "helpers that ask dist.is_initialized() (SimCLR's loss average, get_world_size/reduce_tensor)",
    "margin_head": "a margin head trained outside the wrap (face.evoLVe's ArcFace)",
    "frozen_backbone": "a backbone frozen after the wrap",
    "frozen_discriminator": "a GAN's discriminator frozen for the generator's step",
    "two_backward_passes": "two backward passes through one forward",
    "trainer_two_passes": "a trainer class running two backward passes",
    "triplet_by_name": "a batch-hard triplet loss object called by name",
    "own_batches": "batches the script cuts itself",
    "own_transform_class": "erfnet: an augmentation class of the script's own file drawing from Python's random",
    "forward_switch": "erfnet's phases: a forward switch (`only_encode=True`) leaves the decoder out",
    "onehot_metric": "erfnet's iouEval: a plain zeros tensor filled by scatter_ from the argmax of the output",
    "one_row_eval": "pytorch_resnet_cifar10: an evaluation loader left whole whose last batch has one row",
    "transfer_learning": "PyTorch's transfer-learning tutorial: dataloaders[phase], a TemporaryDirectory of the best weights",
    "averaged_copy": "Person_reID's --wa: swa_utils.AveragedModel(model) and copy.deepcopy(model) of the wrap",
    "run_directory_check": "Face_Pytorch: `if os.path.exists(save_dir): raise` right before the run's directory is made",
    "idle_rank_feature_norm": "MobileFaceNet: a BatchNorm1d over the flattened features, a rank idle in a last batch of fewer chunks",
}
# The original cannot train on several devices (MGP340): the tool leaves it, and it is no migration to run.
UNTRAINABLE_ON_SEVERAL = "detection_losses"


def test_the_named_shapes_are_migrated():
    assert set(REQUIRED) <= set(DDP_SCRIPTS), set(REQUIRED) - set(DDP_SCRIPTS)
    assert set(REAL_PROJECT_SCRIPTS) <= set(DDP_SCRIPTS), set(REAL_PROJECT_SCRIPTS) - set(DDP_SCRIPTS)
    assert UNTRAINABLE_ON_SEVERAL not in DDP_SCRIPTS


@pytest.mark.parametrize("processes", WORLD_SIZES)
@pytest.mark.parametrize("script", DDP_SCRIPTS)
def test_the_migration_trains_as_dataparallel_on_as_many_devices(e2e_runs, script, processes):
    assert compare(e2e_runs, script, f"emulated{processes}", f"torchrun{processes}") == []


@pytest.mark.parametrize("script", DDP_SCRIPTS)
def test_the_migration_as_one_process_trains_as_the_plain_original(e2e_runs, script):
    assert compare(e2e_runs, script, "original", "python") == []


@pytest.mark.parametrize("processes", WORLD_SIZES)
def test_with_sync_bn_the_migration_normalises_over_the_global_batch_as_one_device_did(e2e_runs, processes):
    """--sync-bn trades DataParallel's per-device statistics for the whole batch's: the plain original's."""
    assert compare(e2e_runs, "sync-bn", "original", f"torchrun{processes}", SYNC_BN) == []
    assert compare(e2e_runs, "sync-bn", "original", "python", SYNC_BN) == []
    # ... which really differ from DataParallel's per-device ones: the comparison means something.
    assert compare(e2e_runs, SYNC_BN, f"emulated{processes}", "original") != []


@pytest.mark.parametrize("devices", WORLD_SIZES)
def test_a_script_dataparallel_cannot_train_on_several_devices_fails_there_as_mgp340_says(e2e_runs, devices):
    assert e2e_runs(UNTRAINABLE_ON_SEVERAL, "original").failure is None
    failure = e2e_runs(UNTRAINABLE_ON_SEVERAL, f"emulated{devices}").failure
    assert failure is not None and "grad can be implicitly created only for scalar outputs" in failure


@pytest.mark.parametrize("processes", WORLD_SIZES)
def test_a_script_with_pytorch_03s_async_keyword_trains_as_dataparallel_once_migrated(e2e_runs, processes):
    """MGP136: the original parses on no Python from 3.7 on; its reference is the same script with the keyword's
    new name, under the emulated DataParallel."""
    assert compare(e2e_runs, LEGACY_ASYNC.stem, f"emulated{processes}", f"torchrun{processes}") == []
    assert compare(e2e_runs, LEGACY_ASYNC.stem, "original", "python") == []
