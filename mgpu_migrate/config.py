"""Settings from ``[tool.mgpu-migrate]`` in the nearest pyproject.toml."""

from __future__ import annotations

import os
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on older interpreters only
    import tomli as tomllib


class ConfigError(Exception):
    pass


def find_pyproject(start: str) -> str | None:
    directory = os.path.abspath(start)
    if not os.path.isdir(directory):
        directory = os.path.dirname(directory)
    while True:
        candidate = os.path.join(directory, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def load_settings(paths: list[str]) -> dict:
    """The ``[tool.mgpu-migrate]`` table that governs ``paths`` (found from their common directory)."""
    real = [os.path.abspath(p) for p in paths if p != "-"] or [os.getcwd()]
    common = os.path.commonpath(real)
    pyproject = find_pyproject(common)
    if pyproject is None:
        return {}
    try:
        with open(pyproject, "rb") as handle:
            data = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{pyproject}: {error}") from error
    settings = data.get("tool", {}).get("mgpu-migrate", {})
    if not isinstance(settings, dict):
        raise ConfigError(f"{pyproject}: [tool.mgpu-migrate] must be a table")
    unknown = set(settings) - {"to"}
    if unknown:
        raise ConfigError(f"{pyproject}: unknown [tool.mgpu-migrate] keys: {', '.join(sorted(unknown))}")
    return settings
