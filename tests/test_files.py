"""Files around the engine: discovery, reading in the file's own encoding, atomic write-back."""

import os
import stat
import threading

import pytest

from mgpu_migrate import files


def test_discover_walks_sorted_and_skips_hidden_and_environments(tmp_path):
    for relative in ("b.py", "a.py", "pkg/z.py", "pkg/sub/y.py", ".git/x.py", "venv/lib.py", "notes.txt"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("x = 1\n")
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    found, missing = files.discover([str(tmp_path)])
    assert [os.path.relpath(path, tmp_path) for path in found] == ["a.py", "b.py", "pkg/z.py", "pkg/sub/y.py"]
    assert missing == []


def test_discover_reports_missing_paths_and_keeps_explicit_files(tmp_path):
    (tmp_path / "script").write_text("x = 1\n")
    found, missing = files.discover([str(tmp_path / "script"), str(tmp_path / "gone.py")])
    assert found == [str(tmp_path / "script")]
    assert missing == [str(tmp_path / "gone.py")]


def test_discover_lists_each_real_file_once(tmp_path):
    (tmp_path / "real.py").write_text("x = 1\n")
    (tmp_path / "alias.py").symlink_to(tmp_path / "real.py")
    found, _ = files.discover([str(tmp_path), str(tmp_path / "real.py")])
    assert found == [str(tmp_path / "alias.py")]


def test_discover_walks_a_directory_named_like_a_python_file(tmp_path):
    (tmp_path / "x.py").mkdir()
    (tmp_path / "x.py" / "inner.py").write_text("x = 1\n")
    found, _ = files.discover([str(tmp_path)])
    assert found == [str(tmp_path / "x.py" / "inner.py")]


def test_read_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    outcome = []
    reader = threading.Thread(
        target=lambda: outcome.append(pytest.raises(OSError, files.read, str(fifo))), daemon=True
    )
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert "not a regular file" in str(outcome[0].value)


def test_read_refuses_a_directory(tmp_path):
    with pytest.raises(files.NotARegularFile):
        files.read(str(tmp_path))


@pytest.mark.parametrize(
    ("data", "encoding", "text"),
    [
        (b"x = 1\r\n", "utf-8", "x = 1\r\n"),
        (b"\xef\xbb\xbfx = 1\n", "utf-8-sig", "x = 1\n"),
        (b"# -*- coding: latin-1 -*-\ns = '\xe9'\n", "iso-8859-1", "# -*- coding: latin-1 -*-\ns = '\xe9'\n"),
    ],
)
def test_source_file_decodes_in_the_declared_encoding(data, encoding, text):
    source = files.source_file("f.py", data)
    assert source.encoding == encoding
    assert source.text == text


def test_source_file_rejects_an_unknown_coding_cookie():
    with pytest.raises(SyntaxError):
        files.source_file("f.py", b"# -*- coding: no-such-codec -*-\nx = 1\n")


def test_write_atomically_keeps_mode_encoding_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "f.py"
    path.write_bytes(b"old\n")
    os.chmod(path, 0o640)
    files.write_atomically(str(path), "s = '\xe9'\n", "iso-8859-1")
    assert path.read_bytes() == b"s = '\xe9'\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert os.listdir(tmp_path) == ["f.py"]


def test_write_atomically_through_a_symlink_keeps_the_link(tmp_path):
    (tmp_path / "real.py").write_text("old\n")
    (tmp_path / "link.py").symlink_to("real.py")
    files.write_atomically(str(tmp_path / "link.py"), "new\n", "utf-8")
    assert (tmp_path / "link.py").is_symlink()
    assert (tmp_path / "real.py").read_text() == "new\n"


def test_write_atomically_leaves_the_file_alone_when_encoding_fails(tmp_path):
    path = tmp_path / "f.py"
    path.write_bytes(b"old\n")
    with pytest.raises(UnicodeEncodeError):
        files.write_atomically(str(path), "s = '\u20ac'\n", "iso-8859-1")
    assert path.read_bytes() == b"old\n"
    assert os.listdir(tmp_path) == ["f.py"]


def test_discover_skips_generated_and_third_party_directories(tmp_path):
    """The README's list: build and dist output, site-packages, node_modules and __pycache__ are not walked."""
    for relative in ("keep/a.py", "build/b.py", "dist/c.py", "site-packages/d.py", "node_modules/e.py", "__pycache__/f.py"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("x = 1\n")
    found, _ = files.discover([str(tmp_path)])
    assert [os.path.relpath(path, tmp_path) for path in found] == ["keep/a.py"]
    named, _ = files.discover([str(tmp_path / "build" / "b.py")])  # a file named outright is processed
    assert named == [str(tmp_path / "build" / "b.py")]
