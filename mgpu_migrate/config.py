"""Settings from ``[tool.mgpu-migrate]`` in the nearest pyproject.toml.

Keys: ``to`` (the target when ``--to`` is not given), ``sync-bn`` (the default of ``--sync-bn``),
``exclude`` (glob patterns, relative to the pyproject.toml's directory, of files and directories never
migrated: also when named on the command line, so a pre-commit hook honours them too) and ``max-file-size``
(the default of ``--max-file-size``: bytes, or a size such as ``"5MB"``; 0 for no limit).
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
    max_file_size: int | None = None
    """Bytes; None: the tool's default."""

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


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_size(value: int | str) -> int:
    """A size in bytes from ``2000000``, ``"2MB"``, ``"512 KiB"``...; ValueError when it is none."""
    if isinstance(value, int) and not isinstance(value, bool):
        number, unit = value, ""
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(value))
        if match is None or match.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(value)
        number, unit = float(match.group(1)), match.group(2).lower()
    if number < 0:
        raise ValueError(value)
    return int(number * _SIZE_UNITS[unit])


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
    unknown = set(table) - {"to", "sync-bn", "exclude", "max-file-size"}
    if unknown:
        raise ConfigError(
            f"{pyproject}: unknown [tool.mgpu-migrate] keys: {', '.join(sorted(unknown))} "
            "(known: to, sync-bn, exclude, max-file-size)"
        )
    to, sync_bn, exclude = table.get("to"), table.get("sync-bn", False), table.get("exclude", [])
    if to is not None and not isinstance(to, str):
        raise ConfigError(f'{pyproject}: [tool.mgpu-migrate] to must be a string ("balanced" or "ddp")')
    if not isinstance(sync_bn, bool):
        raise ConfigError(f"{pyproject}: [tool.mgpu-migrate] sync-bn must be true or false")
    if not isinstance(exclude, list) or not all(isinstance(pattern, str) and pattern.strip() for pattern in exclude):
        raise ConfigError(f'{pyproject}: [tool.mgpu-migrate] exclude must be a list of glob patterns, e.g. ["legacy/"]')
    max_file_size = None
    if "max-file-size" in table:
        try:
            max_file_size = parse_size(table["max-file-size"])
        except ValueError:
            raise ConfigError(
                f'{pyproject}: [tool.mgpu-migrate] max-file-size must be a size in bytes or like "5MB" (0: no limit)'
            ) from None
    return Settings(
        root=os.path.dirname(pyproject), to=to, sync_bn=sync_bn, exclude=tuple(exclude), max_file_size=max_file_size
    )
