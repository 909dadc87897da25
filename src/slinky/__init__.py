"""Slinky in Python: Slurm on Kubernetes."""

__version__ = "0.1.0"
