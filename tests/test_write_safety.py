"""Rewrites never lose work: an edit made while the tool runs is kept (the file is refused, MGP004), owner and
group and hard links survive a rewrite, and a symlink leading out of a walked tree is not written through."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from mgpu_migrate import files
from mgpu_migrate.engine import migrate_source
from tests.cli_helpers import DP_SCRIPT, command, run_cli

try:
    import resource
except ImportError:  # Windows
    resource = None

FLAT_SCRIPT = pathlib.Path(__file__).parents[1] / "fixtures" / "scripts" / "flat_script.py"
EDIT = "# an edit made while mgpu-migrate ran\n"


def test_an_edit_made_during_a_run_is_kept_and_the_file_refused(tmp_path):
    """150 files are read first, then migrated one by one; the last is edited once the first is rewritten."""
    for index in range(150):
        (tmp_path / f"train_{index:03d}.py").write_text(DP_SCRIPT + f"step = {index}\n")
    first, last = tmp_path / "train_000.py", tmp_path / "train_149.py"
    run = subprocess.Popen(
        [*command(), "--to", "ddp", "-j", "1", "."], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while first.read_text() == DP_SCRIPT + "step = 0\n":
        assert time.monotonic() < deadline and run.poll() is None, "the run ended before rewriting the first file"
        time.sleep(0.002)
    with open(last, "a") as handle:  # what `echo >> train_149.py` does
        handle.write(EDIT)
    _, stderr = run.communicate(timeout=120)
    assert last.read_text() == DP_SCRIPT + "step = 149\n" + EDIT
    assert run.returncode == 2
    assert b"train_149.py:1:1: MGP004 changed on disk while mgpu-migrate ran" in stderr
    assert b"mgpu-migrate: 149 files migrated" in stderr
    assert "mgpu_runtime" in (tmp_path / "train_148.py").read_text()


def _read(path):
    data, stamp = files.read(str(path))
    return files.source_file(str(path), data, stamp)


@pytest.mark.parametrize("change", ["append", "same_size", "replaced"])
def test_a_file_changed_since_it_was_read_is_not_replaced(tmp_path, change):
    path = tmp_path / "f.py"
    path.write_text("x = 1\n")
    read_as = _read(path)
    if change == "append":
        path.write_text("x = 1\ny = 2\n")
    elif change == "same_size":  # same size, and the same mtime as far as the clock can tell
        stamp = os.stat(path)
        path.write_text("x = 2\n")
        os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    else:  # an editor that writes a new file and renames it over the old one
        (tmp_path / "new").write_text("x = 1\n")
        os.replace(tmp_path / "new", path)
    before = path.read_bytes()
    with pytest.raises(files.FileChanged):
        files.write_atomically(str(path), "rewritten\n", "utf-8", read_as=read_as)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["f.py"]


def test_two_runs_with_different_targets_do_not_overwrite_each_other(tmp_path):
    """Both read the file; the first to write wins, the second refuses instead of replacing that rewrite."""
    path = tmp_path / "train.py"
    path.write_text(DP_SCRIPT)
    balanced, ddp = _read(path), _read(path)
    files.write_atomically(str(path), "balanced\n", "utf-8", read_as=balanced)
    with pytest.raises(files.FileChanged):
        files.write_atomically(str(path), "ddp\n", "utf-8", read_as=ddp)
    assert path.read_text() == "balanced\n"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root can hand a file to another user")
def test_a_rewrite_as_root_keeps_another_users_owner_and_group(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(DP_SCRIPT)
    os.chown(path, 1234, 5678)
    os.chmod(path, 0o664)
    assert run_cli("--to", "ddp", str(path)).returncode == 0
    status = os.stat(path)
    assert "mgpu_runtime" in path.read_text()
    assert (status.st_uid, status.st_gid, status.st_mode & 0o7777) == (1234, 5678, 0o664)


AS_NOBODY = """
import os, sys
from mgpu_migrate.engine import migrate_source
from mgpu_migrate.report import process_files
with open(sys.argv[1]) as handle:  # everything loaded as root: nobody cannot read this interpreter's files
    migrate_source(handle.read(), "ddp", "warm-up.py")
os.setgroups([]); os.setgid(65534); os.setuid(65534)
[outcome] = process_files([sys.argv[1]], "ddp", write=True, want_diff=False, jobs=1)
print(outcome.status, outcome.diagnostics)
"""


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to become another user")
def test_a_rewrite_by_a_user_who_cannot_give_the_owner_keeps_it_by_writing_in_place():
    """A world-writable file of someone else's: a renamed temporary would belong to the runner, so the file is
    rewritten in place and keeps its owner."""
    with tempfile.TemporaryDirectory() as shared:  # pytest's tmp_path sits in a directory only root may enter
        os.chmod(shared, 0o777)
        _rewrite_as_nobody(pathlib.Path(shared))


def _rewrite_as_nobody(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(DP_SCRIPT)
    os.chown(path, 1234, 1234)
    os.chmod(path, 0o666)
    inode = os.stat(path).st_ino
    result = subprocess.run([sys.executable, "-c", AS_NOBODY, str(path)], capture_output=True, text=True, timeout=120, check=False)
    assert result.stdout.startswith("changed"), result.stdout + result.stderr
    status = os.stat(path)
    assert "mgpu_runtime" in path.read_text()
    assert (status.st_uid, status.st_gid, status.st_ino) == (1234, 1234, inode)
    assert os.listdir(tmp_path) == ["train.py"]


def test_a_hard_linked_file_is_rewritten_through_every_link(tmp_path):
    """As black and ruff do (they write in place): the other names see the rewrite, nothing is detached."""
    path = tmp_path / "train.py"
    path.write_text(DP_SCRIPT)
    os.link(path, tmp_path / "copy_elsewhere.txt")
    assert run_cli("--to", "ddp", str(path)).returncode == 0
    assert "mgpu_runtime" in path.read_text()
    assert (tmp_path / "copy_elsewhere.txt").read_text() == path.read_text()
    assert os.stat(path).st_nlink == 2
    assert sorted(os.listdir(tmp_path)) == ["copy_elsewhere.txt", "train.py"]


def test_an_edit_to_a_hard_linked_file_is_kept_too(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(DP_SCRIPT)
    os.link(path, tmp_path / "other.py")
    read_as = _read(path)
    with open(tmp_path / "other.py", "a") as handle:
        handle.write(EDIT)
    with pytest.raises(files.FileChanged):
        files.write_atomically(str(path), "rewritten\n", "utf-8", read_as=read_as)
    assert path.read_text() == DP_SCRIPT + EDIT


def test_a_symlink_leading_out_of_a_walked_tree_is_skipped_with_a_note(tmp_path):
    tree, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    tree.mkdir()
    elsewhere.mkdir()
    (elsewhere / "victim.py").write_text(DP_SCRIPT)
    (tree / "link.py").symlink_to(elsewhere / "victim.py")
    (tree / "inside.py").write_text(DP_SCRIPT)
    (tree / "alias.py").symlink_to("inside.py")  # inside the tree: followed, as before
    result = run_cli("--to", "ddp", str(tree))
    assert result.returncode == 0, result.stderr
    assert (elsewhere / "victim.py").read_text() == DP_SCRIPT
    assert f"{tree / 'link.py'}:1:1: MGP005 skipped: a symlink to {elsewhere / 'victim.py'}".encode() in result.stderr
    assert "mgpu_runtime" in (tree / "inside.py").read_text()
    assert (tree / "alias.py").is_symlink()
    # Named outright, the link is the user's choice and is followed.
    assert run_cli("--to", "ddp", str(tree / "link.py")).returncode == 0
    assert "mgpu_runtime" in (elsewhere / "victim.py").read_text()


def _without_room_to_grow(limit_bytes):
    """A child's file-size limit (``ulimit -f``, in bytes here), set between fork and exec."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, resource.RLIM_INFINITY))


@pytest.mark.skipif(resource is None, reason="no ulimit here")
@pytest.mark.parametrize("links", [1, 2], ids=["renamed", "in_place"])
def test_a_rewrite_that_would_pass_ulimit_f_leaves_the_file_byte_identical(tmp_path, links):
    """The in-place write (several links) used to leave the first 1024 bytes of the new text: a file that still
    compiled and had lost its save."""
    path = tmp_path / "train.py"
    shutil.copy(FLAT_SCRIPT, path)
    if links == 2:
        os.link(path, tmp_path / "other_name.py")
    original = path.read_bytes()
    assert len(original) < 1024 < len(migrate_source(original.decode(), "ddp", str(path)).output.encode())
    result = subprocess.run(
        [*command(), "--to", "ddp", str(path)], capture_output=True, timeout=120, preexec_fn=_without_room_to_grow(1024)
    )
    assert result.returncode == 2
    assert f"{path}:1:1: MGP001 cannot write: File too large".encode() in result.stderr
    assert path.read_bytes() == original
    assert sorted(os.listdir(tmp_path)) == sorted(["train.py", "other_name.py"][:links])


# In a private mount namespace (root, or a user namespace mapped to root), a 64 KiB tmpfs filled to the last
# page; the script is padded to end on a page boundary, so the rewrite needs a page the disk does not have.
_ON_A_FULL_DISK = """
set -e
mount -t tmpfs -o size=64k tmpfs "$1"
cd "$1"
cp "$2" train.py
[ "$3" = 2 ] && ln train.py other_name.py
cp train.py "$4/original"
dd if=/dev/zero of=filler bs=4096 2>/dev/null || true
status=0
"${@:5}" --to ddp train.py 2> "$4/stderr" || status=$?
cmp -s train.py "$4/original" && echo identical
echo "exit $status"
rm filler
ls -a
"""


def _padded_to_a_page(directory):
    source = FLAT_SCRIPT.read_text()
    padding = 8192 - len(source.encode())
    path = directory / "padded.py"
    path.write_text(source + "#" * (padding - 1) + "\n")
    return path


def _can_mount_privately():
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run(
        [unshare, "--mount", "--map-root-user", "sh", "-c", 'mount -t tmpfs -o size=4k tmpfs "$(mktemp -d)"'],
        capture_output=True, timeout=30,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_privately(), reason="cannot mount a private tmpfs (no unshare, or user namespaces off)")
@pytest.mark.parametrize("links", [1, 2], ids=["renamed", "in_place"])
def test_a_rewrite_on_a_full_disk_leaves_the_file_byte_identical(tmp_path, links):
    mount_point, notes = tmp_path / "disk", tmp_path / "notes"
    mount_point.mkdir()
    notes.mkdir()
    script = _padded_to_a_page(tmp_path)
    result = subprocess.run(
        ["unshare", "--mount", "--map-root-user", "bash", "-c", _ON_A_FULL_DISK, "full-disk",
         str(mount_point), str(script), str(links), str(notes), *command()],
        capture_output=True, text=True, timeout=120,
    )
    listing = result.stdout.split()
    assert result.returncode == 0 and "identical" in listing, result.stdout + result.stderr
    assert "exit 2" in result.stdout
    assert "train.py:1:1: MGP001 cannot write: No space left on device" in (notes / "stderr").read_text()
    assert [name for name in listing[listing.index("exit") + 2 :] if name not in (".", "..")] == sorted(
        ["train.py", "other_name.py"][:links]
    ), "a temporary file was left"
