"""The rewrite rules, one module each, over one shared analysis, run phase by phase (``rules.base``):
the wrap rules, then, given the file's verdict (``mgpu_migrate.program``), the program rules and the checks.
Within a phase no rule reads another's edits, so the order below is only the order of their edits."""

from __future__ import annotations

from mgpu_migrate.rules.apex_ddp import ApexDDP
from mgpu_migrate.rules.base import TARGETS, Rule
from mgpu_migrate.rules.batch_coupling import BatchCoupling
from mgpu_migrate.rules.checkpoint_load import CheckpointLoad
from mgpu_migrate.rules.checkpoint_save import CheckpointSave, TorchCheckpointSave
from mgpu_migrate.rules.clock_names import ClockNames
from mgpu_migrate.rules.data_parallel_subclass import DataParallelSubclass
from mgpu_migrate.rules.device_selection import DeviceSelection
from mgpu_migrate.rules.directories import DirectoriesOnce
from mgpu_migrate.rules.downloads import Downloads
from mgpu_migrate.rules.encoding_pair import EncodingPair
from mgpu_migrate.rules.entry_point import EntryPointSetup, TorchSetup
from mgpu_migrate.rules.explicit_device import ExplicitDevice
from mgpu_migrate.rules.forward_losses import ForwardLosses
from mgpu_migrate.rules.functional_data_parallel import FunctionalDataParallel
from mgpu_migrate.rules.functional_loss import FunctionalLoss
from mgpu_migrate.rules.global_count import GlobalCount
from mgpu_migrate.rules.global_metrics import GlobalMetrics
from mgpu_migrate.rules.hand_written import HandWrittenDataParallel
from mgpu_migrate.rules.legacy_async import LegacyAsyncKeyword
from mgpu_migrate.rules.local_rank_argument import LocalRankArgument
from mgpu_migrate.rules.main_process_collective import MainProcessCollective
from mgpu_migrate.rules.per_rank_steps import PerRankSteps
from mgpu_migrate.rules.mixed_rows import MixedRows
from mgpu_migrate.rules.noqa_comments import NoqaComments
from mgpu_migrate.rules.own_path_launch import OwnPathLaunch
from mgpu_migrate.rules.process_group_check import ProcessGroupCheck
from mgpu_migrate.rules.process_randomness import ProcessRandomness
from mgpu_migrate.rules.progress_bar import ProgressBar
from mgpu_migrate.rules.project_losses import ProjectLosses
from mgpu_migrate.rules.project_side_effects import ProjectSideEffects
from mgpu_migrate.rules.project_training import ProjectTraining
from mgpu_migrate.rules.project_wrappers import ProjectWrappers
from mgpu_migrate.rules.remote_training import RemoteTraining
from mgpu_migrate.rules.replica_threads import ThreadLinkedLayers
from mgpu_migrate.rules.repeated_backward import RepeatedBackward
from mgpu_migrate.rules.replication_callback import ReplicationCallback
from mgpu_migrate.rules.shared_files import SharedFiles
from mgpu_migrate.rules.sync_batchnorm import SyncBatchNorm
from mgpu_migrate.rules.torch_criterion import TorchCriterion
from mgpu_migrate.rules.torch_per_process import TorchPerProcess
from mgpu_migrate.rules.training_data import TorchTrainingData, TrainingData
from mgpu_migrate.rules.unsplit_data import UnsplitData
from mgpu_migrate.rules.unsynced_draws import UnsyncedDraws
from mgpu_migrate.rules.forward_draws import ForwardDraws
from mgpu_migrate.rules.unused_parameters import UnusedParameters
from mgpu_migrate.rules.wrap_guard import WrapGuard
from mgpu_migrate.rules.wrapper_check import WrapperCheck
from mgpu_migrate.rules.wrapper_swap import TorchWrapperSwap, WrapperSwap
from mgpu_migrate.rules.writer_objects import WriterObjects

RULES: tuple[type[Rule], ...] = (
    WrapperSwap,
    TorchWrapperSwap,
    DataParallelSubclass,
    EncodingPair,
    FunctionalDataParallel,
    HandWrittenDataParallel,
    TorchCriterion,
    FunctionalLoss,
    # Both targets: a model DataParallel could not run on several GPUs (a dict of scalar losses from forward).
    ForwardLosses,
    # (each Torch* rule is its default's twin under --style torch: plain PyTorch, no runtime)
    # --to ddp: apex's wrapper (a wrap rule), then the rest of a distributed program (program rules and a check).
    ApexDDP,
    EntryPointSetup,
    TorchSetup,
    OwnPathLaunch,
    LocalRankArgument,
    ProcessGroupCheck,
    WrapGuard,
    TrainingData,
    TorchTrainingData,
    RemoteTraining,
    BatchCoupling,
    TorchPerProcess,
    GlobalCount,
    MixedRows,
    UnsyncedDraws,
    ForwardDraws,
    ReplicationCallback,
    CheckpointSave,
    TorchCheckpointSave,
    DirectoriesOnce,
    CheckpointLoad,
    ProgressBar,
    ExplicitDevice,
    SyncBatchNorm,
    UnusedParameters,
    # What torch's DDP cannot run that DataParallel could: two backward passes over one forward, layers that meet
    # their copies in DataParallel's replica threads.
    RepeatedBackward,
    ThreadLinkedLayers,
    MainProcessCollective,
    ProcessRandomness,
    SharedFiles,
    WriterObjects,
    ProjectSideEffects,
    Downloads,
    ClockNames,
    # Both targets (a check): checks for a wrapper recognize the new ones.
    WrapperCheck,
    # What the file alone does not show: the project's own wrappers and training code (analysis/project.py),
    # GPUs chosen by id, decisions each process would take alone.
    ProjectWrappers,
    ProjectTraining,
    ProjectLosses,
    DeviceSelection,
    PerRankSteps,
    UnsplitData,
    # Counts a split training loop adds up from its rows: the global batch's.
    GlobalMetrics,
    # Both targets: PyTorch's old `async=` keyword, which made the file unparsable (old_keywords.py).
    LegacyAsyncKeyword,
    # Last: what the file's noqa comments silenced, once every other rule has asked them.
    NoqaComments,
)


def rules_for(target: str, phase: str | None = None, style: str | None = None) -> list[type[Rule]]:
    """The rules that run for ``target`` (in ``phase`` only, and under ``style`` only, when given), in the order
    of ``RULES``."""
    return [
        rule
        for rule in RULES
        if target in rule.TARGETS and phase in (None, rule.PHASE) and style in (None, *rule.STYLES)
    ]


__all__ = ["RULES", "TARGETS", "Rule", "rules_for"]
