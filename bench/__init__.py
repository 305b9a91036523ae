"""Benchmarks of the memory service (``python -m bench.memory_bench``); see ``bench/README.md``."""
