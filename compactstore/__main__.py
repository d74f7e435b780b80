"""python -m compactstore: the same as the compactstore command."""

from compactstore._cli import main

main()
