"""Progress on a terminal: a bar on stderr while the parser works through many files; nothing when piped."""

from __future__ import annotations

import sys

import click

# Below this many files to parse a run takes about a second: a bar would only flicker.
MIN_FILES_FOR_PROGRESS = 8


class Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.bar = None
        self.shown = 0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total < MIN_FILES_FOR_PROGRESS:
            return
        if self.bar is None:
            self.bar = click.progressbar(length=total, label="mgpu-migrate: migrating", file=sys.stderr)
            self.bar.__enter__()
        self.bar.update(done - self.shown)
        self.shown = done
        if done == total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
