"""Settings from ``[tool.mgpu-migrate]``, found for each file as ruff and black find theirs.

A file's settings come from the nearest ``pyproject.toml`` above it that has a ``[tool.mgpu-migrate]`` table
(one without the table is passed over), or from ``--config FILE`` for every file. Keys: ``to`` (the target
when ``--to`` is not given), ``sync-bn`` (the default of ``--sync-bn``), ``style`` (of ``--style``), ``exclude`` and ``extend-exclude``
(glob patterns, relative to the settings file's directory, of files and directories never migrated: also
when named on the command line, so a pre-commit hook honours them too), ``select``/``ignore`` (which sites
left for a person are reported, by code or prefix: ``MGP2``, ``MGP26``, ``MGP262``) and
``respect-gitignore`` (default true: a walked directory leaves out what git ignores) and ``max-file-size``
(the default of ``--max-file-size``: bytes, or a size such as ``"5MB"``; 0 for no limit).
"""

from __future__ import annotations

import functools
import os
import re
import sys
from dataclasses import dataclass
from fractions import Fraction

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on older interpreters only
    import tomli as tomllib

from mgpu_migrate import files
from mgpu_migrate.diagnostics import REVIEW_PREFIXES
from mgpu_migrate.engine import TARGETS
from mgpu_migrate.options import RUNTIME_STYLE, STYLES

KEYS = ("to", "sync-bn", "exclude", "extend-exclude", "select", "ignore", "respect-gitignore", "max-file-size", "style")
_CODE_PREFIX = re.compile(r"MGP\d{0,3}")


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Settings:
    root: str | None = None
    """The directory of the pyproject.toml the settings came from; exclude patterns are relative to it."""
    to: str | None = None
    sync_bn: bool = False
    style: str = RUNTIME_STYLE
    exclude: tuple[str, ...] = ()
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    respect_gitignore: bool = True
    max_file_size: int | None = None
    """Bytes; None: the tool's default."""
    source: str | None = None
    """The settings file, for messages."""

    def reports(self, code: str) -> bool:
        """Whether a site for a person with ``code`` is reported (``select``, then ``ignore``, by prefix)."""
        if not code.startswith(REVIEW_PREFIXES):
            return True
        if self.select and not any(code.startswith(prefix) for prefix in self.select):
            return False
        return not any(code.startswith(prefix) for prefix in self.ignore)

    def excluded(self, path: str) -> bool:
        """Whether ``path`` (a file or directory) matches the ``exclude`` patterns, read as a ``.gitignore`` in
        the settings' directory is (``pathspec``'s gitwildmatch: a later ``!pattern`` re-includes), directories
        above it included: a file named inside an excluded directory is excluded too."""
        if not self.exclude or self.root is None:
            return False
        relative = os.path.relpath(os.path.abspath(path), self.root)
        if relative == os.curdir or relative.startswith(os.pardir + os.sep) or relative == os.pardir:
            return False
        parts = relative.split(os.sep)
        spec = _spec(self.exclude)
        # Each directory above as a directory ("legacy/" matches it), then the path itself.
        candidates = ["/".join(parts[: end + 1]) + "/" for end in range(len(parts) - 1)]
        candidates.append("/".join(parts) + ("/" if os.path.isdir(path) else ""))
        return any(spec.match_file(candidate) for candidate in candidates)


@functools.lru_cache(maxsize=None)
def _spec(patterns: tuple[str, ...]):
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(patterns)


_SIZE_UNITS = {
    "": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
SIZE_UNITS_SHOWN = "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB"


def parse_size(value: int | str) -> int:
    """A size in bytes from ``2000000``, ``"2MB"``, ``"512 KiB"``...; ValueError when it is none. Exact for any
    number of digits (a fraction, not a float that overflows)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number, unit = Fraction(value), ""
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(value))
        if match is None or match.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(value)
        number, unit = Fraction(match.group(1)), match.group(2).lower()
    if number < 0:
        raise ValueError(value)
    return int(number * _SIZE_UNITS[unit])


def _size_setting(table: dict, where: str) -> int | None:
    if "max-file-size" not in table:
        return None
    try:
        return parse_size(table["max-file-size"])
    except ValueError:
        raise ConfigError(f'{where}: max-file-size must be a size in bytes or like "5MB" ({SIZE_UNITS_SHOWN}; 0: no limit)') from None


def _codes(value: object, key: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(code, str) for code in value):
        raise ConfigError(f'{where}: {key} must be a list of codes or prefixes, e.g. ["MGP262"] or ["MGP26"]')
    codes = tuple(code.strip().upper() for code in value)
    for code in codes:
        if not _CODE_PREFIX.fullmatch(code):
            raise ConfigError(f"{where}: {key}: {code!r} is not a code or a prefix of one (MGP2, MGP26, MGP262)")
        if code[3:4] in ("0", "1"):
            kind = "a rewrite" if code[3] == "1" else "a file that cannot be processed"
            raise ConfigError(
                f"{where}: {key}: {code} is {kind}, always reported; select and ignore choose among the sites "
                "left for a person (MGP2xx). To leave one site as it is, put `# noqa: CODE` on its line"
            )
    _check_known(codes, key, where)
    return codes


def _check_known(codes: tuple[str, ...], key: str, where: str) -> None:
    """Every code names a review code of the registry, or is a prefix of one (a typo would select nothing). A
    retired code is known too: a setting written when it was reported stays harmless."""
    from mgpu_migrate.codes import CODES, RETIRED, REVIEW  # the registry loads the rules: only when codes are given

    known = [code for code, info in CODES.items() if info.kind == REVIEW]
    retired = [code for code, info in CODES.items() if info.kind == RETIRED]
    for code in codes:
        if not any(candidate.startswith(code) for candidate in known + retired):
            raise ConfigError(
                f"{where}: {key}: {code} is no code of mgpu-migrate's (the sites left for a person: {', '.join(known)}; "
                "--list-codes says what each is)"
            )


def codes_option(value: str | None, option: str) -> tuple[str, ...]:
    """``--select``/``--ignore`` as given on the command line: codes or prefixes, comma-separated."""
    return _codes([code for code in value.split(",") if code.strip()], option, "command line") if value else ()


def check_target(to: object, where: str) -> None:
    if to is not None and to not in TARGETS:
        if not isinstance(to, str):
            raise ConfigError(f'{where}: to must be a string ("balanced" or "ddp")')
        raise ConfigError(f"{where}: unknown target {to!r} (expected balanced or ddp)")


def settings_from_table(table: object, source: str) -> Settings:
    """Settings from one ``[tool.mgpu-migrate]`` table (or a standalone settings file's top level)."""
    where = f"{source}: [tool.mgpu-migrate]" if os.path.basename(source) == "pyproject.toml" else source
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = set(table) - set(KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown keys: {', '.join(sorted(unknown))} (known: {', '.join(KEYS)})")
    to, sync_bn, respect_gitignore = table.get("to"), table.get("sync-bn", False), table.get("respect-gitignore", True)
    check_target(to, where)
    if not isinstance(sync_bn, bool):
        raise ConfigError(f"{where}: sync-bn must be true or false")
    style = table.get("style", RUNTIME_STYLE)
    if style not in STYLES:
        raise ConfigError(f"{where}: style must be one of {', '.join(STYLES)}")
    if not isinstance(respect_gitignore, bool):
        raise ConfigError(f"{where}: respect-gitignore must be true or false")
    patterns = []
    for key in ("exclude", "extend-exclude"):
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(pattern, str) and pattern.strip() for pattern in value):
            raise ConfigError(f'{where}: {key} must be a list of glob patterns, e.g. ["legacy/"]')
        patterns += value
    return Settings(
        root=os.path.dirname(os.path.abspath(source)),
        to=to,
        sync_bn=sync_bn,
        style=style,
        exclude=tuple(patterns),
        select=_codes(table.get("select", []), "select", where),
        ignore=_codes(table.get("ignore", []), "ignore", where),
        respect_gitignore=respect_gitignore,
        max_file_size=_size_setting(table, where),
        source=source,
    )


# A settings file is a few lines; one larger than this is no settings file (and is not read into memory).
_MAX_SETTINGS_BYTES = 1 << 20


def _read_toml(path: str) -> dict:
    """The TOML document at ``path``; any reason it cannot be had (a FIFO or a device, not UTF-8, nested past
    the parser's recursion) is a ``ConfigError`` naming the file."""
    try:
        data, _ = files.read(path, _MAX_SETTINGS_BYTES)
        return tomllib.loads(data.decode("utf-8"))
    except files.TooLarge:
        raise ConfigError(f"{path}: over {_MAX_SETTINGS_BYTES >> 20} MiB, not a settings file") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 (byte {error.start}: {error.reason}), as TOML must be") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read") from None
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: {getattr(error, 'strerror', None) or error}") from error


def read_settings_file(path: str) -> Settings:
    """``--config FILE``: a pyproject.toml (its ``[tool.mgpu-migrate]`` table) or a file of those keys alone."""
    data = _read_toml(path)
    if os.path.basename(path) == "pyproject.toml":
        table = data.get("tool", {}).get("mgpu-migrate")
        if table is None:
            raise ConfigError(f"{path}: no [tool.mgpu-migrate] table")
        return settings_from_table(table, path)
    return settings_from_table(data.get("tool", {}).get("mgpu-migrate", data), path)


class Resolver:
    """Each path's settings: ``--config``'s for all, or the nearest pyproject.toml with the table (cached per
    directory, so a tree of thousands of files reads each pyproject.toml once)."""

    def __init__(self, config_file: str | None = None) -> None:
        self.fixed = read_settings_file(config_file) if config_file else None
        # Each path is asked about several times (excluded? its target, size limit, codes): one stat for it.
        self._by_path: dict[str, Settings] = {}
        # Per resolver (a cache on the method would keep every resolver alive, with what it read).
        self._for_directory = functools.lru_cache(maxsize=None)(self._settings_of_directory)

    def for_path(self, path: str) -> Settings:
        if self.fixed is not None:
            return self.fixed
        found = self._by_path.get(path)
        if found is None:
            directory = os.path.abspath(path)
            if not os.path.isdir(directory):
                directory = os.path.dirname(directory)
            found = self._by_path[path] = self._for_directory(directory)
        return found

    def _settings_of_directory(self, directory: str) -> Settings:
        candidate = os.path.join(directory, "pyproject.toml")
        if os.path.isfile(candidate):
            table = _read_toml(candidate).get("tool", {}).get("mgpu-migrate")
            if table is not None:
                return settings_from_table(table, candidate)
        parent = os.path.dirname(directory)
        return Settings() if parent == directory else self._for_directory(parent)

    def excluded(self, path: str) -> bool:
        """Excluded by the settings where ``path`` is listed (its directory's) or by its own (a directory's)."""
        listed_in = self.for_path(os.path.dirname(os.path.abspath(path)))
        return listed_in.excluded(path) or self.for_path(path).excluded(path)
