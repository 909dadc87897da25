"""The scheduler's job <-> pods bookkeeping, owned in one place.

A placeholder job stands for one pod, or for every pod of a group (one job, many pods); a
pod has one job, or two for a moment while a job Slurm placed where the pod may not run is
replaced. Slurm's answers and the pods' labels never change together, so between them the
scheduler remembers, here and only here:

- **made, not labelled yet**: the job Slurm answered with for a pod whose job-id label is
  not written yet, by pod UID and by pod key: a restart finds such jobs again from their
  admin_comment, and a pod that goes away before its label leaves a job only this record
  leads to (it is cancelled);
- **uncertain**: pods whose submission got no answer (slurmrestd down, a timeout): the job
  may exist, so Slurm is asked before another is made;
- **waiting**: which pods wait on which job, both ways (the job watch wakes the pods of a job
  that changed; many pods may wait on one job); and the jobs submitted that no pod waits on
  yet, by partition (pending in Slurm, as far as the pods deciding meanwhile know);
- **replacements**: the job submitted to replace a pod's job, until the pod's label says so;
- **owed cancels**: jobs the scheduler must cancel and could not yet (retried until Slurm
  takes them), and the jobs being marked as ours right now (not to be cancelled as unmarked).

Pure bookkeeping: no I/O, so every rule is unit-tested on its own. What a job *is* (ours, of
this pod) is never decided from here: only the job's admin_comment says that.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

# A job submitted whose pod never waited on it (gone meanwhile) stops counting as pending.
SUBMITTED_FORGET_S = 30.0


class Ledger:
    def __init__(self) -> None:
        self._by_uid: dict[str, int] = {}
        self._by_key: dict[str, tuple[str, int]] = {}
        self._uncertain: dict[str, str] = {}
        self._waiters: dict[int, set[str]] = {}
        self._waits_on: dict[str, int] = {}
        self._submitted: dict[int, tuple[str, float]] = {}  # job -> partition, when
        self._replacements: dict[str, int] = {}
        # Job id -> the pods (key -> UID) it was made for, by its mark: a cancel owed is
        # sent only to a job still marked for those very pods.
        self._owed: dict[int, dict[str, str]] = {}
        self._confirming: set[int] = set()

    # ------------------------------------------------------------ made, not labelled yet

    def made(self, job_id: int, pods: Iterable[tuple[str, str]]) -> None:
        """Slurm answered `job_id` for the pods (key, UID) whose labels are not written."""
        for key, uid in pods:
            self._by_uid[uid] = job_id
            self._by_key[key] = (uid, job_id)

    def job_made_for(self, uid: str) -> int | None:
        """The job made for the pod `uid` that its label does not name yet."""
        return self._by_uid.get(uid)

    def unlabelled(self, key: str) -> tuple[str, int] | None:
        """(UID, job id) of the job made for the pod at `key` before its label."""
        return self._by_key.get(key)

    def labelled(self, key: str, uid: str) -> tuple[str, int] | None:
        """The pod's label names its job (or the job was dealt with): forgotten here.
        Returns what was remembered by key."""
        self._by_uid.pop(uid, None)
        entry = self._by_key.pop(key, None)
        if entry is not None and entry[0] != uid:
            self._by_uid.pop(entry[0], None)
        return entry

    # ------------------------------------------------------------ uncertain

    def unsure(self, key: str, uid: str) -> None:
        """The submission for the pod got no answer: it may have reached Slurm."""
        self._uncertain[key] = uid

    def is_uncertain(self, key: str) -> bool:
        return key in self._uncertain

    def uncertain_uid(self, key: str) -> str | None:
        return self._uncertain.get(key)

    def uncertain(self, keys: Iterable[str] | None = None) -> dict[str, str]:
        """Pod key -> UID of the uncertain pods (of `keys`, or all)."""
        if keys is None:
            return dict(self._uncertain)
        return {k: u for k in keys if (u := self._uncertain.get(k)) is not None}

    def settled(self, asked: dict[str, str]) -> None:
        """Slurm was asked about these (key -> UID): no longer uncertain, unless the pod at
        a key is another one since (a pod of the same name made anew)."""
        for key, uid in asked.items():
            if self._uncertain.get(key) == uid:
                del self._uncertain[key]

    # ------------------------------------------------------------ waiting

    def submitted(self, job_id: int, partition: str) -> None:
        """`job_id` was submitted (it waits in Slurm's queue) and no pod waits on it yet."""
        self._submitted[job_id] = (partition, time.monotonic())

    def submitted_unwaited(self, partition: str) -> bool:
        """Whether a job submitted in `partition` has no pod waiting on it yet."""
        now = time.monotonic()
        for job_id, (part, at) in list(self._submitted.items()):
            if now - at > SUBMITTED_FORGET_S:
                del self._submitted[job_id]  # its pod went before waiting on it
            elif part == partition:
                return True
        return False

    def wait(self, key: str, job_id: int) -> None:
        """The pod at `key` waits on `job_id` (and on no other job)."""
        self._submitted.pop(job_id, None)
        before = self._waits_on.get(key)
        if before is not None and before != job_id:
            self._drop_waiter(key, before)
        self._waits_on[key] = job_id
        self._waiters.setdefault(job_id, set()).add(key)

    def stop_waiting(self, key: str) -> int | None:
        """The pod no longer waits. Returns its job if no other pod waits on that job
        (the caller stops watching it), else None."""
        job_id = self._waits_on.pop(key, None)
        if job_id is None:
            return None
        return job_id if self._drop_waiter(key, job_id) else None

    def _drop_waiter(self, key: str, job_id: int) -> bool:
        keys = self._waiters.get(job_id)
        if keys is None:
            return True
        keys.discard(key)
        if keys:
            return False
        del self._waiters[job_id]
        return True

    def drop_job(self, job_id: int) -> list[str]:
        """No pod waits on `job_id` any more (it was cancelled or abandoned); the keys of
        those that did."""
        keys = sorted(self._waiters.pop(job_id, ()))
        for key in keys:
            if self._waits_on.get(key) == job_id:
                del self._waits_on[key]
        return keys

    def waiters(self, job_id: int) -> list[str]:
        """The keys of the pods waiting on `job_id`, sorted."""
        return sorted(self._waiters.get(job_id, ()))

    def waits_on(self, key: str) -> int | None:
        return self._waits_on.get(key)

    def waiting_pods(self) -> list[str]:
        return list(self._waits_on)

    def waited_jobs(self) -> list[int]:
        return list(self._waiters)

    def waiting_count(self) -> int:
        return len(self._waits_on)

    # ------------------------------------------------------------ replacements

    def replacing(self, uid: str, job_id: int) -> None:
        self._replacements[uid] = job_id

    def replacement(self, uid: str) -> int | None:
        return self._replacements.get(uid)

    def replaced(self, uid: str) -> None:
        self._replacements.pop(uid, None)

    # ------------------------------------------------------------ owed cancels

    def owe_cancel(self, job_id: int, pods: Mapping[str, str]) -> None:
        """`job_id`, made for `pods` (key -> UID, as its mark names them), is owed a cancel."""
        self._owed[job_id] = dict(pods)

    def owed(self) -> list[tuple[int, dict[str, str]]]:
        """Jobs owed a cancel and the pods each was made for, oldest id first."""
        return sorted(self._owed.items())

    def paid(self, job_id: int) -> None:
        self._owed.pop(job_id, None)

    @contextmanager
    def confirming(self, job_id: int) -> Iterator[None]:
        """While the bridge's mark is written on `job_id`, it is not an unmarked job."""
        self._confirming.add(job_id)
        try:
            yield
        finally:
            self._confirming.discard(job_id)

    def is_confirming(self, job_id: int) -> bool:
        return job_id in self._confirming
