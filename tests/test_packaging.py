"""The two distributions as PyPI would get them: built from this tree (sdist, then the wheel from the sdist),
checked with ``twine check``, and what each holds; one version for both, named by the changelog and the README.

CI builds them again in isolated environments and installs them by name (``.ci/run``)."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser

import pytest

from mgpu_migrate import __version__
from tests.fixture_cases import ROOT

# One worker builds the distributions once: two building the same tree at once race on its build directories.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("packaging")]


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    for project in (ROOT, ROOT / "runtime"):
        # --no-isolation: the setuptools of this environment, so the build needs no network.
        subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(project)],
            check=True, capture_output=True, timeout=300,
        )
    return out


def _wheel(dist, name: str) -> tuple[list[str], dict]:
    with zipfile.ZipFile(dist / f"{name}-{__version__}-py3-none-any.whl") as wheel:
        names = wheel.namelist()
        metadata = Parser().parsestr(wheel.read(f"{name}-{__version__}.dist-info/METADATA").decode())
        version_file = wheel.read(f"{name}/_version.py").decode() if f"{name}/_version.py" in names else ""
    return names, {"metadata": metadata, "version_file": version_file}


def test_both_distributions_pass_twine_check(dist):
    built = sorted(path.name for path in dist.iterdir())
    assert built == [
        f"mgpu_migrate-{__version__}-py3-none-any.whl",
        f"mgpu_migrate-{__version__}.tar.gz",
        f"mgpu_runtime-{__version__}-py3-none-any.whl",
        f"mgpu_runtime-{__version__}.tar.gz",
    ]
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_tool_holds_the_tool_and_never_needs_torch(dist):
    names, found = _wheel(dist, "mgpu_migrate")
    packages = {name.split("/")[0] for name in names}
    assert packages == {"mgpu_migrate", f"mgpu_migrate-{__version__}.dist-info"}
    assert "mgpu_migrate/schemas/report-v1.json" in names
    metadata = found["metadata"]
    requires = metadata.get_all("Requires-Dist")
    assert not [r for r in requires if r.startswith("torch")]
    assert 'mgpu-runtime; extra == "runtime"' in requires
    assert "mgpu-migrate = mgpu_migrate.cli:main" in zipfile.ZipFile(
        dist / f"mgpu_migrate-{__version__}-py3-none-any.whl").read(f"mgpu_migrate-{__version__}.dist-info/entry_points.txt").decode()


def test_the_runtime_holds_the_runtime_with_torch_alone(dist):
    names, found = _wheel(dist, "mgpu_runtime")
    assert {name.split("/")[0] for name in names} == {"mgpu_runtime", f"mgpu_runtime-{__version__}.dist-info"}
    assert sorted(found["metadata"].get_all("Requires-Dist")) == ["numpy", "torch>=2.13"]
    # The link to the tool's version file arrives as the file itself.
    assert found["version_file"] == (ROOT / "mgpu_migrate" / "_version.py").read_text()
    with tarfile.open(dist / f"mgpu_runtime-{__version__}.tar.gz") as sdist:
        member = sdist.getmember(f"mgpu_runtime-{__version__}/mgpu_runtime/_version.py")
        assert member.isfile()


def test_the_sdists_leave_the_test_suite_in_the_repository(dist):
    for name in ("mgpu_migrate", "mgpu_runtime"):
        with tarfile.open(dist / f"{name}-{__version__}.tar.gz") as sdist:
            assert not [member for member in sdist.getnames() if "/tests/" in member]


def test_one_version_named_by_the_changelog_and_the_readme():
    import mgpu_runtime

    assert mgpu_runtime.__version__ == __version__
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(r"^## (\S+)", changelog, re.M)[1] == __version__  # the newest entry is this version
    readme = (ROOT / "README.md").read_text()
    assert f"rev: v{__version__} " in readme  # the pre-commit snippet names this release's tag
    assert f"pip install mgpu-migrate=={__version__}" in readme
