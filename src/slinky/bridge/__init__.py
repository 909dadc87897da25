"""The slurm-bridge: Slurm schedules Kubernetes pods on nodes it shares with Kubernetes.

Components (`--components`): `scheduler` (scheduler/), `nodes` and `workload` (nodes/,
workload/) and `admission` (admission/); `main.py` runs them.
"""
