"""The slurm-operator: Cluster and NodeSet controllers."""
