"""Settings from ``[tool.mgpu-migrate]`` in the nearest pyproject.toml.

Keys: ``to`` (the target when ``--to`` is not given), ``sync-bn`` (the default of ``--sync-bn``) and
``exclude`` (glob patterns, relative to the pyproject.toml's directory, of files and directories never
migrated: also when named on the command line, so a pre-commit hook honours them too).
"""

from __future__ import annotations

import functools
import os
import re
import sys
from dataclasses import dataclass

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on older interpreters only
    import tomli as tomllib


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Settings:
    root: str | None = None
    """The directory of the pyproject.toml the settings came from; exclude patterns are relative to it."""
    to: str | None = None
    sync_bn: bool = False
    exclude: tuple[str, ...] = ()

    def excluded(self, path: str) -> bool:
        """Whether ``path`` (a file or directory) or a directory above it matches an ``exclude`` pattern."""
        if not self.exclude or self.root is None:
            return False
        relative = os.path.relpath(os.path.abspath(path), self.root)
        if relative == os.curdir or relative.startswith(os.pardir + os.sep) or relative == os.pardir:
            return False
        parts = relative.split(os.sep)
        prefixes = ["/".join(parts[: end + 1]) for end in range(len(parts))]
        return any(
            pattern.fullmatch(prefix if anchored else prefix.rsplit("/", 1)[-1])
            for anchored, pattern in _compiled(self.exclude)
            for prefix in prefixes
        )


def _compiled(patterns: tuple[str, ...]) -> list[tuple[bool, re.Pattern[str]]]:
    return [_compile(pattern) for pattern in patterns]


@functools.lru_cache(maxsize=None)
def _compile(pattern: str) -> tuple[bool, re.Pattern[str]]:
    """A gitignore-style glob: without a ``/`` it matches a name at any depth, with one it is anchored at the
    root; ``*`` and ``?`` stay within a name, ``**`` crosses directories, ``[...]`` is a character class."""
    body = pattern.strip().rstrip("/")
    anchored = "/" in body
    body = body.lstrip("/")
    regex, index = "", 0
    while index < len(body):
        if body.startswith("**/", index):
            regex, index = regex + "(?:.*/)?", index + 3
        elif body.startswith("**", index):
            regex, index = regex + ".*", index + 2
        elif body[index] == "*":
            regex, index = regex + "[^/]*", index + 1
        elif body[index] == "?":
            regex, index = regex + "[^/]", index + 1
        elif body[index] == "[" and "]" in body[index + 2 :]:
            end = body.index("]", index + 2)
            inside = body[index + 1 : end]
            negated = inside.startswith("!")
            inside = (inside[1:] if negated else inside).replace("\\", "\\\\").replace("^", "\\^")
            regex += "[" + ("^" if negated else "") + inside + "]"
            index = end + 1
        else:
            regex, index = regex + re.escape(body[index]), index + 1
    return anchored, re.compile(regex)


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


def load_settings(paths: list[str]) -> Settings:
    """The ``[tool.mgpu-migrate]`` settings that govern ``paths`` (found from their common directory)."""
    real = [os.path.abspath(p) for p in paths if p != "-"] or [os.getcwd()]
    common = os.path.commonpath(real)
    pyproject = find_pyproject(common)
    if pyproject is None:
        return Settings()
    try:
        with open(pyproject, "rb") as handle:
            data = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{pyproject}: {error}") from error
    table = data.get("tool", {}).get("mgpu-migrate", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{pyproject}: [tool.mgpu-migrate] must be a table")
    unknown = set(table) - {"to", "sync-bn", "exclude"}
    if unknown:
        raise ConfigError(
            f"{pyproject}: unknown [tool.mgpu-migrate] keys: {', '.join(sorted(unknown))} "
            "(known: to, sync-bn, exclude)"
        )
    to, sync_bn, exclude = table.get("to"), table.get("sync-bn", False), table.get("exclude", [])
    if to is not None and not isinstance(to, str):
        raise ConfigError(f'{pyproject}: [tool.mgpu-migrate] to must be a string ("balanced" or "ddp")')
    if not isinstance(sync_bn, bool):
        raise ConfigError(f"{pyproject}: [tool.mgpu-migrate] sync-bn must be true or false")
    if not isinstance(exclude, list) or not all(isinstance(pattern, str) and pattern.strip() for pattern in exclude):
        raise ConfigError(f'{pyproject}: [tool.mgpu-migrate] exclude must be a list of glob patterns, e.g. ["legacy/"]')
    return Settings(root=os.path.dirname(pyproject), to=to, sync_bn=sync_bn, exclude=tuple(exclude))
