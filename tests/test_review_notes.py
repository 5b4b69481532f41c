"""Review notes that survive an in-place rewrite: positions in the new file, ``--add-markers``, ``--report``."""

from __future__ import annotations

import re
import shutil

from tests.cli_helpers import run_cli
from tests.fixture_cases import ROOT

# A migrated file with a site left for a person at its wrap (MGP262: the model is trained in code not shown).
TRAINED_ELSEWHERE = (
    "import torch.nn as nn\n"
    "\n"
    "model = nn.DataParallel(\n"
    "    nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))\n"
    ")\n"
    "trainer.fit(model)\n"
)


def _diagnostics(stderr: bytes) -> list[tuple[str, int, int, str]]:
    return [
        (path, int(line), int(col), code)
        for path, line, col, code in re.findall(r"^(.+?):(\d+):(\d+): (MGP\d{3}) ", stderr.decode(), re.M)
    ]


def test_positions_after_an_in_place_rewrite_are_in_the_new_file(tmp_path):
    shutil.copy(ROOT / "fixtures" / "scripts" / "flat_script.py", tmp_path / "train.py")
    shown = run_cli("train.py", "--to", "ddp", "--check", cwd=tmp_path)
    before = {code: line for _, line, _, code in _diagnostics(shown.stderr)}
    written = run_cli("train.py", "--to", "ddp", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    after = {code: line for _, line, _, code in _diagnostics(written.stderr)}
    lines = (tmp_path / "train.py").read_text().splitlines()
    # setup() and the import are added above the sites: each site moved down, to its rewritten line.
    assert after["MGP101"] > before["MGP101"]
    assert "mgpu_runtime.DistributedDataParallel(model)" in lines[after["MGP101"] - 1]
    for code in ("MGP101", "MGP122", "MGP123"):
        assert "mgpu_runtime" in lines[after[code] - 1], (code, lines[after[code] - 1])
    # An insertion is reported at the statement it was inserted above, before and after.
    source_lines = (ROOT / "fixtures" / "scripts" / "flat_script.py").read_text().splitlines()
    assert lines[after["MGP120"] - 1] == source_lines[before["MGP120"] - 1]


def test_markers_report_a_site_until_removed_and_are_never_duplicated(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(TRAINED_ELSEWHERE)
    plain = tmp_path / "plain_run.py"
    plain.write_text(TRAINED_ELSEWHERE)
    # Without markers, the second run no longer sees the site (the wrap is gone).
    assert run_cli("plain_run.py", "--to", "ddp", cwd=tmp_path).returncode == 0
    assert b"MGP262" not in run_cli("plain_run.py", "--to", "ddp", "--check", cwd=tmp_path).stderr

    first = run_cli("train.py", "--to", "ddp", "--add-markers", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    text = path.read_text()
    compile(text, "train.py", "exec")
    lines = text.splitlines()
    (marker_line,) = [number for number, line in enumerate(lines, start=1) if "# mgpu-migrate: review MGP262" in line]
    # Above the whole statement (not inside its brackets), and the position printed is the statement's.
    assert lines[marker_line].startswith("model = mgpu_runtime.DistributedDataParallel(")
    assert ("train.py", marker_line + 1, 9, "MGP262") in _diagnostics(first.stderr)

    again = run_cli("train.py", "--to", "ddp", "--check", cwd=tmp_path)
    assert again.returncode == 0
    assert _diagnostics(again.stderr) == [("train.py", marker_line + 1, 1, "MGP262")]
    assert b"remove the marker comment once done" in again.stderr
    assert run_cli("train.py", "--to", "ddp", "--check", "--fail-on", "review", cwd=tmp_path).returncode == 1

    assert run_cli("train.py", "--to", "ddp", "--add-markers", cwd=tmp_path).returncode == 0
    assert path.read_text() == text  # no second marker

    path.write_text("".join(line + "\n" for line in lines if "mgpu-migrate: review" not in line))
    done = run_cli("train.py", "--to", "ddp", "--check", "--fail-on", "review", cwd=tmp_path)
    assert done.returncode == 0 and _diagnostics(done.stderr) == []


def test_markers_in_a_file_left_as_it_is_dedupe_with_the_tools_own_report(tmp_path):
    path = tmp_path / "kept.py"
    path.write_text("import torch\n\ndef build(m):\n    return torch.nn.DataParallel(\n        m, dim=1)\n")
    assert run_cli("kept.py", "--to", "ddp", "--add-markers", cwd=tmp_path).returncode == 0
    text = path.read_text()
    assert "    # mgpu-migrate: review MGP201 -- " in text.splitlines()[3]
    again = run_cli("kept.py", "--to", "ddp", "--check", cwd=tmp_path)
    assert [code for *_, code in _diagnostics(again.stderr)] == ["MGP201"]
    assert run_cli("--add-markers", "--check", "--to", "ddp", "kept.py", cwd=tmp_path).returncode == 2


def test_report_lists_changes_sites_and_how_to_launch(tmp_path):
    shutil.copy(ROOT / "fixtures" / "scripts" / "flat_script.py", tmp_path / "train.py")
    (tmp_path / "bn.py").write_text(TRAINED_ELSEWHERE)
    (tmp_path / "broken.py").write_text("import torch.nn as nn\nnn.DataParallel(\n")
    result = run_cli(".", "--to", "ddp", "--report", "review.md", cwd=tmp_path)
    assert result.returncode == 2  # broken.py
    report = (tmp_path / "review.md").read_text()
    assert report.startswith("# mgpu-migrate: migration to ddp\n\n2 files migrated, 1 failed; 1 site left for a person.")
    assert "### `train.py`" in report and "### `bn.py`" in report
    new_lines = (tmp_path / "train.py").read_text().splitlines()
    (change,) = [line for line in report.splitlines() if "`model = nn.DataParallel(model)  # use every GPU`" in line]
    number = int(re.match(r"- line (\d+): ", change)[1])
    assert change.endswith("→ `model = mgpu_runtime.DistributedDataParallel(model)  # use every GPU`")
    assert new_lines[number - 1] == "model = mgpu_runtime.DistributedDataParallel(model)  # use every GPU"
    assert "- line 7:\n\n    ```diff\n    +import mgpu_runtime\n    +\n    +mgpu_runtime.setup()\n    ```\n" in report
    (site,) = [line for line in report.splitlines() if "MGP262" in line]
    where = re.match(r"- `bn\.py:(\d+):\d+` MGP262: ", site)
    assert where and "DistributedDataParallel" in (tmp_path / "bn.py").read_text().splitlines()[int(where[1]) - 1]
    assert "- `broken.py:" in report and "MGP002" in report
    assert "torchrun --standalone --nproc_per_node=gpu SCRIPT.py" in report
    # A dry run reports the same changes at the lines of the files as they are.
    shutil.copy(ROOT / "fixtures" / "scripts" / "flat_script.py", tmp_path / "fresh.py")
    run_cli("fresh.py", "--to", "ddp", "--check", "--report", "dry.md", cwd=tmp_path)
    dry = (tmp_path / "dry.md").read_text()
    assert "1 file would be migrated" in dry and "## Files that would change" in dry
    wrap_line = next(
        number
        for number, line in enumerate((tmp_path / "fresh.py").read_text().splitlines(), start=1)
        if line == "model = nn.DataParallel(model)  # use every GPU"
    )
    assert f"- line {wrap_line}: `model = nn.DataParallel(model)  # use every GPU`" in dry


def test_a_marker_never_moves_a_shebang_or_coding_cookie(tmp_path):
    from mgpu_migrate.diagnostics import Diagnostic
    from mgpu_migrate.output.markers import add_markers, marked

    text = "#!/usr/bin/env python\n# -*- coding: latin-1 -*-\n\nimport torch\nm = torch.nn.DataParallel(m, dim=1)\n"
    site = Diagnostic("a.py", 1, 1, "MGP232", "left as it is")
    new_text, (moved,), added = add_markers("a.py", text, [site])
    lines = new_text.splitlines()
    assert added == 1 and lines[:3] == text.splitlines()[:3]
    assert lines[3] == "# mgpu-migrate: review MGP232 -- left as it is" and lines[4] == "import torch"
    assert [d.line for d in marked("a.py", new_text)] == [5]
