"""The scheduler's steps for a pod that belongs to a group (see `groups`): all or nothing.

1. `wait`    — a group with fewer waiting pods than it needs submits nothing: each pod says
               PodScheduled=False, `WaitingForGroup`, "k of N pods";
2. `submit`  — once N pods wait, one placeholder job for the first N (in rank order) with
               `minimum_nodes = maximum_nodes = N`, one task per node, nodes no member may
               use excluded; each pod is labelled with the job id and gets the finalizer.
               Pods beyond N wait for the next N;
3. `place`   — no pod is bound before Slurm allocated the whole job; then pod i (rank order,
               as listed in the job's admin_comment) is annotated with the i-th Slurm node
               of the job's node list and bound to its Kubernetes node: N distinct nodes,
               all at once. Should a node have no Kubernetes node yet, none is bound. A
               job Slurm no longer knows, or one whose admin_comment does not name the pod
               (its id given to another job after a slurmctld restart), is `lost`: the
               group waits for N pods again, and that job is never bound to nor cancelled;
4. `left`    — a pod of a group that leaves (deleted, failed) before any pod of its job
               was bound (the job pending, or allocated but not placed yet; `place` checks
               the same before binding): the other pods' job-id labels are removed first,
               then the job is cancelled, and the group waits for N pods again (the owner's
               controller usually makes a new pod). Once a pod is bound, the job is the
               workload controller's.

Restart-safe like the single-pod path: the job id is remembered from Slurm's answer for
every member (`Ledger.made`) before the labels are written, and recovered at
start from the job's admin_comment, which lists every member's UID.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from slinky.bridge import groups, placeholder, podcontrol
from slinky.bridge.groups import Group
from slinky.bridge.labels import SLURM_JOBID
from slinky.bridge.scheduler.metrics import BIND_LATENCY, PODS_BOUND, pod_age
from slinky.kube import events, rest
from slinky.kube.controller import DONE, Result
from slinky.slurm import errors
from slinky.slurm.models import expand_hostlist
from slinky.types import JSON

if TYPE_CHECKING:
    from slinky.bridge.scheduler.sync import SchedulerSync

log = logging.getLogger(__name__)

PROBLEM_RECHECK_S = 10.0
# A pod waiting for the rest of its group says so (PodScheduled=False) after this long.
WAIT_REPORT_S = 0.5


class GangScheduler:
    def __init__(self, sync: SchedulerSync, resolver: groups.GroupResolver) -> None:
        self.sync = sync
        self.resolver = resolver
        self.enqueue: Callable[[str], None] = lambda _key: None  # set by the controller
        # Group key -> keys of its pods seen waiting; pod key -> its group.
        self.members: dict[str, set[str]] = {}
        self.group_of: dict[str, Group] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # Pod key -> when it was first seen waiting for its group (see `wait`).
        self.waiting_since: dict[str, float] = {}

    # ------------------------------------------------------------ membership

    async def group(self, pod: JSON) -> Group | None:
        """The pod's group (None: on its own). A group that cannot be used raises
        GroupProblem."""
        return await self.resolver.resolve(pod)

    def join(self, key: str, group: Group) -> None:
        before = self.group_of.get(key)
        if before is not None and before.key != group.key:
            self._leave_set(key, before)
        self.group_of[key] = group
        self.members.setdefault(group.key, set()).add(key)

    def _leave_set(self, key: str, group: Group) -> None:
        self.waiting_since.pop(key, None)
        keys = self.members.get(group.key)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.members[group.key]
                self._forget_lock(group.key)

    def _forget_lock(self, group_key: str) -> None:
        """A group with no member left needs no lock (one held now is dropped on release)."""
        lock = self._locks.get(group_key)
        if lock is not None and not lock.locked() and group_key not in self.members:
            del self._locks[group_key]

    def waiting(self, group: Group) -> list[JSON]:
        """The group's pods that still wait for a node, in rank order."""
        pods = [self.sync.pods.store.get(k) for k in self.members.get(group.key, ())]
        return sorted(
            (p for p in pods if p is not None and self.sync.schedulable(p)), key=groups.rank
        )

    def job_of(self, pod: JSON) -> int | None:
        return podcontrol.job_id_of(pod) or self.sync.ledger.job_made_for(
            str(pod["metadata"]["uid"])
        )

    # ------------------------------------------------------------ reconcile

    async def problem(self, pod: JSON, p: groups.GroupProblem) -> Result:
        if await podcontrol.set_unschedulable(self.sync.kube, pod, p.reason, p.message):
            self.sync.recorder.event(pod, events.WARNING, p.reason, p.message, action="Schedule")
        return Result(requeue_after=PROBLEM_RECHECK_S)  # the group object may appear

    async def reconcile(self, pod: JSON, group: Group) -> Result:
        key = placeholder.pod_key(pod)
        self.join(key, group)
        lock = self._locks.setdefault(group.key, asyncio.Lock())
        async with lock:
            pod = self.sync.pods.store.get(key) or pod
            if not self.sync.schedulable(pod):
                return DONE
            waiting = self.waiting(group)
            ledger = self.sync.ledger
            if any(ledger.is_uncertain(k) for k in map(placeholder.pod_key, waiting)):
                # A submission for the group may have reached Slurm unanswered: look first.
                asked = ledger.uncertain(self.members[group.key])
                await self.sync.find_submitted(set(asked.values()))
                ledger.settled(asked)
            job_id = self.job_of(pod)
            if job_id is not None:
                return await self.place(pod, group, job_id)
            if any(self.job_of(p) is not None for p in waiting):
                return await self.wait(
                    pod,
                    group,
                    f"the pods of a job of {group.describe()} are being placed; "
                    f"this pod waits for {group.size} more",
                )
            if len(waiting) < group.size:
                return await self.wait(
                    pod, group, f"{group.describe()} has {len(waiting)} of {group.size} pods"
                )
            return await self.submit(pod, group, waiting[: group.size])

    async def wait(self, pod: JSON, group: Group, message: str) -> Result:
        """The pod waits for its group: said on the pod once it has waited WAIT_REPORT_S.
        The pods of a group mostly come together, and each status write is made under the
        group's lock: the last pod of a group of 8 waited for 7 of them before its job
        could be asked for."""
        key = placeholder.pod_key(pod)
        now = time.monotonic()
        left = WAIT_REPORT_S - (now - self.waiting_since.setdefault(key, now))
        if left > 0:
            return Result(requeue_after=left)
        await podcontrol.set_unschedulable(self.sync.kube, pod, "WaitingForGroup", message)
        return DONE  # the next pod of the group brings the group back

    async def submit(self, pod: JSON, group: Group, members: list[JSON]) -> Result:
        sync = self.sync
        try:
            desc = groups.job_description(members, group, sync.config)
        except placeholder.PlaceholderProblem as p:
            for m in members:
                await podcontrol.set_unschedulable(sync.kube, m, p.reason, p.message)
            sync.recorder.event(pod, events.WARNING, p.reason, p.message, action="Schedule")
            return DONE
        partition = str(desc["partition"])
        excluded: set[str] = set()
        allowed: set[str] | None = None
        explain = ""
        for m in members:
            where = sync.placement(m, partition)
            excluded.update(where.excluded)
            allowed = set(where.allowed) if allowed is None else allowed & set(where.allowed)
            explain = explain or (where.explain() if where.excluded else "")
        if len(allowed or ()) < group.size:
            message = (
                f"{group.describe()} needs {group.size} nodes at once; "
                f"{len(allowed or ())} managed nodes can take every pod of it"
                + (f" ({explain})" if explain else "")
            )
            for m in members:
                sync.unfit.add(placeholder.pod_key(m))
                await podcontrol.set_unschedulable(sync.kube, m, "NoManagedNodeFits", message)
            sync.recorder.event(
                pod, events.WARNING, "NoManagedNodeFits", message, action="Schedule"
            )
            return DONE  # a node change brings the pods back
        for m in members:
            sync.unfit.discard(placeholder.pod_key(m))
        uids = [str(m["metadata"]["uid"]) for m in members]
        if (wait := sync.backing_off(uids)) is not None:
            return Result(requeue_after=wait)
        if excluded:
            desc["excluded_nodes"] = sorted(excluded)
        try:
            job_id = await sync.create_job(
                desc,
                sorted(allowed or ()),
                [str(m["metadata"]["uid"]) for m in members],
                as_user=groups.allocation_user(members, group, sync.config),
                key=placeholder.pod_key(pod),
            )
        except (errors.SlurmUnavailable, errors.SlurmAuthError) as e:
            for m in members:
                sync.ledger.unsure(placeholder.pod_key(m), str(m["metadata"]["uid"]))
            await sync.cannot_ask(pod, e)
            raise
        except errors.SlurmError as e:
            return await sync.rejected(pod, e, [m for m in members if m is not pod])
        sync.accepted(uids)
        sync.ledger.made(
            job_id, [(placeholder.pod_key(m), str(m["metadata"]["uid"])) for m in members]
        )
        log.info(
            "%s: submitted placeholder job %d for %d pods (%s)",
            group.describe(),
            job_id,
            group.size,
            partition,
        )
        if job_id in sync.watch.jobs:
            # Allocated at once (and read): the members are bound first, the job id in each
            # Binding, and labelled just after (a round of N writes fewer before the binds).
            return await self.place(pod, group, job_id, label_after=True)
        # Every member at once: one round trip, not one per pod. The answers are the pods
        # as labelled, which the informer may not show yet: `place` binds from them rather
        # than labelling each pod again.
        labelled = await asyncio.gather(
            *(podcontrol.mark_submitted(sync.kube, m, job_id) for m in members)
        )
        fresh = {placeholder.pod_key(p): p for p in labelled}
        return await self.place(fresh.get(placeholder.pod_key(pod), pod), group, job_id, fresh)

    async def place(
        self,
        pod: JSON,
        group: Group,
        job_id: int,
        fresh: dict[str, JSON] | None = None,
        *,
        label_after: bool = False,
    ) -> Result:
        """`fresh`: pods this pass labelled, as the apiserver answered. `label_after`: the
        members have no job-id label yet; each gets it once bound, or every one before any
        other outcome of this pass than its job's loss or abandonment."""
        sync = self.sync
        key = placeholder.pod_key(pod)
        if not label_after:
            if podcontrol.job_id_of(pod) is None:
                pod = await podcontrol.mark_submitted(sync.kube, pod, job_id)
            else:
                self.labelled(pod)
        sync.ledger.wait(key, job_id)
        sync.unseen.discard(key)
        sync.watch.track(job_id)
        job = await sync.job(job_id)
        if job is None:
            return await self.lost(pod, group, job_id, "Slurm no longer knows it")
        if not placeholder.job_is_for(job, sync.config, key=key, uid=placeholder.pod_uid(pod)):
            # Before anything is read from the job: its id names another job (given again
            # after a slurmctld restart), whose nodes and pods are not this group's.
            return await self.lost(pod, group, job_id, "it is not the group's placeholder job")
        comment = placeholder.read_comment(str(job.raw.get("admin_comment") or ""))
        assert comment is not None  # job_is_for read it
        ours = self.pods_of(comment, job_id, {key: pod, **(fresh or {})})

        async def labelled_first() -> None:
            if label_after:
                await asyncio.gather(
                    *(
                        podcontrol.mark_submitted(sync.kube, p, job_id)
                        for p in ours.values()
                        if p is not None and sync.schedulable(p) and not podcontrol.is_labelled(p)
                    )
                )

        if job.is_finished:
            await labelled_first()
            return DONE  # the workload controller ends the pods with their job
        allocated = expand_hostlist(job.nodes) if job.is_running else []
        if not allocated:
            await labelled_first()
            state = "/".join(job.state) or "PENDING"
            why = f" ({job.state_reason})" if job.state_reason not in ("", "None") else ""
            message = f"Slurm job {job_id} for {len(comment.pods)} pods is {state}{why}"
            for p in ours.values():
                if p is not None and sync.schedulable(p):
                    await podcontrol.set_unschedulable(sync.kube, p, "SlurmJobPending", message)
            return DONE  # the job watch brings the pod back when the job changes
        if len(allocated) < len(comment.pods):
            log.warning("job %d: %d nodes for %d pods", job_id, len(allocated), len(comment.pods))
            await labelled_first()
            return DONE
        found = {s: sync.kube_node(s) for s in allocated}
        nodes = {s: str(n["metadata"]["name"]) for s, n in found.items() if n is not None}
        missing = [s for s in allocated if s not in nodes]
        if missing:
            message = (
                f"Slurm job {job_id} was allocated Slurm nodes {', '.join(missing)}, which no "
                "Kubernetes node stands for; no pod of the group is bound until every one does"
            )
            sync.recorder.event(pod, events.WARNING, "NodeNotFound", message, action="Bind")
            await labelled_first()
            return Result(requeue_after=5.0)
        gone = [k for k, p in ours.items() if not stays(p)]
        if gone and not started(ours):
            # A pod left (or is leaving) between the allocation and the binding: all or
            # nothing, so none of the others is bound.
            await self.abandon(
                group, job_id, comment.pods, f"pod {gone[0]} of {group.describe()} went away"
            )
            return DONE
        to_bind = [
            (p, allocated[i])
            for i, member_key in enumerate(comment.pods)
            if (p := ours.get(member_key)) is not None and sync.schedulable(p)
        ]  # the others are gone, or bound already
        for p, slurm_node in to_bind:
            node_obj = found[slurm_node]
            if node_obj is not None and (leaving := sync.leaving_blocks(p, node_obj)):
                # All or nothing: no member is bound while one waits for its node.
                await labelled_first()
                return await sync.wait_for_release(pod, job_id, nodes[slurm_node], leaving)
        binds = [self.bind(p, job_id, s, nodes[s]) for p, s in to_bind]
        # All members in flight together (each binding is its own request); a failure is
        # raised once every one has been answered, and the pass retried binds the rest.
        results = await asyncio.gather(*binds, return_exceptions=True)
        # Then the labels of the members bound without one (`label_after`): after every
        # binding, not beside them (they would compete with the last ones).
        await asyncio.gather(
            *(
                podcontrol.label_bound(sync.kube, p, job_id)
                for (p, _), r in zip(to_bind, results, strict=True)
                if r is True and not podcontrol.is_labelled(p)
            )
        )
        failed = [p for (p, _), r in zip(to_bind, results, strict=True) if isinstance(r, Exception)]
        for p in failed:
            # Raised below for the pod of this pass, retried with backoff; a member without
            # its label would have nothing else to bring it back.
            self.enqueue(placeholder.pod_key(p))
        for r in results:
            if isinstance(r, BaseException):
                raise r
        bound = sum(1 for r in results if r is True)
        log.info(
            "%s: bound %d pods (Slurm job %d on %s)", group.describe(), bound, job_id, job.nodes
        )
        for member_key in comment.pods:
            sync.forget(member_key)
            self.waiting_since.pop(member_key, None)
        for other in list(self.members.get(group.key, ())):
            if other not in comment.pods:
                self.enqueue(other)  # pods beyond this job: their turn
        return DONE

    async def lost(self, pod: JSON, group: Group, job_id: int, why: str) -> Result:
        """The group's job is lost (`why`): Slurm no longer knows it (slurmctld restarted
        from state saved before it), or its id now names a job that is not the group's (a
        job made after that restart got it again). The waiting pods that carry it lose its
        label and the group waits for N pods again (a pod bound already, by a pass that
        failed halfway, is the workload controller's). The job is never cancelled: Slurm
        lost it, or it is someone else's."""
        sync = self.sync
        message = f"Slurm job {job_id}: {why}; submitting again for {group.describe()}"
        log.info("pod %s: %s", placeholder.pod_key(pod), message)
        sync.recorder.event(pod, events.WARNING, "SlurmJobLost", message, action="Schedule")
        others = self.waiting(group)
        for p in others:
            if self.job_of(p) != job_id:
                continue
            key, uid = placeholder.pod_key(p), placeholder.pod_uid(p)
            sync.forget(key)
            sync.ledger.labelled(key, uid)
            await unlabel(sync.kube, p)
        for p in others:
            self.enqueue(placeholder.pod_key(p))
        return DONE

    def labelled(self, pod: JSON) -> None:
        """The pod's label names its job: no need to remember it any more."""
        self.sync.ledger.labelled(placeholder.pod_key(pod), str(pod["metadata"]["uid"]))

    def pods_of(
        self, comment: placeholder.Comment, job_id: int, fresh: dict[str, JSON] | None = None
    ) -> dict[str, JSON | None]:
        """The job's pods as cached, by key; None for one that is gone or another pod now.
        A pod of `fresh` (labelled by this pass) stands for a cached copy without the label,
        which is older than it."""
        out: dict[str, JSON | None] = {}
        for k, uid in comment.pods.items():
            p = self.sync.pods.store.get(k)
            newer = (fresh or {}).get(k)
            if (
                p is not None
                and newer is not None
                and podcontrol.job_id_of(p) is None
                and p["metadata"].get("uid") == newer["metadata"].get("uid")
            ):
                p = newer
            same = p is not None and (not uid or str(p["metadata"].get("uid")) == uid)
            labelled = p is not None and podcontrol.job_id_of(p) in (job_id, None)
            out[k] = p if same and labelled else None
        return out

    async def bind(self, pod: JSON, job_id: int, slurm_node: str, node: str) -> bool:
        """Bind one member, the job id in its Binding (`place` labels one not labelled yet
        once every member is bound)."""
        sync = self.sync
        try:
            await podcontrol.bind(sync.kube, pod, node, slurm_node, job_id)
        except rest.ApiError as e:
            if e.not_found or e.conflict:
                return False
            raise
        self.labelled(pod)
        sync.just_bound[placeholder.pod_key(pod)] = placeholder.pod_uid(pod)
        age = pod_age(pod)
        if age is not None:
            BIND_LATENCY.observe(age)
        PODS_BOUND.inc()
        sync.recorder.event(
            pod,
            events.NORMAL,
            "Scheduled",
            f"Slurm job {job_id} allocated Slurm node {slurm_node} to this pod of its group; "
            f"bound to node {node}",
            action="Bind",
        )
        return True

    # ------------------------------------------------------------ a pod leaves

    async def left(self, key: str, pod: JSON | None) -> None:
        """`key` no longer waits: bound (nothing to do), or gone before its job ran. Under
        the group's lock: a `place` binding the others finishes first (then the job has
        started and is left alone) or comes after (and finds the job abandoned)."""
        group = self.group_of.get(key)
        if group is None:
            return
        async with self._locks.setdefault(group.key, asyncio.Lock()):
            await self._left(key, pod, group)
        self._forget_lock(group.key)

    async def _left(self, key: str, pod: JSON | None, group: Group) -> None:
        if self.group_of.get(key) is not group:
            return  # handled meanwhile
        del self.group_of[key]
        self._leave_set(key, group)
        if pod is not None and podcontrol.node_of(pod):
            return
        # The group's job is this step's to cancel, not the single-pod path's.
        entry = self.sync.ledger.labelled(key, "" if pod is None else str(pod["metadata"]["uid"]))
        job_id = None if pod is None else podcontrol.job_id_of(pod)
        if job_id is None and entry is not None:
            job_id = entry[1]
        others = self.waiting(group)
        if job_id is None:
            job_id = next((j for p in others if (j := self.job_of(p)) is not None), None)
        if job_id is None:
            for p in others:
                self.enqueue(placeholder.pod_key(p))
            return
        job = await self.sync.job(job_id)
        if job is None or job.is_finished:
            return  # ended: the workload controller deletes what is left of the group
        uid = placeholder.pod_uid(pod) if pod is not None else (entry[0] if entry else "")
        if not placeholder.job_is_for(job, self.sync.config, key=key, uid=uid):
            return  # not this pod's job (its id given to another job since): not ours
        comment = placeholder.read_comment(str(job.raw.get("admin_comment") or ""))
        assert comment is not None  # job_is_for read it
        if job.is_running and started(self.pods_of(comment, job_id)):
            return  # its pods run: the workload controller's
        # Pending, or allocated with no pod bound yet (Slurm can allocate inside the
        # request, before the pods are even labelled): without this pod the group cannot
        # start whole, and no one else would ever cancel the job.
        await self.abandon(group, job_id, comment.pods, f"pod {key} of {group.describe()} left")

    async def abandon(self, group: Group, job_id: int, pods: Mapping[str, str], why: str) -> None:
        """The group's job cannot run whole: the waiting pods lose its label (the workload
        controller deletes the pods of an ended job, and these are not done: they wait for
        a whole group again), then the job is cancelled and the pods are looked at again."""
        others = self.waiting(group)
        # Owed from now on: once the labels are gone no pod leads back to the job, so a
        # cancel that fails is retried from the scheduler's own list.
        ledger = self.sync.ledger
        ledger.owe_cancel(job_id, pods)
        ledger.drop_job(job_id)  # its pods wait for a whole group again, not on it
        for p in others:
            uid = str(p["metadata"]["uid"])
            if podcontrol.job_id_of(p) == job_id or ledger.job_made_for(uid) == job_id:
                await unlabel(self.sync.kube, p)
                ledger.labelled(placeholder.pod_key(p), uid)
        await self.sync.cancel_pending_cancels()
        log.info(
            "job %d: cancelling it: %s before its pods were bound; the group waits for %d pods "
            "again",
            job_id,
            why,
            group.size,
        )
        for p in others:
            self.enqueue(placeholder.pod_key(p))


def stays(pod: JSON | None) -> bool:
    """Whether a pod of the job (`GangScheduler.pods_of`) can still take its place: there,
    and bound already or still waiting (not being deleted, not ended)."""
    if pod is None:
        return False
    if podcontrol.node_of(pod):
        return True
    return not podcontrol.is_deleting(pod) and not podcontrol.has_ended(pod)


def started(ours: dict[str, JSON | None]) -> bool:
    """Whether a pod of the job (`GangScheduler.pods_of`) is bound already."""
    return any(p is not None and podcontrol.node_of(p) for p in ours.values())


async def unlabel(kube: rest.Kube, pod: JSON) -> None:
    name, ns, uid = podcontrol.name_ns_uid(pod)
    try:
        await kube.patch(
            rest.PODS, name, {"metadata": {"uid": uid, "labels": {SLURM_JOBID: None}}}, ns
        )
    except rest.ApiError as e:
        if not (e.not_found or e.conflict):
            raise
