"""Slurm access through slurmrestd: a versioned async client, JWT token providers, typed
models of what we use, and the Slurm informer (the seeds' "Slurm event channel")."""
