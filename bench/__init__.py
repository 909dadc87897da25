"""Benchmarks: `make bench` runs each and prints numbers with the ratio to a baseline."""
