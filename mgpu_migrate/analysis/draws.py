"""Random draws that the runtime cannot make the original's: numpy's and ``random``'s generators, and torch draws
for a batch whose rows were repeated, here and in the project's functions a training loop calls.

The runtime draws torch's per-row randomness once for the global batch and gives each process its rows
(``mgpu_runtime.randomness``), and keeps every process's torch generator where the original's was. It knows
nothing of numpy's or Python's generators: after the migration each process draws from its own, for its own
rows. Nor can it slice a draw for ``n`` copies of the batch laid end to end (``x.expand(n, ...).view(-1, ...)``,
sliced score matching's particles): the process's rows of it are not a contiguous piece of the global draw.

This module reads the project's functions (``ast``); ``rules/unsynced_draws.py`` reads the file's loop.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

from mgpu_migrate.analysis.project import Found, Project

# What makes a generator object of numpy's or Python's (``self.random_state = np.random.RandomState(seed)``).
GENERATORS = frozenset({"numpy.random.RandomState", "numpy.random.default_rng", "numpy.random.Generator", "random.Random"})
# ``numpy.random.*`` that draw nothing.
NOT_DRAWS = frozenset({"seed", "get_state", "set_state", "SeedSequence", "PCG64", "MT19937", "BitGenerator"}) | {
    name.rpartition(".")[2] for name in GENERATORS
}
# Python's ``random`` functions that draw.
PYTHON_DRAWS = frozenset(
    f"random.{name}"
    for name in (
        "random", "uniform", "randint", "randrange", "choice", "choices", "sample", "shuffle", "gauss",
        "normalvariate", "betavariate", "gammavariate", "expovariate", "triangular", "lognormvariate",
    )
)
# Methods of a generator object that draw.
GENERATOR_DRAWS = frozenset(
    {
        "beta", "binomial", "choice", "dirichlet", "exponential", "gamma", "integers", "normal", "permutation",
        "poisson", "rand", "randint", "randn", "random", "random_sample", "shuffle", "standard_normal", "uniform",
        "multinomial", "lognormal", "laplace", "gauss", "sample", "betavariate", "randrange", "choices",
    }
)
# Torch draws shaped like a tensor, and the operations that lay copies of a batch's rows end to end.
TORCH_LIKE_DRAWS = frozenset(f"torch.{name}" for name in ("randn_like", "rand_like", "randint_like"))
REPEATS = frozenset({"expand", "repeat", "repeat_interleave", "cat", "stack", "tile"})
# Names that hold a batch's number of rows, and the words of an expression that name a batch's size.
ROW_COUNTS = frozenset({"bs", "b_size", "n_batch"})
SIZE_WORDS = frozenset({"size", "shape", "len"}) | ROW_COUNTS


def numpy_draw(qualified: str | None) -> bool:
    """A call of numpy's or Python's global generator that draws (``np.random.beta``, ``random.shuffle``)."""
    if qualified is None:
        return False
    if qualified.startswith("numpy.random."):
        return qualified.rpartition(".")[2] not in NOT_DRAWS
    return qualified in PYTHON_DRAWS


# Transforms that draw random numbers per sample besides torchvision's ``Random*`` ones.
DRAWING_TRANSFORMS = frozenset(
    {"ColorJitter", "GaussianBlur", "AutoAugment", "RandAugment", "TrivialAugmentWide", "AugMix", "ElasticTransform"}
)


def drawing_transform(qualified: str) -> bool:
    """A transform class that draws per sample it is applied to (torchvision's ``RandomCrop``, ``ColorJitter``, a
    project's ``transforms.RandomSizedRectCrop``), or any albumentations transform."""
    last = qualified.rpartition(".")[2]
    drawing = last.startswith("Random") or last in DRAWING_TRANSFORMS
    return (drawing and "transform" in qualified.lower()) or qualified.startswith("albumentations.")


def names_a_size(words: list[str]) -> bool:
    """Words of an expression (its names and attributes) that name a batch's size: ``len(x)``, ``batch_size``."""
    return any(word in SIZE_WORDS or "batch" in word.lower() for word in words)


def names_rows(word: str) -> bool:
    """A name (or keyword) that holds a batch's number of rows: ``batch_size``, ``bs``."""
    return word in ROW_COUNTS or "batch" in word.lower()


@dataclass(frozen=True)
class ProjectDraw:
    """A draw in a project function: where (``../utils/utilities.py:133``), its code, and whether it is
    numpy's/Python's (else torch's, for repeated rows); ``sized`` when it draws one number per row, ``shared``
    when from the module's global generator (not a generator object of the class's own)."""

    where: str
    code: str
    numpy: bool
    sized: bool
    shared: bool = False


def project_draws(project: Project, found: Found, method: str | None = None) -> list[ProjectDraw]:
    """The draws the runtime cannot make the original's in a project function, or in ``method`` of a project
    class (looked up in its project bases too)."""
    definition = _method(project, found, method) if method else found
    if definition is None or isinstance(definition.node, ast.ClassDef):
        return []
    generators = _generator_attributes(found.node) if isinstance(found.node, ast.ClassDef) else set()
    module = definition.module
    repeated = _repeated_names(definition.node)
    path = definition.where.rpartition(":")[0]
    found_draws = []
    for call in ast.walk(definition.node):
        if not isinstance(call, ast.Call):
            continue
        qualified = module.qualified(call.func)
        func = call.func
        on_generator = (
            isinstance(func, ast.Attribute)
            and func.attr in GENERATOR_DRAWS
            and isinstance(func.value, ast.Attribute)
            and isinstance(func.value.value, ast.Name)
            and func.value.value.id == "self"
            and func.value.attr in generators
        )
        if numpy_draw(qualified) or on_generator:
            sized = any(_counts_rows(node) for node in [*call.args, *(keyword.value for keyword in call.keywords)])
            found_draws.append(ProjectDraw(f"{path}:{call.lineno}", ast.unparse(call), True, sized, not on_generator))
        elif (
            qualified in TORCH_LIKE_DRAWS
            and call.args
            and isinstance(call.args[0], ast.Name)
            and call.args[0].id in repeated
        ):
            found_draws.append(ProjectDraw(f"{path}:{call.lineno}", ast.unparse(call), False, True))
    return sorted(found_draws, key=lambda draw: int(draw.where.rpartition(":")[2]))


def _method(project: Project, found: Found, name: str, depth: int = 0) -> Found | None:
    if not isinstance(found.node, ast.ClassDef) or depth > 4:
        return None
    for statement in found.node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == name:
            return Found(found.module, statement, found.seen_from)
    for base in found.node.bases:
        _, definition = project.resolve_in(found, base)
        if definition is not None and definition.node is not found.node:
            inherited = _method(project, definition, name, depth + 1)
            if inherited is not None:
                return inherited
    return None


def _generator_attributes(cls: ast.ClassDef) -> set[str]:
    """``self.NAME`` attributes a class assigns a generator of numpy's or Python's (by the constructor's last
    name: ``RandomState``, ``default_rng``, ``Random``)."""
    constructors = {name.rpartition(".")[2] for name in GENERATORS}
    found = set()
    for node in ast.walk(cls):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in constructors:
            continue
        for target in node.targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                found.add(target.attr)
    return found


def _repeated_names(function: ast.AST) -> set[str]:
    """Names a function assigns a value that lays copies of rows end to end (``x.expand(n, ...)``, ``x.repeat``,
    ``torch.cat([x, x])``)."""
    found = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            called = {
                call.func.attr
                for call in ast.walk(node.value)
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            }
            if called & REPEATS:
                found.add(node.targets[0].id)
    return found


def _counts_rows(node: ast.expr) -> bool:
    """``len(x)``, ``x.size(0)``, ``x.shape[0]`` or a name holding a batch's rows, anywhere in ``node``: a draw
    of one number per row (not ``np.random.randint(W)``, a box in an image of ``x.size()``)."""
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and names_rows(child.id):
            return True
        if isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == "len":
            return True
        first = child.args[0] if isinstance(child, ast.Call) and len(child.args) == 1 else None
        if (
            isinstance(child, ast.Call)
            and isinstance(child.func, ast.Attribute)
            and child.func.attr == "size"
            and isinstance(first, ast.Constant)
            and first.value == 0
        ):
            return True
        if (
            isinstance(child, ast.Subscript)
            and isinstance(child.value, ast.Attribute)
            and child.value.attr == "shape"
            and isinstance(child.slice, ast.Constant)
            and child.slice.value == 0
        ):
            return True
    return False


# Draws from torch's global generator (``torch.randn`` too: the prefix).
TORCH_DRAWS = ("torch.rand", "torch.normal", "torch.bernoulli", "torch.multinomial")


def builder_draw(project: Project, found: Found) -> str | None:
    """Where the objects a project builder makes draw random numbers when applied (pytorch-semseg's
    ``get_composed_augmentations``, which composes the classes its module imports from ``augmentations.py``, each
    drawing from Python's ``random``): the first draw (``path:line``) in the builder, the classes and functions of
    its module, and the project definitions its module imports; for a class (speech-commands' ``ChangeAmplitude``,
    whose ``__call__`` draws from Python's ``random``), the class's own methods. None when there is none."""
    module = found.module
    definitions: list[Found] = []
    if isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        definitions = [Found(module, node, found.seen_from) for node in module.definitions.values()]
        for qualified in module.imports.values():
            imported = project.find(qualified)
            if imported is not None:
                definitions.append(imported)
    first: tuple[str, int] | None = None
    for definition in [found, *definitions]:
        line = _draw_line(definition, definition.node)
        if line is not None:
            place = (definition.where.rpartition(":")[0], line)
            if first is None or (place[0] == first[0] and place[1] < first[1]):
                first = place
    return f"{first[0]}:{first[1]}" if first is not None else None


def _draw_line(definition: Found, node: ast.AST) -> int | None:
    """The line of the first call under ``node`` (in ``ast.walk``'s order) that draws from numpy's, Python's or
    torch's global generator, read in ``definition``'s module; None when none does."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call):
            qualified = definition.module.qualified(inner.func) or ""
            if numpy_draw(qualified) or qualified.startswith(TORCH_DRAWS):
                return inner.lineno
    return None


def per_sample_draw(found: Found, project: Project | None = None) -> str | None:
    """For a project dataset class, the first random draw (``path:line``) in its methods other than ``__init__``
    (faster-rcnn's ``roibatchLoader.__getitem__``: numpy's box shuffle and crop offsets), which run for each
    sample read; None when there is none. A draw in ``__init__`` happens once, when the dataset is built. Given the
    project, also a draw they reach: in the project functions they call, and the objects ``__init__`` keeps
    (``Project.sample_draw``)."""
    if not isinstance(found.node, ast.ClassDef):
        return None
    if project is not None:
        made = project.sample_draw(found)
        return f"{os.path.relpath(made.path, found.seen_from)}:{made.line}" if made is not None else None
    for method in found.node.body:
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.name != "__init__":
            line = _draw_line(found, method)
            if line is not None:
                return f"{found.where.rpartition(':')[0]}:{line}"
    return None


def applied_draw(found: Found) -> str | None:
    """Where a function or a class's objects draw random numbers each time they are applied (a transform of the
    script's own, ``def flip(x): return -x if torch.rand(1) < 0.5 else x``, handed to a dataset): the first draw
    (``path:line``) in the function, or in the class's methods other than ``__init__``; None when there is none."""
    if isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        line = _draw_line(found, found.node)
        return f"{found.where.rpartition(':')[0]}:{line}" if line is not None else None
    return per_sample_draw(found)
