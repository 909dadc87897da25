"""A controller process with leader election, for the failover test.

It reconciles the ConfigMaps of one namespace by stamping its identity on them, only while it
holds the Lease. Usage: leader_child KUBECONFIG NAMESPACE IDENTITY
"""

from __future__ import annotations

import asyncio
import signal
import sys

from slinky.kube import logs, rest
from slinky.kube.controller import DONE, Controller, Result
from slinky.kube.informer import Informer
from slinky.kube.leader import LeaderElector
from slinky.kube.store import split_key

STAMP = "slinky.test/reconciled-by"


class Stamper:
    def __init__(self, kube: rest.Kube, identity: str) -> None:
        self.kube = kube
        self.identity = identity

    async def reconcile(self, key: str) -> Result:
        ns, name = split_key(key)
        patch = {"metadata": {"annotations": {STAMP: self.identity}}}
        try:
            await self.kube.patch(rest.CONFIGMAPS, name, patch, ns)
        except rest.ApiError as e:
            if not e.not_found:
                raise
        return DONE


async def main(kubeconfig: str, namespace: str, identity: str) -> None:
    logs.setup("info")
    kube = rest.Kube.from_kubeconfig(kubeconfig)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    elector = LeaderElector(
        kube,
        name="leader-test",
        namespace=namespace,
        identity=identity,
        lease_duration=4,
        renew_deadline=3,
        retry_period=1,
    )

    async def lead(stop: asyncio.Event) -> None:
        informer = Informer(kube, rest.CONFIGMAPS, namespace=namespace)
        ctrl = Controller("stamper", Stamper(kube, identity), workers=2)
        ctrl.watch(
            informer,
            predicate=lambda _old, new: (
                (new["metadata"].get("annotations") or {}).get(STAMP) != identity
            ),
        )
        informer.start()
        try:
            await ctrl.run(stop)
        finally:
            await informer.stop()

    await elector.run(lead, stop)
    await kube.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
