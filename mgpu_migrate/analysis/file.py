"""FileAnalysis: one parsed file and the facts about it that rules share."""

from __future__ import annotations

from functools import cached_property

import libcst as cst

from mgpu_migrate.analysis.devices import chosen_by_the_caller, chosen_in_method, names_read, read_names
from mgpu_migrate.analysis.entrypoint import EntryPoint, find_entry_point, main_function
from mgpu_migrate.analysis.handed import HandedTraining
from mgpu_migrate.analysis.loaders import LoaderFlow
from mgpu_migrate.analysis.losses import LossFlow
from mgpu_migrate.analysis.models import ModelFlow
from mgpu_migrate.analysis.parsed import ParsedFile


class FileAnalysis(ParsedFile):
    """A parsed file (``ParsedFile``: its index, bindings, values, positions) and the analyses built on it, each
    computed on first use. Rules read it; they never change it."""

    @cached_property
    def models(self) -> ModelFlow:
        """Wrapped models: where they are made, held and called, and where their outputs go."""
        return ModelFlow(self)

    @cached_property
    def losses(self) -> LossFlow:
        """The losses computed on wrapped models' outputs, and where their criteria are built."""
        return LossFlow(self, self.models)

    @cached_property
    def entry_point(self) -> EntryPoint | None:
        """Where ``mgpu_runtime.setup()`` goes (None: the file has no place that runs first)."""
        # The training loops, and the calls that run the project's training loop this file hands its model to.
        training: list[cst.For | cst.Call] = [*self.loaders.training_loops, *self.handed.training_calls]
        wraps = [site.call for site in self.models.sites]
        device_names = read_names(wraps)
        if not wraps and "device" in self.source and main_function(self) is not None:
            # A script whose calls hand the GPUs to the project's code that wraps on them (``BERTTrainer(...,
            # cuda_devices=args.cuda_devices)``): its set-up goes where what they read is bound.
            from mgpu_migrate.program import handed_device_ids

            device_names = names_read(given for _, given in handed_device_ids(self, None))
        in_method = chosen_in_method(self, wraps) if "self" in device_names else None
        place = f"in {in_method.method}(), where it chooses the GPUs" if in_method is not None else ""
        method_entry = EntryPoint(in_method.anchor, True, place, in_method.devices) if in_method is not None else None
        by_caller = chosen_by_the_caller(self, wraps) if "self" in device_names and in_method is None else None
        if by_caller is not None:
            # The main function hands the class the GPUs in a namespace (pytorch-deeplab-xception's Trainer(args)).
            place = f"in {by_caller.function}(), after it chooses the GPUs"
            method_entry = EntryPoint(by_caller.anchor, True, place, by_caller.devices)
        return find_entry_point(self, training, device_names, method_entry)

    @cached_property
    def handed(self) -> HandedTraining:
        """The calls that hand a wrapped model to the project's training code in another module, followed there."""
        return HandedTraining(self, self.models, self.loaders)

    @cached_property
    def loaders(self) -> LoaderFlow:
        """Training and evaluation loops, and the loaders that feed them."""
        return LoaderFlow(self, self.flow)

    def release(self) -> None:
        """Drop what was computed. The flows above refer back to this analysis, so until this is called the
        file's whole tree stays alive in that reference cycle, and every collection of Python's garbage
        collector walks it again until a full collection frees it; released, the tree is freed as soon as the
        migration returns. The analysis is not used after it."""
        self.__dict__.clear()
