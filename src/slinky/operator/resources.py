"""REST resources of the custom kinds."""

from __future__ import annotations

from slinky.api.v1alpha1 import GROUP, VERSION, cluster, nodeset
from slinky.kube.rest import Resource

CLUSTERS = Resource(GROUP, VERSION, cluster.PLURAL, cluster.KIND)
NODESETS = Resource(GROUP, VERSION, nodeset.PLURAL, nodeset.KIND)

FINALIZER = "slinky.slurm.net/finalizer"
FIELD_MANAGER = "slurm-operator"
