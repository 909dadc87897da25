"""Expectations (kube-controller-manager's ControllerExpectations, UID-tracking variant).

After a reconcile creates 3 pods, the informer may not have seen them yet; a second
reconcile reading the stale cache would create 3 more. So a reconcile records what it
expects to observe and skips create/delete decisions until the informer has caught up (or
the expectation expired, in case an event was lost).

Keys should include the owner's UID (`ns/name/uid`): a deleted and re-created owner of the
same name is a new object and must not inherit the old one's expectations.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

EXPECTATION_TTL_S = 300.0


@dataclass
class _Expected:
    adds: int = 0
    deletes: set[str] = field(default_factory=set)
    at: float = field(default_factory=time.monotonic)


class Expectations:
    """Pending creations (counted) and deletions (by UID) per controller key."""

    def __init__(self, ttl: float = EXPECTATION_TTL_S) -> None:
        self.ttl = ttl
        self._by_key: dict[str, _Expected] = {}

    def expect_creations(self, key: str, count: int) -> None:
        e = self._by_key.setdefault(key, _Expected())
        e.adds += count
        e.at = time.monotonic()

    def expect_deletions(self, key: str, uids: list[str]) -> None:
        e = self._by_key.setdefault(key, _Expected())
        e.deletes.update(uids)
        e.at = time.monotonic()

    def creation_observed(self, key: str) -> None:
        e = self._by_key.get(key)
        if e and e.adds > 0:
            e.adds -= 1

    def creation_failed(self, key: str) -> None:
        """A create that never happened will never be observed."""
        self.creation_observed(key)

    def deletion_observed(self, key: str, uid: str) -> None:
        e = self._by_key.get(key)
        if e:
            e.deletes.discard(uid)

    def satisfied(self, key: str) -> bool:
        """True when nothing is pending for `key` (or what is pending has expired)."""
        e = self._by_key.get(key)
        if e is None:
            return True
        if e.adds <= 0 and not e.deletes:
            return True
        if time.monotonic() - e.at <= self.ttl:
            return False
        # Expiry is the backstop for a lost event; reaching it means a decision waited
        # the whole TTL, which is worth knowing about (soak run 8 could not tell which).
        log.warning(
            "%s: expectations expired after %.0fs: %d creations and the deletions of %s "
            "never observed; deciding again",
            key,
            self.ttl,
            e.adds,
            sorted(e.deletes) or "no pod",
        )
        del self._by_key[key]
        return True

    def forget(self, key: str) -> None:
        self._by_key.pop(key, None)
