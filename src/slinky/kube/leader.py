"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's rules.

A candidate takes the Lease when it is free or when its holder has not renewed it for
`lease_duration` seconds, measured on *our* clock from when we last saw the record change
(so clock skew between machines does not matter). The leader renews every `retry_period`;
if it cannot renew for `renew_deadline` it has lost leadership and everything it runs is
stopped at once, before another candidate can take over. A clean shutdown releases the
Lease so a successor need not wait for it to expire. Writes use the Lease's
resourceVersion, so two candidates can never both succeed. The Lease is read and written
over connections of its own, so no burst of other requests can delay a renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any

from slinky.kube import metrics, rest
from slinky.kube.conditions import now_micro
from slinky.types import JSON

log = logging.getLogger(__name__)


LEASE_CONNECTIONS = 2


class LeadershipLost(Exception):
    """Raised by LeaderElector.run when renewals failed past the renew deadline."""


class LeaderElector:
    def __init__(
        self,
        kube: rest.Kube,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
    ) -> None:
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0")
        # Connections of its own: requests of the rest of the process, however many wait,
        # never hold up a renewal (each takes one connection at a time).
        self.kube = kube.own_connections(LEASE_CONNECTIONS)
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.is_leader = False
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._gauge = metrics.LEADER.labels(name=name)
        self._gauge.set(0)

    async def run(
        self, lead: Callable[[asyncio.Event], Coroutine[Any, Any, None]], stop: asyncio.Event
    ) -> None:
        """Wait to become leader, then run `lead(stop)` until it returns, `stop` is set
        (then release the Lease), or leadership is lost (then raise LeadershipLost)."""
        try:
            await self._run(lead, stop)
        finally:
            await self.kube.close()  # the Lease's own connections only

    async def _run(
        self, lead: Callable[[asyncio.Event], Coroutine[Any, Any, None]], stop: asyncio.Event
    ) -> None:
        if not await self._acquire(stop):
            return
        leading = asyncio.create_task(lead(stop), name=f"leading {self.name}")
        renewing = asyncio.create_task(self._renew_loop(stop), name=f"renew {self.name}")
        try:
            done, _ = await asyncio.wait([leading, renewing], return_when=asyncio.FIRST_COMPLETED)
            if renewing in done and renewing.result() is False:
                log.error("leader election %s: lost the lease; stopping all controllers", self.name)
                leading.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await leading
                log.error("leader election %s: controllers stopped", self.name)
                raise LeadershipLost(self.name)
            await leading  # stop was set: let it finish, propagate its errors
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewing
            if self.is_leader and stop.is_set():
                await self._release()
            self._set_leader(False)

    # ------------------------------------------------------------ steps

    async def _acquire(self, stop: asyncio.Event) -> bool:
        log.info("leader election %s: %s is trying to acquire the lease", self.name, self.identity)
        while not stop.is_set():
            if await self._try_acquire_or_renew():
                log.info("leader election %s: %s acquired the lease", self.name, self.identity)
                self._set_leader(True)
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.retry_period * random.uniform(1.0, 1.2))
        return False

    async def _renew_loop(self, stop: asyncio.Event) -> bool:
        """Renew until stop (True) or until renewals failed for renew_deadline (False)."""
        last_ok = time.monotonic()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.retry_period)
            if stop.is_set():
                return True
            try:
                remaining = self.renew_deadline - (time.monotonic() - last_ok)
                ok = await asyncio.wait_for(self._try_acquire_or_renew(), max(remaining, 0.01))
            except TimeoutError:
                ok = False
            if ok:
                last_ok = time.monotonic()
            elif time.monotonic() - last_ok >= self.renew_deadline:
                return False
        return True

    async def _try_acquire_or_renew(self) -> bool:
        path = rest.LEASES.path(self.namespace, self.name)
        now = now_micro()
        try:
            lease = await self.kube.request("GET", path)
        except rest.ApiError as e:
            if not e.not_found:
                log.warning("leader election %s: get lease: %s", self.name, e)
                return False
            body: JSON = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, acquire_time=now, transitions=0),
            }
            try:
                await self.kube.create(rest.LEASES, body, self.namespace)
            except (rest.ApiError, rest.TransportError, OSError) as e:
                log.info("leader election %s: create lease: %s", self.name, e)
                return False
            self._observe(body["spec"])
            return True
        except (rest.TransportError, OSError) as e:
            log.warning("leader election %s: get lease: %s", self.name, e)
            return False

        spec = lease.get("spec") or {}
        self._observe(spec)
        holder = spec.get("holderIdentity") or ""
        expired = time.monotonic() > self._observed_at + self._duration_of(spec)
        if holder and holder != self.identity and not expired:
            return False
        ours = holder == self.identity
        new_spec = self._spec(
            now,
            acquire_time=spec.get("acquireTime", now) if ours else now,
            transitions=int(spec.get("leaseTransitions") or 0) + (0 if ours else 1),
        )
        lease["spec"] = new_spec
        try:
            await self.kube.request("PUT", path, body=lease)
        except (rest.ApiError, rest.TransportError, OSError) as e:
            log.info("leader election %s: update lease: %s", self.name, e)
            return False
        self._observe(new_spec)
        return True

    async def _release(self) -> None:
        path = rest.LEASES.path(self.namespace, self.name)
        try:
            lease = await self.kube.request("GET", path)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"].update(
                {"holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": now_micro()}
            )
            await self.kube.request("PUT", path, body=lease)
            log.info("leader election %s: released the lease", self.name)
        except (rest.ApiError, rest.TransportError, OSError) as e:
            log.warning("leader election %s: release failed: %s", self.name, e)

    # ------------------------------------------------------------ helpers

    def _spec(self, now: str, *, acquire_time: str, transitions: int) -> JSON:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "acquireTime": acquire_time,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def _duration_of(self, spec: JSON) -> float:
        return float(spec.get("leaseDurationSeconds") or self.lease_duration)

    def _observe(self, spec: JSON) -> None:
        record = (
            spec.get("holderIdentity"),
            spec.get("renewTime"),
            spec.get("leaseDurationSeconds"),
        )
        if record != self._observed:
            self._observed = record
            self._observed_at = time.monotonic()

    def _set_leader(self, value: bool) -> None:
        self.is_leader = value
        self._gauge.set(1 if value else 0)
