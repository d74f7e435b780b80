"""What the request is: one classifier for the store (the pin), the summary ("Original
request") and ``compactstore simulate``'s "original request retained". A request attached as
a file (Codex's desktop app: nothing typed after "## My request for Codex:") is the request
for all three; the simulator once called it noise and measured a later message instead."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from compactstore import CompactStore
from compactstore._cli import cli
from compactstore._importers import read_transcript
from compactstore._simulate import simulate_transcript
from tests.conftest import CORPUS_DEV
from tests.helpers import opened
from tests.test_simulate import transcript, write_jsonl

ENVIRONMENT = "<environment_context>\n  <cwd>/w</cwd>\n  <shell>zsh</shell>\n</environment_context>"
ATTACHED = (
    "\n# Files mentioned by the user:\n\n"
    "## Plan: Cache the parsed index between runs …: /w/.codex/attachments/1/pasted-text.txt\n\n"
    "The attached pasted text file(s) contain the user's request. Read and act on that "
    "content.\n\n## My request for Codex:\n\n"
)


def _attached_request_session() -> list[dict[str, object]]:
    """A Codex-shaped session (openai messages): the environment, the request attached as a
    file with nothing typed, then work with later user messages."""
    messages = transcript("openai")
    assert messages[0]["role"] == "user"
    opening = [{"role": "user", "content": ENVIRONMENT}, {"role": "user", "content": ATTACHED}]
    return [*opening, *messages[1:]]


@pytest.mark.slow
def test_an_attached_request_is_the_request_for_the_store_the_summary_and_simulate(
    tmp_path: Path,
) -> None:
    file = write_jsonl(tmp_path / "attached.jsonl", _attached_request_session())
    with opened(tmp_path / "kept.db") as store:
        _check_attached(file, store)
    out = CliRunner().invoke(cli, ["simulate", str(file), "--window", "8000"])
    assert out.exit_code == 0, out.output
    assert "original request retained 100.0%" in out.output


def _check_attached(file: Path, store: CompactStore) -> None:
    report = simulate_transcript(read_transcript(file), window=8_000, store=store, session_id="a")
    assert report.cuts > 0
    assert report.request_share == 1.0
    assert report.noise_lines == 0 and report.instruction_share == 1.0
    session = store.get_session("a")
    pinned = [item.seq for item in session.context().head if item.state == "pinned"]
    assert pinned == [0, 1], "the environment block (the first user message) and the request"
    for boundary in session.boundaries():
        request = boundary.summary_text.split("## Original request\n", 1)[1]
        assert request.startswith("Plan: Cache the parsed index between runs")


@pytest.mark.slow
@pytest.mark.corpus
def test_a_codex_desktop_rollout_keeps_its_attached_request(tmp_path: Path) -> None:
    path = CORPUS_DEV / "codex" / "mise-codex-0.144.2-2compactions.jsonl"
    if not path.exists():
        pytest.skip(f"no {path.name} in {path.parent}")
    read = read_transcript(path)
    with opened(tmp_path / "mise.db") as store:
        report = simulate_transcript(read, window=64_000, store=store, session_id="mise")
    assert report.cuts > 0 and report.request_share == 1.0
    assert report.noise_lines == 0 and report.instruction_share == 1.0
