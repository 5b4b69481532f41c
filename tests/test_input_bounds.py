"""A file too large to parse safely (about 0.9 GB of memory per MB of source) is left with a one-line
diagnostic instead of running for minutes; the limit is max-file-size in [tool.mgpu-migrate] or --max-file-size."""

from __future__ import annotations

from tests.cli_helpers import DP_SCRIPT, run_cli


def _generated(path, size):
    path.write_text(DP_SCRIPT + "x = 1\n" * ((size - len(DP_SCRIPT)) // 6))
    return path.read_bytes()


def test_a_generated_file_over_the_default_limit_is_refused_at_once(tmp_path):
    """3 MB with DataParallel in it: it used to be parsed (about 3 GB, minutes); now one line, exit 2."""
    before = _generated(tmp_path / "generated.py", 3_000_000)
    result = run_cli("--to", "ddp", str(tmp_path))  # run_cli's timeout (120 s) bounds it
    assert result.returncode == 2
    assert (tmp_path / "generated.py").read_bytes() == before
    [line] = [line for line in result.stderr.decode().splitlines() if "MGP006" in line]
    assert line == (
        f"{tmp_path / 'generated.py'}:1:1: MGP006 not migrated: 3 MB is over the 2 MB limit "
        "(raise max-file-size in [tool.mgpu-migrate] or --max-file-size)"
    )


def test_a_large_file_without_dataparallel_is_not_refused(tmp_path):
    (tmp_path / "table.py").write_text("x = 1\n" * 500_000)
    result = run_cli("--to", "ddp", str(tmp_path))
    assert result.returncode == 0 and b"MGP006" not in result.stderr


def test_the_limit_comes_from_the_settings_and_the_flag_overrides_it(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.mgpu-migrate]\nmax-file-size = "1kB"\n')
    before = _generated(tmp_path / "train.py", 2000)
    refused = run_cli("--to", "ddp", "train.py", cwd=tmp_path)
    assert refused.returncode == 2 and b"MGP006 not migrated: 2 kB is over the 1 kB limit" in refused.stderr
    assert (tmp_path / "train.py").read_bytes() == before
    assert run_cli("--to", "ddp", "--max-file-size", "0", "train.py", cwd=tmp_path).returncode == 0
    assert b"mgpu_runtime" in (tmp_path / "train.py").read_bytes()


def test_a_bad_size_is_a_usage_error_naming_the_setting(tmp_path):
    (tmp_path / "train.py").write_text(DP_SCRIPT)
    flag = run_cli("--to", "ddp", "--max-file-size", "big", "train.py", cwd=tmp_path)
    assert flag.returncode == 2 and b"--max-file-size" in flag.stderr
    (tmp_path / "pyproject.toml").write_text("[tool.mgpu-migrate]\nmax-file-size = -1\n")
    setting = run_cli("--to", "ddp", "train.py", cwd=tmp_path)
    assert setting.returncode == 2 and b"max-file-size must be a size in bytes" in setting.stderr


def test_a_size_of_any_number_of_digits_is_a_size(tmp_path):
    """99999999999999999999999TB used to be "not a size" (no TB unit, and a float that overflows)."""
    (tmp_path / "train.py").write_text(DP_SCRIPT)
    for size in ("99999999999999999999999TB", "9" * 400 + "MB", "1.5 TiB"):
        result = run_cli("--to", "ddp", "--check", "--show-rewrites", "--max-file-size", size, "train.py", cwd=tmp_path)
        assert result.returncode == 1 and b"MGP101" in result.stderr, (size, result.stderr)
    unknown = run_cli("--to", "ddp", "--max-file-size", "5XB", "train.py", cwd=tmp_path)
    assert unknown.returncode == 2
    assert b"'5XB' is not a size (bytes, or like 5MB; units B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)" in unknown.stderr
