"""Benchmarks: run each module as a script (python -m benchmarks.<name>)."""

import os
from pathlib import Path

# The real transcripts the corpus benchmarks read (their --corpus DIR overrides it): the dev
# half of the corpus root in $COMPACTSTORE_CORPUS, or of ../shared/corpus beside the repository.
DEFAULT_CORPUS = (
    Path(
        os.environ.get("COMPACTSTORE_CORPUS")
        or Path(__file__).resolve().parents[2] / "shared" / "corpus"
    )
    / "dev"
)
