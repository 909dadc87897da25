"""`kubectl slinky`: one command for the picture between Kubernetes and Slurm.

`status` joins NodeSets, their pods, the Kubernetes nodes they run on, the Slurm nodes they
are, and the jobs running there; `plan` says what a scale, a rollout or a NodeSet deletion
would drain, in which order and until when, with the operator's own rules; `why` says why a
pod is not going away, why a bridge pod is Pending, or why a NodeSet does not scale.
Read-only: nothing here writes to Kubernetes or Slurm.
"""
