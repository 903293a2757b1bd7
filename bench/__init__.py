"""Benchmarks of the run engine (not part of the test run): ``python bench/engine.py``."""
