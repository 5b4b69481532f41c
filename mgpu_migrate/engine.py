"""The engine: source text in, new text and diagnostics out. No files, no command line.

This module stays cheap to import: the parser and the rules load only when a source could hold a
migration site (see ``might_need_migration``).
"""

from __future__ import annotations

import functools
import os
import re

from mgpu_migrate.diagnostics import INTERNAL_ERROR, Diagnostic, error_summary
from mgpu_migrate.options import DEFAULT_OPTIONS, TARGETS, Options
from mgpu_migrate.results import MigrationResult

__all__ = ["TARGETS", "MigrationResult", "might_need_migration", "migrate_source"]

# Every migration site spells one of these somewhere in the file: torch's `DataParallel` (also as the base of
# a subclass), PyTorch-Encoding's `DataParallelModel`/`DataParallelCriterion`, the functional
# `data_parallel` itself (not `data_parallel_size`), torch's `parallel_apply` (DataParallel written by hand),
# and apex's parallel package (`apex.parallel`,
# `from apex import parallel`, or apex under another name), whose DistributedDataParallel is a site; a file
# that already calls `mgpu_runtime` is read again, so a partly migrated file is finished. The sync-BN package's
# `DataParallelWithCallback` is read too, and a name that starts with `data_parallel` where it is called (a
# project's `data_parallel_workaround(model, x)`): they are copies of DataParallel, and a site left must be
# said, and so is a name ending in `DataParallel` (a project's subclass: `CustomDataParallel`). Names that merely end
# in the words otherwise (`DistributedDataParallel`, `FullyShardedDataParallel`, `get_data_parallel_group`), other names
# that start with them (`DataParallelBuffer`, `data_parallel_size(...)`) and apex's other packages
# (`from apex.normalization import FusedLayerNorm`, `from apex import amp`) are not sites.
# Each pattern opens with the word it needs (checked first, as a plain substring search: ~10x faster than a
# regular expression, and it rules out almost every file), so the regular expression engine only scans
# for that literal; the look-behind after it stands for the word boundary before it.
_SITE_PATTERNS = {
    b"DataParallel": (
        re.compile(rb"DataParallel(?<!\wDataParallel)(?:Model|Criterion|WithCallback)?\b"),
        # A project's own subclass (yolact's `CustomDataParallel`), imported or called: a wrap site when its module
        # rebases it (MGP106); not torch's other wrappers, which end in the same word.
        re.compile(rb"DataParallel(?<=\wDataParallel)(?<!DistributedDataParallel)(?<!ShardedDataParallel)\b"),
    ),
    b"data_parallel": (
        # torch's functional form or module, reached as an attribute (nn.parallel.data_parallel(...),
        # import torch.nn.parallel.data_parallel as m) or imported by name; not a keyword argument, a string
        # key or a docstring word (Megatron's data_parallel=True, 'dl.data_parallel.size', "data_parallel groups").
        re.compile(rb"\.\s*data_parallel\b(?!\s*\.)"),
        re.compile(rb"import(?<!\wimport)\s*(?:\([^)]*|(?:[^\n;]|\\\r?\n)*)\bdata_parallel\b"),
        # Called by a name of its own (a copy: data_parallel_workaround(...)); not the process-group vocabulary
        # of model-parallel frameworks (Megatron's data_parallel_size(...)), nor a docstring's
        # "data_parallel (bool): ...".
        re.compile(
            rb"data_parallel(?<!\wdata_parallel)(?!_(?:size|group|rank|world_size|sharding)\w*)\w*"
            rb"(?:\(|\s+\((?![\w.\[\], |]*\)\s*:))"
        ),
    ),
    b"parallel_apply": (re.compile(rb"parallel_apply(?<!\wparallel_apply)\b"),),
    b"mgpu_runtime": (re.compile(rb"mgpu_runtime(?<!\wmgpu_runtime)\b"),),
    b"apex": (
        re.compile(rb"apex(?<!\wapex)\s*\.\s*parallel\b"),
        re.compile(rb"from(?<!\wfrom)\s+apex\s+import\s*(?:\([^)]*|(?:[^\n;]|\\\r?\n)*)\bparallel\b"),
        re.compile(rb"import(?<!\wimport)\s+apex\s+as\b"),
    ),
}


def might_need_migration(source: bytes | str) -> bool:
    """Cheap test: False means the file certainly has nothing to migrate."""
    data = source.encode("utf-8", "surrogateescape") if isinstance(source, str) else source
    return any(
        word in data and any(pattern.search(data) is not None for pattern in patterns)
        for word, patterns in _SITE_PATTERNS.items()
    )


def migrate_source(
    source: str, target: str, path: str = "<string>", options: Options = DEFAULT_OPTIONS
) -> MigrationResult:
    """Migrate one file's text to ``target`` ('balanced' or 'ddp')."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    # The modules this script starts as distributed programs, asked for only when it has no site of its own.
    starts = functools.partial(started_programs, source, target, path, options)
    here = os.path.abspath(path)
    deciding = here not in _DECIDING
    _DECIDING.add(here)  # while this file is migrated, a module that asks whether it migrates assumes it does
    try:
        holds = held_programs(source, target, path, options, built_only=might_need_migration(source))
        handed = () if might_need_migration(source) or holds else handed_programs(source, target, path, options)
        # The modules that may hold its DataParallel fallback beside a distributed path of its own (asked by the
        # program's verdict only of a file with such a path and no site of its own).
        fallbacks = functools.partial(own_path_fallbacks, source, target, path, options)
        if not might_need_migration(source) and not holds and not handed:
            found = starts()
            if not found:
                held = own_path_fallbacks(source, target, path, options)
                if not held:
                    return MigrationResult(path, source, source)
                fallbacks = functools.partial(tuple, held)
            starts = functools.partial(tuple, found)
        from mgpu_migrate.pipeline import run_pipeline

        try:
            return run_pipeline(
                source, target, path, options, starts=starts, holds=holds, fallbacks=fallbacks, handed=handed
            )
        except Exception as error:  # noqa: BLE001 -- the last guard: one odd file must never stop a run
            message = f"internal error ({error_summary(error)}); file left unchanged, please report"
            return MigrationResult(path, source, source, error=Diagnostic(path, 1, 1, INTERNAL_ERROR, message))
    finally:
        if deciding:
            _DECIDING.discard(here)
        if not _DECIDING:
            _MIGRATIONS.clear()  # other files' migrations are kept only within the one that asked for them


def held_programs(
    source: str, target: str, path: str, options: Options = DEFAULT_OPTIONS, built_only: bool = False
) -> tuple[str, ...]:
    """The modules whose wrapped model this module trains (``--to ddp``, the runtime's style): a class here that
    runs a backward pass derives from a project class that holds the wrap on ``self`` (st-gcn's processors), and
    that module migrates; or this module builds and trains a model class of the project that keeps its own wrap
    (CMC's ``MyAlexNetCMC``), the only kind looked for with ``built_only`` (a file with a migration site of its
    own, or a word of one in its text). This module is then migrated with it: its training loaders split, its
    side effects made once (``Program.holds``)."""
    if target != "ddp" or options.style != "runtime" or (built_only and ".backward(" not in source):
        return ()
    from mgpu_migrate.started import built_holders, held_by

    data = source.encode("utf-8", "surrogateescape")
    holders = held_by(path, data, might_need_migration) if "class " in source and not built_only else ()
    if ".backward(" not in source:
        if not holders:
            return ()
        from mgpu_migrate.analysis.held import between

        # A class in between (st-gcn's ``Processor(IO)``, which builds the loaders that ``REC_Processor(Processor)``
        # trains on): its module runs on every process too, its side effects made once.
        holders = tuple(module for module in holders if between(path, module))
    else:
        # A model class that keeps its own wrap, built here (CMC's ``MyAlexNetCMC``), in a module that trains nothing.
        built = built_holders(path, data, might_need_migration)
        holders += tuple(module for module in built if module not in holders)
    return tuple(module for module in holders if _becomes_a_program(module, options))


def handed_programs(source: str, target: str, path: str, options: Options = DEFAULT_OPTIONS) -> tuple[str, ...]:
    """The scripts of the project that hand this module's training code a wrapped model and migrate (``--to ddp``,
    the runtime's style): Conv-TasNet's ``train.py`` wraps the model and builds ``Solver(data, model, ...)`` of
    ``solver.py``, whose methods run the backward pass. This module's code then runs on every process of their
    program, and is migrated with them: its side effects made once (``Program.handed``); its data is split in
    those scripts (``analysis/handed.py``)."""
    if target != "ddp" or options.style != "runtime" or ".backward(" not in source:
        return ()
    wrapping = _handing_importers(source.encode("utf-8", "surrogateescape"), path)
    if not wrapping:
        return ()
    names = [name.encode() for name in _training_definitions(source)]
    return tuple(
        importer
        for importer, text in wrapping
        if any(name in text for name in names) and _becomes_a_program(importer, options)
    )


def _handing_importers(data: bytes, path: str) -> list[tuple[str, bytes]]:
    """For a module that runs a backward pass and is no script: the project modules that import it, may hold a
    migration site and run no backward pass themselves (``HandedTraining`` reads only such a file), with their
    bytes."""
    from mgpu_migrate import files
    from mgpu_migrate.started import is_script, wrapping_importers

    if b".backward(" not in data or is_script(data, path):
        return []  # a script trains what it builds; a trainer module is imported
    found = []
    for importer in wrapping_importers(path, might_need_migration):
        try:
            text = files.read(importer, 1 << 20)[0]
        except OSError:
            continue
        if b".backward(" not in text:
            found.append((importer, text))
    return found


def _training_definitions(source: str) -> list[str]:
    """The module-level classes and functions of ``source`` whose code calls ``.backward(``."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return [
        node.name
        for node in tree.body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and ".backward(" in (ast.get_source_segment(source, node) or "")
    ]


# A distributed set-up of the script's own, as the program's verdict reads it (``program.existing_setup``).
_OWN_SET_UP = (b"init_process_group", b"DistributedDataParallel", b"DistributedSampler", b"spawn")


def own_path_fallbacks(source: str, target: str, path: str, options: Options = DEFAULT_OPTIONS) -> tuple[str, ...]:
    """For a script with no migration site of its own and a distributed set-up of its own (``--to ddp``, the
    runtime's style): the project modules it imports that hold a DataParallel site, where its DataParallel
    fallback may be (a builder that wraps the model it trains, DialoGPT's ``load_model``). The pipeline reads
    which (``program.Program.fallback``); a plain start of the script may then launch its own path (MGP139)."""
    if target != "ddp" or options.style != "runtime":
        return ()
    data = source.encode("utf-8", "surrogateescape")
    if not any(word in data for word in _OWN_SET_UP):
        return ()
    from mgpu_migrate.started import candidates

    return candidates(path, data, might_need_migration)


def might_start_module(data: bytes) -> bool:
    """A module a script imports that may become a distributed program: one with a migration site, or one that
    trains and may train a model a project class holds (``held_programs``)."""
    return might_need_migration(data) or b".backward(" in data


def might_start_a_program(data: bytes, target: str, path: str) -> bool:
    """Cheap test, for a file with nothing to migrate of its own: under ``--to ddp``, a script with a main block
    that imports a module of the project that may become a distributed program (``analysis.started``)."""
    if target != "ddp":
        return False
    from mgpu_migrate.started import built_holders, candidates, held_by

    if b".backward(" in data and (held_by(path, data, might_need_migration) or built_holders(path, data, might_need_migration)):
        return True  # it may train a model a project class holds (a base class, or a class it builds)
    if b"class " in data and b".backward(" not in data:
        from mgpu_migrate.analysis.held import between

        if any(between(path, module) for module in held_by(path, data, might_need_migration)):
            return True  # a class between that one and a subclass that trains its model
    if _handing_importers(data, path):
        return True  # it may train a model a script of the project wraps and hands it (handed_programs)
    started = b"__main__" in data or b".parse_args(" in data or b".parse_known_args(" in data
    return started and bool(candidates(path, data, might_start_module))


def _started_programs(source: str, target: str, path: str, options: Options) -> tuple[str, ...]:
    """The modules a script with no migration site of its own starts as distributed programs (``--to ddp``, the
    runtime's style): those it imports that its migration makes one, with no entry point of their own. The
    script is then migrated as their entry point (the set-up, its writes made once)."""
    if target != "ddp" or options.style != "runtime" or (
        "__main__" not in source and ".parse_args(" not in source and ".parse_known_args(" not in source
    ):
        return ()
    from mgpu_migrate.started import candidates

    data = source.encode("utf-8", "surrogateescape")
    return tuple(module for module in candidates(path, data, might_start_module) if _becomes_a_program(module, options))


def _becomes_a_program(path: str, options: Options) -> bool:
    """Whether ``--to ddp`` migrates the module at ``path`` (read once per run and modification time).

    A module whose verdict is being decided (``_DECIDING``: the file being migrated, and each module asked
    about on the way) is assumed to migrate when a module it asks about asks about it in turn: a class that holds
    the wrap migrates when the modules that train its model do, and they migrate when it does. A verdict reached
    under such an assumption is not kept, since it holds only for the one that assumed it."""
    path = os.path.abspath(path)
    if being_decided(path):
        return True
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return False
    key = (path, stamp, options)
    if key in _VERDICTS:
        return _VERDICTS[key]
    before = _ASSUMED[0]
    verdict = _migrated_under_ddp(path, options)
    if _ASSUMED[0] == before:
        if len(_VERDICTS) > 256:
            _VERDICTS.clear()
        _VERDICTS[key] = verdict
    return verdict


@functools.lru_cache(maxsize=256)
def started_programs(source: str, target: str, path: str, options: Options = DEFAULT_OPTIONS) -> tuple[str, ...]:
    return _started_programs(source, target, path, options)


_DECIDING: set[str] = set()
_ASSUMED = [0]
_VERDICTS: dict[tuple[str, int, Options], bool] = {}


def being_decided(path: str) -> bool:
    """Whether the module at ``path`` is being migrated further up this call (``_DECIDING``): a module asked about
    on the way that asks about it in turn assumes it migrates, and asks nothing more of it. Without this, two
    modules that each read the other's migration (a class that holds the wrap, a script that trains its model
    and asks where the class sets up) would migrate each other without end."""
    if os.path.abspath(path) in _DECIDING:
        _ASSUMED[0] += 1
        return True
    return False


def migration_of(path: str, options: Options = DEFAULT_OPTIONS) -> MigrationResult | None:
    """The ``--to ddp`` migration of the module at ``path`` (None when it cannot be read), kept while the file
    that asked is migrated, unless it was reached under an assumption (``being_decided``)."""
    from mgpu_migrate import files

    try:
        text = files.read(path)[0].decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    key = (os.path.abspath(path), text, options)
    if key in _MIGRATIONS:
        return _MIGRATIONS[key]
    before = _ASSUMED[0]
    result = migrate_source(text, "ddp", path, options)
    if _ASSUMED[0] == before:
        _MIGRATIONS[key] = result
    return result


_MIGRATIONS: dict[tuple[str, str, Options], MigrationResult] = {}


def _migrated_under_ddp(path: str, options: Options) -> bool:
    """Whether ``--to ddp`` migrates the module at ``path``: it changes, and not only by rewriting the bodies of
    helpers (``Code.helper_body``: a hand-written data_parallel that calls the runtime's, whose callers are the
    programs)."""
    result = migration_of(path, options)
    if result is None or not result.changed or result.error is not None:
        return False
    helpers = _helper_body_codes()
    rewrites = {diagnostic.code for diagnostic in result.diagnostics if diagnostic.code.startswith(_REWRITE_PREFIX)}
    return not rewrites or not rewrites <= helpers


_REWRITE_PREFIX = "MGP1"


@functools.cache
def _helper_body_codes() -> frozenset[str]:
    from mgpu_migrate.rules import RULES

    return frozenset(rule.CODE.code for rule in RULES if rule.CODE.helper_body)
