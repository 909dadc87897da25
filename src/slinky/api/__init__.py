"""Custom resource definitions of slinky.slurm.net."""
