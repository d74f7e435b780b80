"""The suite passes on a user's clone with nothing beside it: no transcript corpus, no
PostgreSQL server. Corpus tests skip with a reason; PostgreSQL tests are deselected."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_without_corpus_or_server_corpus_tests_skip_and_postgres_tests_are_deselected(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COMPACTSTORE_TEST_PG_URL"}
    env["COMPACTSTORE_CORPUS"] = str(tmp_path / "no-corpus")
    # The corpus sweeps too: each is one skipped parameter saying where it looked, never
    # pytest's "got empty parameter set" (which does not say why).
    names = ("import", "import_agents", "import_codex", "import_provider_compactions", "ledger")
    sweeps = [f"tests/test_{name}.py" for name in names]
    modules = ["tests/test_export.py", "tests/test_simulate.py", *sweeps]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "0",  # one process: the outcome lines below are pytest's own
            "-p",
            "no:cacheprovider",
            "-v",
            "-rs",
            "-m",
            "corpus",
            *modules,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    outcomes = [line for line in run.stdout.splitlines() if line.startswith("tests/")]
    # The SQLite half of a corpus test on both backends is there, and skipped...
    assert any("[sqlite] SKIPPED" in line for line in outcomes), run.stdout
    assert all("SKIPPED" in line for line in outcomes), run.stdout
    # ...its PostgreSQL half is not collected at all.
    assert not any("[postgres]" in line for line in outcomes), run.stdout
    assert f"no transcript corpus at {tmp_path / 'no-corpus' / 'dev'}" in run.stdout
    assert "deselected" in run.stdout.splitlines()[-1]
    assert "empty parameter set" not in run.stdout, run.stdout
    for sweep in sweeps:
        assert any(line.startswith(sweep) and "[no-corpus] SKIPPED" in line for line in outcomes)
