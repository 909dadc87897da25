"""The labels, annotations and taints slurm-bridge reads and writes (upstream's names, so
users' manifests and nodes keep working)."""

from __future__ import annotations

# Node label: the Slurm node name of this Kubernetes node, when they differ.
SLURM_NODENAME = "slinky.slurm.net/slurm-nodename"
# Node label: register this Kubernetes node in Slurm as an EXTERNAL node.
EXTERNAL_NODE = "scheduler.slinky.slurm.net/external-node"
# Node annotation: comma-separated partitions the external node joins (as its features).
EXTERNAL_NODE_PARTITIONS = "scheduler.slinky.slurm.net/external-node-partitions"
# Node taint key; value = the scheduler name, so two bridges can share a cluster.
MANAGED_NODE_TAINT = "slinky.slurm.net/managed-node"

# Pod label set by the scheduler: the placeholder job's id.
SLURM_JOBID = "scheduler.slinky.slurm.net/slurm-jobid"
# Pod annotation under the same key, carried by the scheduler's Binding: the job id is on
# the pod from the moment it is bound. A pod whose job Slurm allocated inside the request
# is bound first and labelled just after (one write fewer before the bind).
SLURM_JOBID_ANNOTATION = SLURM_JOBID
# Pod annotation set by the scheduler: the Slurm node the placeholder job was allocated.
SLURM_NODE = "slinky.slurm.net/slurm-node"
# Pod (or pod group) annotations describing the placeholder job.
SLURMJOB_PREFIX = "slurmjob.slinky.slurm.net/"

# Every drain the bridge makes has a reason starting with this; any other drain is an
# admin's and is never undone by the bridge.
REASON_PREFIX = "slurm-bridge: "
# Pod finalizer set by the scheduler with the job-id label: the workload controller removes
# it once the pod is terminal and its job is ended, so no pod disappears with its job running.
FINALIZER = "scheduler.slinky.slurm.net/finalizer"
# Pod annotation set by the scheduler when it replaced the pod's placeholder job (its node
# became one the pod must not use before the pod was bound): the replaced job's id, which is
# cancelled once the pod names its new job.
REPLACED_JOB = "scheduler.slinky.slurm.net/replaced-slurm-jobid"
