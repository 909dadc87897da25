"""Autoscaling from Slurm: gauges and the external metrics API."""
