"""python -m compactstore: the same as the compactstore command."""

from compactstore.cli import main

main()
