"""The map from Cluster to its live Slurm connection (client + Slurm informer).

The Cluster controller is the only writer; other controllers (NodeSet) read connections by
Cluster key and subscribe to the Slurm events of every cluster through one callback list,
tagged with the Cluster key, so a NodeSet controller started before a Cluster became ready
still hears that cluster's node events.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Gauge

from slinky.slurm.client import SlurmClient
from slinky.slurm.informer import SlurmEvent, SlurmInformer

log = logging.getLogger(__name__)

CLIENTS = Gauge("slinky_slurm_clients", "Slurm connections held by the operator (one per Cluster)")
CONNECTED = Gauge(
    "slinky_slurm_client_info",
    "1 for each Cluster with a live Slurm client and informer",
    ["namespace", "cluster", "server"],
)

ClusterEventSubscriber = Callable[[str, SlurmEvent], None]


@dataclass
class Connection:
    """One Cluster's live connection."""

    cluster_key: str
    cluster_uid: str
    server: str
    client: SlurmClient
    informer: SlurmInformer
    auth_fingerprint: str
    controller_addr: str | None = None
    _forward: Callable[[SlurmEvent], None] | None = field(default=None, repr=False)


WATCH_JOBS_KEY = "--slurm-watch-jobs"


class ClusterClients:
    def __init__(self, *, watch_jobs: bool = False) -> None:
        self._by_key: dict[str, Connection] = {}
        self._subscribers: list[ClusterEventSubscriber] = []
        # Poll jobs and partitions always (gauges scraped by Prometheus), not only while the
        # external metrics API is asked.
        self.watch_jobs = watch_jobs

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, cluster_key: str) -> Connection | None:
        return self._by_key.get(cluster_key)

    def keys(self) -> list[str]:
        return list(self._by_key)

    def informers(self) -> list[SlurmInformer]:
        return [c.informer for c in self._by_key.values()]

    def subscribe(self, fn: ClusterEventSubscriber) -> None:
        self._subscribers.append(fn)

    async def put(self, conn: Connection) -> None:
        """Install `conn` (closing whatever it replaces) and start its informer."""
        old = self._by_key.get(conn.cluster_key)
        if old is not None:
            await self._close(old)

        def forward(event: SlurmEvent, key: str = conn.cluster_key) -> None:
            for fn in list(self._subscribers):
                fn(key, event)

        conn._forward = forward
        conn.informer.subscribe(forward)
        if self.watch_jobs:
            conn.informer.want_jobs(WATCH_JOBS_KEY, True)
            conn.informer.want_partitions(WATCH_JOBS_KEY, True)
        self._by_key[conn.cluster_key] = conn
        conn.informer.start()
        CONNECTED.labels(*conn.cluster_key.split("/", 1), conn.server).set(1)
        CLIENTS.set(len(self._by_key))
        log.info("cluster %s: Slurm client for %s started", conn.cluster_key, conn.server)

    async def remove(self, cluster_key: str) -> bool:
        conn = self._by_key.pop(cluster_key, None)
        if conn is None:
            return False
        await self._close(conn)
        CLIENTS.set(len(self._by_key))
        log.info("cluster %s: Slurm client for %s stopped", cluster_key, conn.server)
        return True

    async def _close(self, conn: Connection) -> None:
        if conn._forward:
            conn.informer.unsubscribe(conn._forward)
        await conn.informer.stop()
        await conn.client.close()
        with contextlib.suppress(KeyError):
            CONNECTED.remove(*conn.cluster_key.split("/", 1), conn.server)

    async def close_all(self) -> None:
        for key in list(self._by_key):
            await self.remove(key)
