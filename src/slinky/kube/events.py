"""An events.k8s.io/v1 recorder that aggregates repeats into one Event's `series`.

A controller that retries every few seconds would otherwise write hundreds of identical
Events; like client-go, the same (object, type, reason, note) within the aggregation window
bumps `series.count` on the existing Event instead. Recording never raises and never blocks a
reconcile: writes run as background tasks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any

from slinky.kube import rest
from slinky.kube.conditions import now_micro

log = logging.getLogger(__name__)

JSON = dict[str, Any]
NORMAL = "Normal"
WARNING = "Warning"
AGGREGATION_WINDOW_S = 600.0
CACHE_SIZE = 4096


class EventRecorder:
    def __init__(self, kube: rest.Kube, *, controller: str, instance: str) -> None:
        self.kube = kube
        self.controller = controller
        self.instance = instance
        self._seen: OrderedDict[tuple[str, str, str, str], tuple[str, str, int, float]] = (
            OrderedDict()
        )
        self._tasks: set[asyncio.Task[None]] = set()

    def event(
        self, obj: JSON, type_: str, reason: str, note: str, *, action: str = "Reconcile"
    ) -> None:
        """Record in the background."""
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

    def _remember(self, key: tuple[str, str, str, str], value: tuple[str, str, int, float]) -> None:
        self._seen[key] = value
        self._seen.move_to_end(key)
        while len(self._seen) > CACHE_SIZE:
            self._seen.popitem(last=False)
