"""The Cluster controller: one Slurm connection per Cluster custom resource."""
