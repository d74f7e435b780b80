"""The wheel is a working installation: migrations ship inside it, so an installed
package creates a database at the head revision from any directory, and both the console
script and ``python -m compactstore`` run.

Slow: builds a wheel and installs it, with its dependencies from PyPI, into a fresh venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import compactstore
from compactstore.db.migrate import head_revision

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

# Everything but the sources: caches, build output, local databases, VCS data.
_NOT_SOURCES = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
    "*.db",
    "*.db-wal",
    "*.db-shm",
    "*.db-writer",
)

_CHILD = """
import json, sys
import compactstore
from compactstore import CompactStore
from compactstore.db.migrate import current_revision
with CompactStore.open(sys.argv[1]) as store:
    sess = store.session("packaged", format="minicode")
    seq = sess.append({"role": "user", "content": "hello from an installed wheel"})
    print(json.dumps({
        "revision": current_revision(store.engine),
        "seq": seq,
        "context": sess.active_context(),
        "module": compactstore.__file__,
    }))
"""


def _run(*args: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.pop("COMPACTSTORE_DB", None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    result = subprocess.run(
        [str(arg) for arg in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the sources (the build leaves nothing in the repository)."""
    work = tmp_path_factory.mktemp("build")
    sources = work / "src"
    shutil.copytree(REPO, sources, ignore=_NOT_SOURCES)
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", work / "dist", sources, cwd=work)
    (built,) = (work / "dist").glob("compactstore-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed; returns its bin directory."""
    root = tmp_path_factory.mktemp("venv")
    _run(sys.executable, "-m", "venv", root / "env", cwd=root)
    bin_dir = root / "env" / ("Scripts" if os.name == "nt" else "bin")
    _run(bin_dir / "python", "-m", "pip", "install", "--quiet", wheel, cwd=root)
    return bin_dir


def test_the_wheel_ships_the_migrations(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "compactstore/_migrations/env.py" in names
    assert "compactstore/_migrations/script.py.mako" in names
    versions = [
        name
        for name in names
        if name.startswith("compactstore/_migrations/versions/")
        and name.endswith(".py")
        and not name.endswith("__init__.py")
    ]
    assert versions, names
    assert any(head_revision() in name for name in versions)
    assert "compactstore/py.typed" in names
    for name in ("templates/session.html", "templates/index.html", "static/report.js"):
        assert f"compactstore/report/{name}" in names
    # Tests and benchmarks are not part of the package.
    assert not [name for name in names if name.startswith(("tests/", "benchmarks/"))]


def test_an_installed_wheel_creates_a_new_database_at_the_head_revision(
    venv: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    result = _run(venv / "python", "-c", _CHILD, "agent.db", cwd=elsewhere, timeout=120)
    report = json.loads(result.stdout)

    assert report["revision"] == head_revision()
    assert report["seq"] == 0
    assert report["context"] == [{"role": "user", "content": "hello from an installed wheel"}]
    assert (elsewhere / "agent.db").exists()
    # It ran the installed copy, not the repository's sources.
    assert Path(report["module"]).resolve().is_relative_to(venv.parent.resolve())


def test_the_console_script_and_python_m_run(venv: Path, tmp_path: Path) -> None:
    script = venv / "compactstore"
    help_text = _run(script, "--help", cwd=tmp_path, timeout=120).stdout
    assert "Usage" in help_text
    module_help = _run(venv / "python", "-m", "compactstore", "--help", cwd=tmp_path).stdout
    # The same commands; click only names the program differently.
    assert module_help.replace("python -m compactstore", "compactstore") == help_text
    version = _run(script, "--version", cwd=tmp_path, timeout=120).stdout
    assert compactstore.__version__ in version


def test_without_the_report_extra_the_report_command_names_it(venv: Path, tmp_path: Path) -> None:
    """The wheel alone has no Jinja2: everything else works, and the report says what to
    install."""
    assert _run(venv / "compactstore", "demo", "--steps", "5", cwd=tmp_path, timeout=300)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [str(venv / "compactstore"), "report", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr == (
        "Error: writing a report needs Jinja2, the 'report' extra: "
        "pip install 'compactstore[report]'\n"
    )
