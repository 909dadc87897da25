"""What the Cluster controller watches and how events become keys.

- Clusters: their own key (not for a change of their status only: the operator's own write,
  e.g. `lastPingTime`, would otherwise make every ping reconcile and ping again).
- Secrets: every Cluster that references the Secret (token or JWT key), via an index. Only
  referenced Secrets are cached, each by its own by-name informer that lives as long as some
  Cluster names it, so the operator needs no right to list Secrets cluster-wide.
- Slurm: the cluster's informer going stale/fresh, or nodes appearing/disappearing
  (status.nodes), enqueue that Cluster.
"""

from __future__ import annotations

from slinky.kube import events, rest
from slinky.kube.controller import Controller, beyond_status
from slinky.kube.informer import Handler, InformerFactory
from slinky.kube.store import key_of
from slinky.operator.clients import ClusterClients
from slinky.operator.cluster.sync import ClusterSync, Options
from slinky.operator.resources import CLUSTERS
from slinky.slurm.informer import SlurmEvent
from slinky.types import JSON

BY_SECRET = "secret"


def secrets_of_cluster(obj: JSON) -> list[str]:
    """`namespace/name` of the Secrets a Cluster reads."""
    ns = obj["metadata"].get("namespace", "")
    spec = obj.get("spec") or {}
    names = [(spec.get("token") or {}).get("secretRef"), (spec.get("jwtKeyRef") or {}).get("name")]
    return [f"{ns}/{n}" for n in names if n]


def secrets_to_cache(obj: JSON) -> list[str]:
    """The Secrets to keep cached for a Cluster: none once it is being deleted (its finalizer
    needs no credentials, and its namespace's grant may already be gone)."""
    if obj["metadata"].get("deletionTimestamp"):
        return []
    return secrets_of_cluster(obj)


def build(
    kube: rest.Kube,
    factory: InformerFactory,
    clients: ClusterClients,
    recorder: events.EventRecorder,
    *,
    workers: int = 1,
    opts: Options | None = None,
) -> Controller:
    clusters = factory.shared(CLUSTERS, indexers={BY_SECRET: secrets_of_cluster})
    secrets = factory.named(rest.SECRETS)

    def hold(obj: JSON) -> None:
        secrets.hold(key_of(obj), secrets_to_cache(obj))

    # On every replica, leader or not: the caches follow the Clusters' references.
    clusters.add_handler(
        Handler(
            on_add=hold,
            on_update=lambda _old, new: hold(new),
            on_delete=lambda obj: secrets.hold(key_of(obj), ()),
        )
    )
    sync = ClusterSync(
        kube, clusters=clusters, secrets=secrets, clients=clients, recorder=recorder, opts=opts
    )
    ctrl = Controller("cluster", sync, workers=workers)
    ctrl.watch(clusters, predicate=beyond_status)
    ctrl.watch(secrets, lambda s: [key_of(c) for c in clusters.by_index(BY_SECRET, key_of(s))])

    def on_slurm(cluster_key: str, event: SlurmEvent) -> None:
        if event.kind == "informer" or event.type in ("ADDED", "DELETED"):
            ctrl.enqueue(cluster_key)

    clients.subscribe(on_slurm)
    return ctrl
