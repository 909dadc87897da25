"""An events.k8s.io/v1 recorder that aggregates repeats into one Event's `series`.

A controller that retries every few seconds would otherwise write hundreds of identical
Events; like client-go, the same (object, type, reason, note) within the aggregation window
bumps `series.count` on the existing Event instead. And like client-go's spam filter, each
object gets at most a burst of SPAM_BURST Events, then one per SPAM_REFILL_S: a NodeSet
scaling to 5,000 pods writes 25 "created pod" Events, not 5,000 (the apiserver's write
capacity goes to the pods). Recording never raises and never blocks a reconcile: writes run
as background tasks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict

from slinky.kube import rest
from slinky.kube.conditions import now_micro
from slinky.types import JSON

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"
AGGREGATION_WINDOW_S = 600.0
CACHE_SIZE = 4096
SPAM_BURST = 25
SPAM_REFILL_S = 300.0


class EventRecorder:
    def __init__(self, kube: rest.Kube, *, controller: str, instance: str) -> None:
        self.kube = kube
        self.controller = controller
        self.instance = instance
        self._seen: OrderedDict[tuple[str, str, str, str], tuple[str, str, int, float]] = (
            OrderedDict()
        )
        self._tasks: set[asyncio.Task[None]] = set()
        # Per object: (tokens left, when last counted), client-go's token bucket.
        self._budget: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def event(
        self, obj: JSON, type_: str, reason: str, note: str, *, action: str = "Reconcile"
    ) -> None:
        """Record in the background (unless this object's Event budget is spent)."""
        if not self._allowed(obj):
            log.debug("event %s %s on %s dropped: too many", type_, reason, obj["metadata"]["name"])
            return
        task = asyncio.create_task(self.emit(obj, type_, reason, note, action=action))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def flush(self) -> None:
        """Wait for pending writes (tests, shutdown)."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def emit(
        self, obj: JSON, type_: str, reason: str, note: str, *, action: str = "Reconcile"
    ) -> None:
        meta = obj["metadata"]
        note = note[:1024]
        key = (str(meta.get("uid", meta["name"])), type_, reason, note)
        namespace = meta.get("namespace") or "default"
        now = time.monotonic()
        try:
            seen = self._seen.get(key)
            if seen and now - seen[3] < AGGREGATION_WINDOW_S:
                name, ns, count, _ = seen
                count += 1
                self._remember(key, (name, ns, count, now))
                await self.kube.patch(
                    rest.EVENTS,
                    name,
                    {"series": {"count": count, "lastObservedTime": now_micro()}},
                    ns,
                )
                return
            name = f"{meta['name']}.{time.time_ns():x}"
            body = {
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "eventTime": now_micro(),
                "reportingController": self.controller,
                "reportingInstance": self.instance,
                "action": action,
                "reason": reason,
                "note": note,
                "type": type_,
                "regarding": {
                    "apiVersion": obj.get("apiVersion"),
                    "kind": obj.get("kind"),
                    "name": meta["name"],
                    "namespace": meta.get("namespace"),
                    "uid": meta.get("uid"),
                    "resourceVersion": meta.get("resourceVersion"),
                },
            }
            await self.kube.create(rest.EVENTS, body, namespace)
            self._remember(key, (name, namespace, 1, now))
        except Exception as e:  # events are best effort
            self._seen.pop(key, None)
            log.debug("event %s %s on %s not recorded: %s", type_, reason, meta.get("name"), e)

    def _allowed(self, obj: JSON) -> bool:
        meta = obj["metadata"]
        key = str(meta.get("uid") or meta["name"])
        now = time.monotonic()
        tokens, at = self._budget.get(key, (float(SPAM_BURST), now))
        tokens = min(float(SPAM_BURST), tokens + (now - at) / SPAM_REFILL_S)
        allowed = tokens >= 1.0
        self._budget[key] = (tokens - 1.0 if allowed else tokens, now)
        self._budget.move_to_end(key)
        while len(self._budget) > CACHE_SIZE:
            self._budget.popitem(last=False)
        return allowed

    def _remember(self, key: tuple[str, str, str, str], value: tuple[str, str, int, float]) -> None:
        self._seen[key] = value
        self._seen.move_to_end(key)
        while len(self._seen) > CACHE_SIZE:
            self._seen.popitem(last=False)
