"""Helpers for tests that run against the real test bed: waiting with deadlines, a raw
slurmrestd client, and per-test namespaces."""
