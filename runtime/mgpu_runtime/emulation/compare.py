"""``python -m mgpu_runtime.emulation.compare ORIGINAL MIGRATED``: how far two runs' models are apart.

Both files are states the runner wrote (``--state``). Prints one JSON document:
``{"steps": [original's, migrated's], "models": [count, count], "largest": {"difference", "model", "name"}
or null, "mismatches": [sentence, ...]}`` (``model`` null: a parameter trained outside the wrapped models,
named by its optimizer's place). The difference of two tensors is the largest absolute difference
of their elements in float64 (NaN against NaN is 0, NaN against a number infinite); a mismatch is what
no number measures: a model or a tensor only one run has, shapes or dtypes that differ, a tensor NaN in both runs
(both trainings broke down: nothing is verified).
``mgpu-migrate verify`` reads it (the tool never imports torch).
"""

from __future__ import annotations

import json
import sys

import torch


def difference(original: torch.Tensor, migrated: torch.Tensor) -> float:
    if original.numel() == 0:
        return 0.0
    first, second = original.detach().to(torch.float64), migrated.detach().to(torch.float64)
    both_nan = first.isnan() & second.isnan()
    apart = (first - second).abs().nan_to_num(nan=float("inf")).masked_fill(both_nan, 0.0)
    return apart.max().item()


def compare(original: dict, migrated: dict) -> dict:
    mismatches: list[str] = []
    largest: dict | None = None
    undefined = ""  # the first tensor that is NaN in both runs
    originals, migrations = original["models"], migrated["models"]
    if len(originals) != len(migrations):
        mismatches.append(f"the original has {len(originals)} wrapped models, the migrated run {len(migrations)}")
    pairs: list[tuple[int | None, dict, dict]] = [
        (index, first["state"], second["state"]) for index, (first, second) in enumerate(zip(originals, migrations))
    ]
    pairs.append((None, original.get("outside", {}), migrated.get("outside", {})))
    for index, first_state, second_state in pairs:
        label = f"model {index}: " if index is not None else ""
        for name in sorted(first_state.keys() - second_state.keys()):
            mismatches.append(f"{label}{name!r} is only in the original")
        for name in sorted(second_state.keys() - first_state.keys()):
            mismatches.append(f"{label}{name!r} is only in the migrated run")
        for name in (name for name in first_state if name in second_state):
            a, b = first_state[name], second_state[name]
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
                if a != b:
                    mismatches.append(f"{label}{name!r} differs ({a!r} against {b!r})")
                continue
            if a.shape != b.shape or a.dtype != b.dtype:
                mismatches.append(f"{label}{name!r} is {a.dtype} {list(a.shape)} in the original, {b.dtype} {list(b.shape)} migrated")
                continue
            apart = difference(a, b)
            if largest is None or apart > largest["difference"]:
                largest = {"difference": apart, "model": index, "name": name}
            if not undefined and a.is_floating_point() and bool(a.isnan().any()) and bool(b.isnan().any()):
                undefined = f"{label}{name!r}"
    if undefined:
        # NaN against NaN is no difference, and no agreement either: both trainings broke down.
        mismatches.append(f"{undefined} is NaN in both runs: their agreement proves nothing")
    return {
        "steps": [original["steps"], migrated["steps"]],
        "models": [len(originals), len(migrations)],
        "largest": largest,
        "mismatches": mismatches,
    }


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        sys.exit("usage: python -m mgpu_runtime.emulation.compare ORIGINAL_STATE MIGRATED_STATE")
    original, migrated = (torch.load(path, map_location="cpu", weights_only=True) for path in argv)
    print(json.dumps(compare(original, migrated)))


if __name__ == "__main__":
    main(sys.argv[1:])
