"""The hooks from .pre-commit-hooks.yaml, run by the real pre-commit tool as the README configures them: its
snippet as written, with ``rev:`` the release tag it names, made in a copy of this repository."""

import os
import shutil
import subprocess

import pytest
import yaml

from mgpu_migrate import __version__
from tests.cli_helpers import DP_SCRIPT, command
from tests.fixture_cases import ROOT
from tests.readme_blocks import blocks

# The README's .pre-commit-config.yaml; its repo: is a placeholder, its rev: the release tag.
README_CONFIG = yaml.safe_load(next(block for block in blocks("yaml") if block.startswith("repos:")))
(README_REPO,) = README_CONFIG["repos"]

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pre-commit")]

ENV = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
}


def git(*args, cwd):
    result = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, timeout=60)
    return result.stdout.strip()


def snapshot_of_this_repository(destination):
    """A committed copy of the working tree (tracked and untracked, not ignored), so the hook under test
    is the code as it is now, not as last committed."""
    listed = git("ls-files", "--cached", "--others", "--exclude-standard", "-z", cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    git("init", "-q", cwd=destination)
    git("add", "-A", cwd=destination)
    git("commit", "-q", "-m", "snapshot", cwd=destination)
    return git("rev-parse", "HEAD", cwd=destination)


@pytest.fixture(scope="module")
def hook_repository(tmp_path_factory):
    """A snapshot of this repository with the README's release tag on it, and one pre-commit cache for the
    module's tests: pre-commit builds the hooks' environment (a virtualenv with the package installed) once
    for a repository and revision, and both hooks come from this one. The tests run on one xdist worker
    (xdist_group, --dist loadgroup).

    A commit after the tag breaks both hooks, so a hook that runs at all ran from the tag, not the branch."""
    hook_repo = tmp_path_factory.mktemp("hook")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in ENV.items():
            patch.setenv(key, value)
        snapshot_of_this_repository(hook_repo)
        git("tag", "-a", README_REPO["rev"], "-m", f"mgpu-migrate {__version__}", cwd=hook_repo)
        hooks = hook_repo / ".pre-commit-hooks.yaml"
        hooks.write_text(hooks.read_text().replace("entry: mgpu-migrate", "entry: false"))
        git("commit", "-q", "-am", "after the release", cwd=hook_repo)
    return hook_repo, tmp_path_factory.mktemp("pre-commit-cache")


def user_repository(tmp_path, monkeypatch, hook_repository, hook_id, args=None):
    """A user's git repository whose .pre-commit-config.yaml is the README's, with the tagged snapshot of this
    repository as its repo and ``hook_id`` alone (with its README arguments, or ``args``)."""
    hook_repo, cache = hook_repository
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PRE_COMMIT_HOME", str(cache))
    user = tmp_path / "user"
    user.mkdir()
    git("init", "-q", cwd=user)
    (hook,) = [dict(hook) for hook in README_REPO["hooks"] if hook["id"] == hook_id]
    if args is not None:
        hook["args"] = args
    config = {"repos": [{**README_REPO, "repo": str(hook_repo), "hooks": [hook]}]}
    (user / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return user


def run_hooks(user, *options):
    return subprocess.run(
        ["pre-commit", "run", "--all-files", *options], cwd=user, capture_output=True, text=True, timeout=900,
        env={**os.environ},
    )


def test_the_readme_names_this_releases_tag():
    assert README_REPO["rev"] == f"v{__version__}"
    assert [hook["id"] for hook in README_REPO["hooks"]] == ["mgpu-migrate", "mgpu-migrate-check"]


def test_the_tag_installs_that_release(tmp_path, monkeypatch, hook_repository):
    user = user_repository(tmp_path, monkeypatch, hook_repository, "mgpu-migrate", args=["--version"])
    (user / "train.py").write_text(DP_SCRIPT)
    git("add", "-A", cwd=user)
    shown = run_hooks(user, "--verbose")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"mgpu-migrate, version {__version__}" in shown.stdout


def test_hook_rewrites_then_passes(tmp_path, monkeypatch, hook_repository):
    user = user_repository(tmp_path, monkeypatch, hook_repository, "mgpu-migrate")
    (user / "train.py").write_text(DP_SCRIPT)
    (user / "README.txt").write_text("nn.DataParallel is mentioned here but this is not Python\n")
    git("add", "-A", cwd=user)

    first = run_hooks(user)
    assert first.returncode == 1, first.stdout + first.stderr
    assert "files were modified by this hook" in first.stdout
    assert "mgpu_runtime.DistributedDataParallel(model)" in (user / "train.py").read_text()
    assert (user / "README.txt").read_text().startswith("nn.DataParallel")
    second = run_hooks(user)
    assert second.returncode == 0, second.stdout + second.stderr


def test_check_hook_writes_nothing_and_blocks_on_review_sites(tmp_path, monkeypatch, hook_repository):
    user = user_repository(tmp_path, monkeypatch, hook_repository, "mgpu-migrate-check")
    (user / "train.py").write_text(DP_SCRIPT)
    git("add", "-A", cwd=user)

    would_change = run_hooks(user)
    assert would_change.returncode == 1, would_change.stdout + would_change.stderr
    assert (user / "train.py").read_text() == DP_SCRIPT
    assert "1 file would be migrated to ddp" in would_change.stdout

    subprocess.run([*command(), "--to", "ddp", "train.py"], cwd=user, check=True, capture_output=True, timeout=120)
    git("add", "-A", cwd=user)
    assert run_hooks(user).returncode == 0

    # A file --to ddp leaves as it is does not change, yet a person must look at it: the check fails.
    (user / "kept.py").write_text("import torch\nm = torch.nn.DataParallel(m, dim=1)\n")
    git("add", "-A", cwd=user)
    needs_review = run_hooks(user)
    assert needs_review.returncode == 1, needs_review.stdout + needs_review.stderr
    assert "kept.py:2:5: MGP201" in needs_review.stdout
    assert (user / "kept.py").read_text() == "import torch\nm = torch.nn.DataParallel(m, dim=1)\n"
