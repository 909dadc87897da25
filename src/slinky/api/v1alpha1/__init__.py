"""slinky.slurm.net/v1alpha1: Cluster and NodeSet (field names as upstream Slinky's)."""

GROUP = "slinky.slurm.net"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
