"""The slurm-bridge: Slurm schedules Kubernetes pods on shared nodes (not yet built)."""
