"""The rewrite rules, one module each, run in this order over one shared analysis."""

from __future__ import annotations

from mgpu_migrate.rules.apex_ddp import ApexDDP
from mgpu_migrate.analysis import FileAnalysis
from mgpu_migrate.analysis.entrypoint import distributed_program
from mgpu_migrate.edits import Edits
from mgpu_migrate.rules.base import DDP, TARGETS, Rule
from mgpu_migrate.rules.batch_coupling import BATCH_COUPLED, BatchCoupling
from mgpu_migrate.rules.checkpoint_load import CheckpointLoad
from mgpu_migrate.rules.checkpoint_save import CheckpointSave
from mgpu_migrate.rules.criterion_wrap import CriterionWrap
from mgpu_migrate.rules.data_parallel_subclass import DataParallelSubclass
from mgpu_migrate.rules.encoding_pair import EncodingPair
from mgpu_migrate.rules.entry_point import EntryPointSetup
from mgpu_migrate.rules.explicit_device import ExplicitDevice
from mgpu_migrate.rules.functional_data_parallel import FunctionalDataParallel
from mgpu_migrate.rules.functional_loss import FunctionalLoss
from mgpu_migrate.rules.global_count import GlobalCount
from mgpu_migrate.rules.local_rank_argument import LocalRankArgument
from mgpu_migrate.rules.main_process_collective import MainProcessCollective
from mgpu_migrate.rules.mixed_rows import MIXED_ROWS, MixedRows
from mgpu_migrate.rules.process_randomness import ProcessRandomness
from mgpu_migrate.rules.progress_bar import ProgressBar
from mgpu_migrate.rules.remote_training import INFERENCE_ONLY, RemoteTraining
from mgpu_migrate.rules.replication_callback import REPLICATION_CALLBACK, ReplicationCallback
from mgpu_migrate.rules.shared_files import SharedFiles
from mgpu_migrate.rules.sync_batchnorm import SyncBatchNorm
from mgpu_migrate.rules.training_data import TrainingData
from mgpu_migrate.rules.unused_parameters import UnusedParameters
from mgpu_migrate.rules.wrap_guard import SWITCHED_OFF, WrapGuard
from mgpu_migrate.rules.wrapper_check import WrapperCheck
from mgpu_migrate.rules.wrapper_swap import WrapperSwap

RULES: tuple[type[Rule], ...] = (
    WrapperSwap,
    DataParallelSubclass,
    EncodingPair,
    FunctionalDataParallel,
    CriterionWrap,
    FunctionalLoss,
    # --to ddp: the rest of a distributed program.
    ApexDDP,
    EntryPointSetup,
    LocalRankArgument,
    WrapGuard,
    TrainingData,
    RemoteTraining,
    BatchCoupling,
    GlobalCount,
    MixedRows,
    ReplicationCallback,
    CheckpointSave,
    CheckpointLoad,
    ProgressBar,
    ExplicitDevice,
    SyncBatchNorm,
    UnusedParameters,
    MainProcessCollective,
    ProcessRandomness,
    SharedFiles,
    # Both targets: checks for a wrapper recognize the new ones.
    WrapperCheck,
)


def settle(target: str, analysis: FileAnalysis, edits: Edits) -> None:
    """What holds for the file as a whole, once every rule has run.

    ``--to ddp`` migrates a file entirely or not at all: when one DataParallel wrap must stay (``dim != 0``,
    part of a model, ``# noqa`` ...), the others are not rewritten either, since a file that runs some wraps
    as one process per GPU and others as DataParallel, without the set-up and data of a distributed program,
    works neither way. The diagnostics say which wrap stays and why (MGP232 on the others).
    """
    if target != DDP:
        return
    program = distributed_program(analysis, edits.replacements)
    if program.kept and not program.existing:  # its isinstance checks and criteria too stay as they are
        edits.discard_rewrites()
    else:
        # An evaluation script (DataParallel serves it better), a loss that compares the rows of a batch with
        # each other, a wrap switched off by a flag: what was said about the distributed program it would have
        # become no longer applies.
        for verdict in (INFERENCE_ONLY, BATCH_COUPLED, MIXED_ROWS, REPLICATION_CALLBACK, SWITCHED_OFF):
            if any(diagnostic.code == verdict for diagnostic in edits.diagnostics):
                edits.discard_rewrites(keep={verdict, *WrapperSwap.REVIEW_CODES})
                return


def rules_for(target: str) -> list[type[Rule]]:
    return [rule for rule in RULES if target in rule.TARGETS]


def rule_for_code(code: str) -> type[Rule] | None:
    """The rule that rewrites with ``code`` or reports it for review."""
    code = code.upper()
    for rule in RULES:
        if rule.CODE == code or code in rule.REVIEW_CODES:
            return rule
    return None


__all__ = ["RULES", "TARGETS", "Rule", "rule_for_code", "rules_for"]
