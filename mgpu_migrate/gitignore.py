"""What git ignores, for walked directories: the ``.gitignore`` files of the work tree, ``.git/info/exclude`` and
the user's global ignore file (``core.excludesFile``, by default ``~/.config/git/ignore``).

As ruff does, only inside a git work tree; patterns follow git's rules (via ``pathspec``): a deeper
``.gitignore`` overrides a shallower one, and within a file the last matching pattern wins (``!`` re-includes).
"""

from __future__ import annotations

import functools
import os
import subprocess
from typing import TYPE_CHECKING

from mgpu_migrate import files

if TYPE_CHECKING:
    import pathspec

_MAX_IGNORE_FILE_BYTES = 8 << 20


@functools.lru_cache(maxsize=None)
def work_tree(directory: str) -> str | None:
    """The top of the git work tree holding the absolute ``directory`` (None: it is in none)."""
    if os.path.exists(os.path.join(directory, ".git")):
        return directory
    parent = os.path.dirname(directory)
    return None if parent == directory else work_tree(parent)


class GitIgnore:
    def __init__(self) -> None:
        # Per instance (a cache on the method would keep every instance alive, with the specs it read).
        self._spec = functools.lru_cache(maxsize=None)(self._read_spec)
        self._global_excludes = functools.lru_cache(maxsize=None)(self._find_global_excludes)

    def _find_global_excludes(self, top: str) -> str | None:
        """The user's global ignore file, as git finds it: ``core.excludesFile`` (``git config`` reads every
        configuration file, includes and ``GIT_CONFIG_GLOBAL``), else ``$XDG_CONFIG_HOME/git/ignore``."""
        try:
            configured = subprocess.run(
                ["git", "config", "--path", "--get", "core.excludesFile"],
                cwd=top, capture_output=True, text=True, timeout=30,
            )
        except (OSError, subprocess.SubprocessError):
            return None  # no git here: no global configuration to honour
        if configured.returncode == 0 and configured.stdout.strip():
            return os.path.join(top, os.path.expanduser(configured.stdout.strip()))
        config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
        return os.path.join(config_home, "git", "ignore")

    def _read_spec(self, path: str) -> pathspec.GitIgnoreSpec | None:
        import pathspec  # only in a git work tree with ignore files

        try:
            data, _ = files.read(path, _MAX_IGNORE_FILE_BYTES)  # a FIFO named .gitignore must not block the run
        except OSError:
            return None
        return pathspec.GitIgnoreSpec.from_lines(data.decode("utf-8", "surrogateescape").splitlines())

    def ignored(self, path: str) -> bool:
        absolute = os.path.abspath(path)
        top = work_tree(os.path.dirname(absolute))
        if top is None:
            return False
        suffix = "/" if os.path.isdir(absolute) else ""
        # From the lowest precedence to the highest: the global file, info/exclude, then each directory's
        # .gitignore downwards.
        directories = [top]
        relative_parent = os.path.relpath(os.path.dirname(absolute), top)
        if relative_parent != os.curdir:
            for part in relative_parent.split(os.sep):
                directories.append(os.path.join(directories[-1], part))
        global_excludes = self._global_excludes(top)
        sources = [(top, global_excludes)] if global_excludes else []
        sources.append((top, os.path.join(top, ".git", "info", "exclude")))
        sources += [(directory, os.path.join(directory, ".gitignore")) for directory in directories]
        verdict = False
        for base, source in sources:
            spec = self._spec(source)
            if spec is not None:
                relative = os.path.relpath(absolute, base).replace(os.sep, "/") + suffix
                included = spec.check_file(relative).include
                if included is not None:
                    verdict = included
        return verdict
