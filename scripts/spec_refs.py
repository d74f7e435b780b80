"""List the places that cite "SPEC", the contract file the repository does not ship.

    python scripts/spec_refs.py            # every reference, file:line: text
    python scripts/spec_refs.py --count    # references and files, per top-level folder

The documentation (README.md, CONTRIBUTING.md, docs/) has none, which tests/test_docs.py
checks; this lists what remains in the code, to be said in words instead.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("compactstore", "tests", "migrations", "benchmarks", "examples", "scripts")


def references() -> list[tuple[Path, int, str]]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.resolve() == Path(__file__).resolve():
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if "SPEC" in line:
                    found.append((path.relative_to(ROOT), number, line.strip()))
    return found


def main(argv: list[str]) -> int:
    found = references()
    if "--count" in argv:
        refs = Counter(path.parts[0] for path, _, _ in found)
        files = Counter(path.parts[0] for path in {path for path, _, _ in found})
        for folder in FOLDERS:
            print(f"{folder}: {refs[folder]} references in {files[folder]} files")
        print(f"total: {len(found)} references in {len({p for p, _, _ in found})} files")
    else:
        for path, number, line in found:
            print(f"{path}:{number}: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
