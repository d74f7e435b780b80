"""Benchmarks: run each module as a script (python -m benchmarks.<name>)."""
