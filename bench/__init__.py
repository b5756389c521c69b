"""Benchmarks: scripts that print figures, never assert on them."""
