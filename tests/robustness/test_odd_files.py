"""Files nobody tidied, through the command line: encodings, line ends, links, things that are not files."""

import os
import pathlib
import shutil
import subprocess

import pytest

from tests.cli_helpers import DP_SCRIPT, command, run_cli

FIXTURES = pathlib.Path(__file__).parents[2] / "fixtures"

REWRITTEN = b"mgpu_runtime.DistributedDataParallel(model)"


def migrate(cwd, *paths, expect=0):
    result = run_cli("--to", "ddp", *paths, cwd=cwd)
    assert result.returncode == expect, result.stderr.decode()
    return result.stderr.decode()


def compiles(data: bytes) -> bool:
    compile(data, "<rewritten>", "exec", dont_inherit=True)
    return True


@pytest.mark.parametrize(
    ("name", "data", "kept"),
    [
        ("bom.py", b"\xef\xbb\xbf" + DP_SCRIPT.encode(), b"\xef\xbb\xbfimport torch.nn as nn\n"),
        (
            "latin.py",
            b"# -*- coding: latin-1 -*-\n# r\xe9seau\n" + DP_SCRIPT.encode(),
            b"# -*- coding: latin-1 -*-\n# r\xe9seau\n",
        ),
        ("crlf.py", DP_SCRIPT.replace("\n", "\r\n").encode(), b"import torch.nn as nn\r\n"),
        (
            "tabs.py",
            b"import torch.nn as nn\nif True:\n\tmodel = nn.Linear(2, 2)\n\tmodel = nn.DataParallel(model)\n",
            b"\tmodel = mgpu_runtime.DistributedDataParallel(model)\n",
        ),
        ("formfeed.py", b"import torch.nn as nn\n\x0c\nmodel = nn.DataParallel(model)\n", b"\n\x0c\n"),
        ("no_newline.py", DP_SCRIPT.rstrip("\n").encode(), b"model = mgpu_runtime.DistributedDataParallel(model)"),
    ],
)
def test_odd_but_valid_files_are_rewritten_keeping_their_form(tmp_path, name, data, kept):
    path = tmp_path / name
    path.write_bytes(data)
    stderr = migrate(tmp_path, name)
    after = path.read_bytes()
    assert REWRITTEN in after and kept in after and compiles(after)
    assert f"{name}:" in stderr and "MGP101" in stderr
    if name == "no_newline.py":
        assert after.endswith(REWRITTEN)
    if name == "crlf.py":
        assert b"\n" not in after.replace(b"\r\n", b"")
    assert run_cli("--to", "ddp", "--check", name, cwd=tmp_path).returncode == 0


@pytest.mark.parametrize(
    ("data", "site"),
    [
        (b"\x0c" + DP_SCRIPT.encode(), b":3:9: MGP101"),
        (b"import torch.nn as nn\n\x0cmodel = nn.DataParallel(model)\n", b":2:10: MGP101"),
        (b"import torch.nn as nn\n  \x0cmodel = nn.DataParallel(model)\n", b":2:12: MGP101"),
        (b"import torch.nn as nn\ndef wrap(model):\n\x0c    return nn.DataParallel(model)\n", b":3:13: MGP101"),
        (b"import torch.nn as nn\ndef wrap(model):\n    x = 1\n  \x0c    return nn.DataParallel(model)\n", b":4:15: MGP101"),
        (b"import torch.nn as nn\nclass A:\n\x0c    def wrap(self, m):\n        return nn.DataParallel(m)\n", b":4:16: MGP101"),
        (b'import torch.nn as nn\ns = """\n\x0c  kept\n"""\n\x0cmodel = nn.DataParallel(model)\n', b":5:10: MGP101"),
    ],
    ids=["first-byte", "before-a-statement", "inside-the-indentation", "first-of-a-block", "later-in-a-block",
         "class-body", "in-a-string-too"],
)
def test_form_feeds_in_the_indentation_are_migrated_and_kept(tmp_path, data, site):
    """CPython resets the column at a form feed in the indentation; LibCST read these as an unexpected indent
    ("Syntax Error @ 1:1"), an indent of '\\x0c    ' (MGP003 internal error) or text lost at the end (MGP002)."""
    (tmp_path / "paged.py").write_bytes(data)
    # A project root: a lone file whose function hands the wrap to importers would be left (MGP321).
    (tmp_path / "setup.cfg").write_text("")
    checked = run_cli("--to", "ddp", "--check", "--show-rewrites", "paged.py", cwd=tmp_path)
    assert checked.returncode == 1 and b"paged.py" + site in checked.stderr, checked.stderr
    migrate(tmp_path, "paged.py")
    after = (tmp_path / "paged.py").read_bytes()
    assert b"DistributedDataParallel" in after and compiles(after)
    assert after.count(b"\x0c") == data.count(b"\x0c")
    assert b"\x0c  kept" in after or b"kept" not in data
    assert run_cli("--to", "ddp", "--check", "--show-rewrites", "paged.py", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("empty.py", b""),
        ("bom_only.py", b"\xef\xbb\xbf"),
        ("ddp_only.py", b"import torch\nmodel = torch.nn.parallel.DistributedDataParallel(model)\n"),
        ("latin.py", b"# -*- coding: latin-1 -*-\ns = '\xe9'\n"),
    ],
)
def test_files_with_nothing_to_migrate_are_left_alone(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    stderr = migrate(tmp_path, name)
    assert path.read_bytes() == data
    assert "0 files migrated to ddp, 1 unchanged, 0 failed" in stderr


def test_a_symlink_is_processed_once_and_stays_a_link(tmp_path):
    (tmp_path / "real.py").write_text(DP_SCRIPT)
    (tmp_path / "alias.py").symlink_to("real.py")
    stderr = migrate(tmp_path, ".", "real.py", "alias.py")
    assert stderr.count("MGP101") == 1
    assert "1 file migrated to ddp" in stderr
    assert (tmp_path / "alias.py").is_symlink()
    assert REWRITTEN in (tmp_path / "real.py").read_bytes()


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda path: os.mkfifo(path), "not a regular file"),
        (lambda path: os.symlink("nowhere.py", path), "No such file or directory"),
        (lambda path: path.write_bytes(b"# -*- coding: no-such-codec -*-\n" + DP_SCRIPT.encode()), "unknown encoding"),
        (lambda path: path.write_bytes(b"s = '\xff\xfe'\n" + DP_SCRIPT.encode()), "invalid or missing encoding"),
    ],
    ids=["fifo", "broken-symlink", "unknown-coding-cookie", "invalid-utf8"],
)
def test_an_unreadable_file_fails_alone_and_stays_as_it_was(tmp_path, make, reason):
    (tmp_path / "good.py").write_text(DP_SCRIPT)
    bad = tmp_path / "bad.py"
    make(bad)
    before = bad.read_bytes() if bad.is_file() else None
    stderr = migrate(tmp_path, ".", expect=2)
    assert "bad.py:1:1: MGP001 cannot read: " in stderr and reason in stderr
    assert "1 file migrated to ddp, 0 unchanged, 1 failed" in stderr
    assert REWRITTEN in (tmp_path / "good.py").read_bytes()
    if before is not None:
        assert bad.read_bytes() == before


def test_noqa_counts_lines_as_python_does(tmp_path):
    # A form feed or a \x1c in a string is not a line break: the noqa is on line 4.
    data = "import torch.nn as nn\n\x0c\ns = 'a\x1cb'\nmodel = nn.DataParallel(model)  # noqa: MGP101\n"
    (tmp_path / "kept.py").write_text(data)
    assert run_cli("--to", "ddp", "--check", "kept.py", cwd=tmp_path).returncode == 0


def test_a_file_the_parser_cannot_reproduce_is_left_alone(tmp_path):
    # LibCST drops the comment after the whitespace-only lines: rewriting would lose it.
    data = (DP_SCRIPT + "\t\n  # keep this\n\t\n\x0c\n").encode()
    (tmp_path / "tail.py").write_bytes(data)
    stderr = migrate(tmp_path, "tail.py", expect=2)
    assert "tail.py:1:1: MGP002 cannot rewrite without losing the comments" in stderr
    assert (tmp_path / "tail.py").read_bytes() == data


def test_a_directory_named_like_a_python_file_is_walked(tmp_path):
    (tmp_path / "x.py").mkdir()
    (tmp_path / "x.py" / "train.py").write_text(DP_SCRIPT)
    stderr = migrate(tmp_path, "x.py")
    assert "x.py/train.py:4:9: MGP101" in stderr
    assert REWRITTEN in (tmp_path / "x.py" / "train.py").read_bytes()


def huge_script(lines: int) -> str:
    body = [DP_SCRIPT]
    for index in range(lines // 4):
        body.append(f"def step_{index}(x, y=2):\n    z = x * {index} + y  # step {index}\n    return z\n\n")
    return "".join(body)


@pytest.mark.parametrize("lines", [5_000, pytest.param(50_000, marks=pytest.mark.slow)])
def test_a_huge_generated_file_with_one_site(tmp_path, lines):
    source = huge_script(lines)
    (tmp_path / "huge.py").write_text(source)
    stderr = migrate(tmp_path, "huge.py")
    after = (tmp_path / "huge.py").read_text()
    assert "huge.py:4:9: MGP101" in stderr
    assert after.count("\n") == source.count("\n") + 1  # the runtime import
    assert after.replace("mgpu_runtime.DistributedDataParallel", "nn.DataParallel").replace(
        "import mgpu_runtime\n", ""
    ) == source


def test_stdin_is_read_and_written_in_its_own_encoding():
    data = b"# -*- coding: latin-1 -*-\n# r\xe9seau\n" + DP_SCRIPT.encode()
    result = run_cli("-", "--to", "ddp", stdin=data)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.startswith(b"# -*- coding: latin-1 -*-\n# r\xe9seau\n") and REWRITTEN in result.stdout
    broken = run_cli("-", "--to", "ddp", stdin=b"# -*- coding: no-such-codec -*-\n" + DP_SCRIPT.encode())
    assert broken.returncode == 2 and b"<stdin>:1:1: MGP001 cannot read: unknown encoding" in broken.stderr


def test_a_file_too_deep_for_the_compiler_fails_alone(tmp_path):
    data = DP_SCRIPT + "total = " + " + ".join(["step"] * 100_000) + "\n"
    (tmp_path / "deep.py").write_text(data)
    (tmp_path / "good.py").write_text(DP_SCRIPT)
    stderr = migrate(tmp_path, ".", expect=2)
    assert "deep.py:1:1: MGP00" in stderr  # unprocessable (CPython cannot compile it either)
    assert (tmp_path / "deep.py").read_text() == data
    assert REWRITTEN in (tmp_path / "good.py").read_bytes()


def test_code_nested_too_deeply_to_parse_is_refused_not_crashed(tmp_path):
    # Deeper than the compiler's recursion limit: an unparseable file (MGP002), never an internal error.
    deep = "import torch.nn as nn\nmodel = nn.DataParallel(model)\nx = " + "-" * 100_000 + "1\n"
    (tmp_path / "deep.py").write_text(deep)
    result = run_cli("--to", "ddp", "deep.py", cwd=tmp_path)
    assert result.returncode == 2
    assert b"deep.py:1:1: MGP002 cannot parse" in result.stderr and b"MGP003" not in result.stderr
    assert (tmp_path / "deep.py").read_text() == deep


def _memory_bounded():
    """A child's address space bounded (4 GiB): reading /dev/zero without a bound ends in a MemoryError there,
    not in the machine's out-of-memory killer."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.RLIM_INFINITY))


@pytest.mark.parametrize(
    "plant",
    [
        lambda path: os.mkfifo(path),
        lambda path: os.symlink("/dev/zero", path),
        lambda path: os.symlink("/dev/urandom", path),
    ],
    ids=["fifo", "link-to-dev-zero", "link-to-dev-urandom"],
)
def test_the_importer_search_reads_no_fifo_and_no_device(tmp_path, plant):
    """A builder hands its wrap to the modules importing it, so the project is searched for them: a FIFO named
    `*.py` there blocked the run forever, a link to /dev/zero read until memory ran out (never imported, never
    named on the command line)."""
    project = tmp_path / "builders"
    shutil.copytree(FIXTURES / "projects" / "builders", project)
    plant(project / "models" / "planted.py")
    result = subprocess.run(
        [*command(), "--to", "ddp", "--check", "models/loading.py"],
        cwd=project, capture_output=True, timeout=60, preexec_fn=_memory_bounded,
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert b"models/loading.py:12:17: MGP320 no training here" in result.stderr
