"""What git ignores, for walked directories: the ``.gitignore`` files of the work tree and ``.git/info/exclude``.

As ruff does, only inside a git work tree; patterns follow git's rules (via ``pathspec``): a deeper
``.gitignore`` overrides a shallower one, and within a file the last matching pattern wins (``!`` re-includes).
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

from mgpu_migrate import files

if TYPE_CHECKING:
    import pathspec

_MAX_IGNORE_FILE_BYTES = 8 << 20


class GitIgnore:
    def __init__(self) -> None:
        # Per instance (a cache on the method would keep every instance alive, with the specs it read).
        self._work_tree = functools.lru_cache(maxsize=None)(self._find_work_tree)
        self._spec = functools.lru_cache(maxsize=None)(self._read_spec)

    def _find_work_tree(self, directory: str) -> str | None:
        if os.path.exists(os.path.join(directory, ".git")):
            return directory
        parent = os.path.dirname(directory)
        return None if parent == directory else self._work_tree(parent)

    def _read_spec(self, path: str) -> pathspec.GitIgnoreSpec | None:
        import pathspec  # only in a git work tree with ignore files

        try:
            data, _ = files.read(path, _MAX_IGNORE_FILE_BYTES)  # a FIFO named .gitignore must not block the run
        except OSError:
            return None
        return pathspec.GitIgnoreSpec.from_lines(data.decode("utf-8", "surrogateescape").splitlines())

    def ignored(self, path: str) -> bool:
        absolute = os.path.abspath(path)
        work_tree = self._work_tree(os.path.dirname(absolute))
        if work_tree is None:
            return False
        suffix = "/" if os.path.isdir(absolute) else ""
        # From the lowest precedence to the highest: info/exclude, then each directory's .gitignore downwards.
        directories = [work_tree]
        relative_parent = os.path.relpath(os.path.dirname(absolute), work_tree)
        if relative_parent != os.curdir:
            for part in relative_parent.split(os.sep):
                directories.append(os.path.join(directories[-1], part))
        sources = [(work_tree, os.path.join(work_tree, ".git", "info", "exclude"))]
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
