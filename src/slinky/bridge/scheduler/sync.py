"""One scheduling pass over a pod (key: namespace/name), as named steps:

0.           — a pod in a namespace the bridge does not manage gets PodScheduled=False,
               `NamespaceNotManaged`, and nothing is submitted;
1. `submit`  — a pending pod of ours with no job gets one placeholder job (see
               `placeholder`): described, allocated inside the request when a node looks
               free or else submitted to wait for Slurm's pass (see `immediate`), then
               the pod is labelled with the job id and gets the finalizer (a job allocated
               inside the request: the pod is bound first, the job id in its Binding, and
               labelled just after, in `place`). A pod Slurm refuses stays Pending with
               PodScheduled=False, reason `SlurmRejected` and Slurm's own message, and
               is tried again with backoff; a pod that cannot be described at all gets the
               reason that says why and waits for a change;
   Before submitting, the pod's nodeSelector, required node affinity and tolerations are
               turned into `excluded_nodes` (see `constraints`); a pod no managed node can
               take is not submitted: PodScheduled=False, `NoManagedNodeFits`, saying why;
               one larger (CPUs, memory) than every managed node it may use is not either:
               `Unschedulable`, with the numbers;
2. `place`   — once Slurm allocated the job, the pod is annotated with the Slurm node and
               bound to the Kubernetes node of that name; while the job pends, the pod says
               so (PodScheduled=False, `SlurmJobPending`, Slurm's reason), and the job's
               excluded_nodes follow the managed nodes; an allocated node the pod's
               constraints reject gets the pod a new job instead (see `exclusion`); a job
               Slurm no longer knows (lost in a slurmctld crash) gets the pod a new one, and
               so does a job whose admin_comment does not name the pod (`placeholder.
               job_is_for`): after a slurmctld restart from older saved state its id can
               name another job, which is never bound to, nor cancelled by the bridge.

Never a second job for a pod: the job id is remembered from the moment Slurm answers
(before the label is written), recovered at start from the jobs' admin_comment for pods that
have no label yet, and a submission whose answer was lost is looked for in Slurm before it
is made again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from slinky.bridge import constraints, groups, placeholder, podcontrol
from slinky.bridge.config import BridgeConfig
from slinky.bridge.connection import SlurmConnection
from slinky.bridge.jobwatch import JobWatch
from slinky.bridge.labels import REPLACED_JOB, SLURM_JOBID
from slinky.bridge.nodes.controller import BY_SLURM_NAME
from slinky.bridge.nudge import nudge
from slinky.bridge.scheduler import exclusion, handover, immediate
from slinky.bridge.scheduler.gang import GangScheduler
from slinky.bridge.scheduler.ledger import Ledger
from slinky.bridge.scheduler.metrics import (
    BIND_LATENCY,
    EXCLUSION_UPDATES,
    IMMEDIATE_REFUSED,
    JOBS_CREATED,
    PODS_BOUND,
    PODS_PENDING,
    REPLACEMENTS,
    SLURM_ERRORS,
    SUBMIT_LATENCY,
    pod_age,
)
from slinky.bridge.workload import sync as workload_sync
from slinky.kube import events, rest
from slinky.kube.controller import DONE, Result
from slinky.kube.informer import Informer
from slinky.slurm import errors
from slinky.slurm.models import Job, expand_hostlist
from slinky.slurm.tokens import TokenProvider
from slinky.types import JSON

log = logging.getLogger(__name__)

REJECT_BACKOFF_S = 2.0
# Retrying the cancellations the scheduler owes (`to_cancel`): at most this often.
CANCEL_RETRY_S = 10.0
# A Slurm user whose minted tokens slurmctld refused is not allocated as for this long.
REFUSED_USER_S = 300.0
DEMAND_KEY = "bridge-scheduler"
REJECT_BACKOFF_MAX_S = 300.0
REJECT_DOUBLINGS = 16  # 2 s doubled this often is past the maximum: no larger power
NO_NODE_RECHECK_S = 5.0
# How long a pod waits at most for pods of higher priority in flight to ask first (`turn`).
TURN_WAIT_S = 1.0
# A pod allocated a node that a pod of ours is leaving (`handover`): looked at again this
# often besides when that pod turns terminal, and says why it waits after RELEASE_QUIET_S.
RELEASE_RECHECK_S = 5.0
RELEASE_QUIET_S = 3.0


def priority(pod: JSON | None) -> int:
    return int(((pod or {}).get("spec") or {}).get("priority") or 0)


async def wait_at_most(cond: asyncio.Condition, predicate: Callable[[], bool]) -> None:
    """Wait until `predicate` holds, told by `cond`, for at most TURN_WAIT_S."""
    async with cond:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cond.wait_for(predicate), TURN_WAIT_S)


def as_its_user(desc: JSON) -> JSON:
    """`desc` as its own Slurm user may ask for it: the bridge's mark in `comment` (only an
    administrator may set admin_comment; the bridge writes it once the job exists), and no
    user_id or group_id (the job is the asking user's, in that user's primary group)."""
    fields = {k: v for k, v in desc.items() if k not in ("admin_comment", "user_id", "group_id")}
    return {**fields, "comment": desc["admin_comment"]}


def marked(job: Job, admin_comment: str) -> Job:
    """`job` as it is once the bridge wrote `admin_comment` on it."""
    return dataclasses.replace(job, raw={**job.raw, "admin_comment": admin_comment})


def slurm_message(e: errors.SlurmError) -> str:
    """Slurm's own words for a refusal (the error descriptions), else the whole error."""
    said = [x.error for x in e.errors if x.error_number] or [x.description for x in e.errors]
    return "; ".join(s for s in said if s) or str(e)


class SchedulerSync:
    """The scheduler's reconciler; see the module docstring for its steps."""

    def __init__(
        self,
        kube: rest.Kube,
        *,
        config: BridgeConfig,
        pods: Informer,
        nodes: Informer,
        slurm: SlurmConnection,
        watch: JobWatch,
        recorder: events.EventRecorder,
        is_managed: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        self.kube = kube
        self.config = config
        self.is_managed = is_managed or self.listed
        self.pods = pods
        pods.store.add_indexer(handover.BY_NODE, handover.index_node)
        self.nodes = nodes
        self.slurm = slurm
        self.watch = watch
        self.recorder = recorder
        # Which job was made for which pod, who waits on which job, what is uncertain,
        # what is owed a cancel: see `ledger`. Single pods and groups share it.
        self.ledger = Ledger()
        # Pod UID -> how many times Slurm refused its job in a row (the backoff), and the
        # monotonic time before which it is not asked again, whatever brings the pod back
        # (a status write, a gang member's reconcile).
        self.rejections: dict[str, int] = {}
        self.not_before: dict[str, float] = {}
        # Pods no managed node can take: looked at again when nodes change.
        self.unfit: set[str] = set()
        PODS_PENDING.set_function(lambda: self.ledger.waiting_count() + len(self.unfit))
        # Pods that Slurm starts together (PodGroup, LeaderWorkerSet, gang Job/JobSet).
        self.gangs = GangScheduler(self, groups.GroupResolver(kube))
        # Cleared when slurmrestd has no job/allocate (an older release): submit only.
        self.allocate_at_once = config.immediate_allocation
        self.claims = immediate.Claims()
        # Keys of pods found labelled with a job at start and not placed since: their jobs
        # may wait in Slurm (made by the replica before this one).
        self.unseen: set[str] = set()
        self._cancel_tried = 0.0
        # Slurm users whose minted tokens slurmctld refused: not allocated as, for a while.
        self.refused_users: dict[str, float] = {}
        # Pods in a reconcile that have not yet asked for a node, by spec.priority: a pod
        # asks only once every pod of higher priority in flight has (see `turn`).
        self.undecided: dict[str, int] = {}
        self._decided = asyncio.Condition()
        # Submissions on their way, by partition: they count as pending jobs of ours (and,
        # once answered, `Ledger.submitted` until their pods wait on them).
        self.submitting: dict[str, int] = {}
        self._answered = asyncio.Condition()  # an allocation's answer came
        # Pods allocated a node that a pod of ours is leaving and that would not fit beside
        # it (`handover`), by node; and since when each waits.
        self.held: dict[str, set[str]] = {}
        self.held_since: dict[str, float] = {}
        # Pods this scheduler bound (key -> UID) that the informer does not show bound yet:
        # the label's own event brings them back first, and there is nothing left to do.
        self.just_bound: dict[str, str] = {}

    # ------------------------------------------------------------ which pods

    async def listed(self, namespace: str) -> bool:
        """Managed by the config's list alone (no namespace labels at hand)."""
        return self.config.is_managed_namespace(namespace, None)

    def schedulable(self, pod: JSON | None) -> bool:
        """A pod of ours that waits for a node."""
        if pod is None:
            return False
        spec = pod.get("spec") or {}
        return (
            spec.get("schedulerName") == self.config.scheduler_name
            and not spec.get("nodeName")
            and not podcontrol.is_deleting(pod)
            and not podcontrol.is_terminal(pod)
        )

    def forget(self, key: str) -> None:
        self.unfit.discard(key)
        self.held_since.pop(key, None)
        self.unseen.discard(key)
        job_id = self.ledger.stop_waiting(key)
        if job_id is not None:
            self.watch.untrack(job_id)

    async def reconcile(self, key: str) -> Result:
        """Submit, label, place: whichever step the pod is at."""
        if self.ledger.owed() and time.monotonic() - self._cancel_tried > CANCEL_RETRY_S:
            await self.cancel_pending_cancels()
        pod = self.pods.store.get(key)
        if self.schedulable(pod):
            self.undecided[key] = priority(pod)
        try:
            return await self.schedule(key)
        finally:
            await self.decided(key)
            # Slurm is polled fast while pods wait on it, slowly otherwise.
            self.slurm.informer.demand(DEMAND_KEY, bool(self.ledger.waiting_count() or self.unfit))

    async def turn(self, key: str) -> None:
        """Wait until no pod of higher priority in a reconcile beside this one is still to
        ask for a node (at most TURN_WAIT_S), then count `key` as having asked. Workers run
        side by side and a pod's requests before its decision take their own time, so
        without this a pod taken from the queue after one of higher priority could take
        the free node first."""
        mine = self.undecided.get(key)
        if mine is None:
            return

        await wait_at_most(
            self._decided, lambda: not any(p > mine for k, p in self.undecided.items() if k != key)
        )
        await self.decided(key)

    async def decided(self, key: str) -> None:
        if key in self.undecided:
            async with self._decided:
                self.undecided.pop(key, None)
                self._decided.notify_all()

    async def schedule(self, key: str) -> Result:
        pod = self.pods.store.get(key)
        if pod is None or not self.schedulable(pod):
            self.forget(key)
            self.just_bound.pop(key, None)
            await self.gangs.left(key, pod)
            await self.resolve_uncertain(key, pod)
            await self.drop_unlabelled(key, pod)
            return DONE
        uid = str(pod["metadata"]["uid"])
        if self.just_bound.get(key) == uid:
            # Bound by an earlier pass. Placing it again would read its job (no longer
            # followed), and while that read is out the job counts as possibly pending for
            # every pod deciding beside it (`pending_in`): they would all be submitted.
            return DONE
        if podcontrol.job_id_of(pod) is None and self.ledger.job_made_for(uid) is None:
            namespace = str(pod["metadata"].get("namespace") or "")
            if not await self.is_managed(namespace):
                return await self.not_managed(pod, namespace)
        earlier = self.ledger.unlabelled(key)
        if earlier is not None and earlier[0] != uid:
            # A pod of the same name created anew: the job of the one before is no one's.
            await self.drop_unlabelled(key, pod)
        try:
            group = await self.gangs.group(pod)
        except groups.GroupProblem as p:
            return await self.gangs.problem(pod, p)
        if group is not None:
            return await self.gangs.reconcile(pod, group)
        job_id = podcontrol.job_id_of(pod)
        if job_id is not None:
            self.ledger.labelled(key, uid)
            return await self.place(pod, job_id)
        job_id = self.ledger.job_made_for(uid)
        if job_id is None:
            return await self.submit(pod)
        await podcontrol.mark_submitted(self.kube, pod, job_id)
        return await self.place(pod, job_id)

    async def not_managed(self, pod: JSON, namespace: str) -> Result:
        """A pod that names this scheduler in a namespace the bridge does not manage: it
        waits, saying why; no Slurm job is made for it (naming the scheduler is not enough:
        the namespace is the boundary the admin set)."""
        message = (
            f"namespace {namespace} is not managed by this slurm-bridge (config "
            "managedNamespaces / managedNamespaceSelector): no Slurm job is made for the pod"
        )
        SLURM_ERRORS.labels("NamespaceNotManaged").inc()
        if await podcontrol.set_unschedulable(self.kube, pod, "NamespaceNotManaged", message):
            self.recorder.event(
                pod, events.WARNING, "NamespaceNotManaged", message, action="Schedule"
            )
        return DONE  # a change of the pod brings it back; of the namespace, a restart

    async def drop_unlabelled(self, key: str, pod: JSON | None) -> None:
        """The pod left the queue: if it never got the label of the job submitted for it,
        that job is cancelled (no one else could ever find it)."""
        entry = self.ledger.unlabelled(key)
        if entry is None:
            return
        uid, job_id = entry
        if not (
            pod is not None
            and str(pod["metadata"].get("uid")) == uid
            and podcontrol.job_id_of(pod) == job_id
        ):
            # Forgotten only once cancelled: a failed cancel is retried with the pod's key.
            await self.cancel_if_for(job_id, key, uid, "went away before it was labelled")
        self.ledger.labelled(key, uid)

    async def cancel_if_for(self, job_id: int, key: str, uid: str, why: str) -> None:
        """Cancel `job_id` if it is still the placeholder job of pod `key` (UID `uid`): the
        id was Slurm's answer for the pod, but a slurmctld restart since may have given it
        to another job, which is not ours to cancel (one read; a rare path)."""
        try:
            job = await self.slurm.client.get_job(job_id)
        except errors.SlurmNotFound:
            return
        if job.is_finished:
            return
        if not placeholder.job_is_for(job, self.config, key=key, uid=uid):
            log.warning("job %d: not cancelled: it is not the placeholder job of %s", job_id, key)
            return
        await self.slurm.client.cancel_job(job_id)
        log.info("job %d: cancelled: pod %s %s", job_id, key, why)

    async def resolve_uncertain(self, key: str, pod: JSON | None) -> None:
        """A pod whose submission went unanswered left the queue: its job, if Slurm made
        one, is looked for so that `drop_unlabelled` cancels it."""
        uid = self.ledger.uncertain_uid(key)
        if uid is None:
            return
        if (
            pod is None
            or str(pod["metadata"].get("uid")) != uid
            or podcontrol.job_id_of(pod) is None
        ):
            await self.find_submitted({uid})
        self.ledger.settled({key: uid})

    # ------------------------------------------------------------ recovery

    async def recover(self) -> int:
        """At start: the jobs already submitted for pods that carry no job-id label yet
        (the scheduler stopped between submit and label). One full read of the job list,
        and only when such a pod exists. Returns how many were found."""
        unlabelled = set()
        for p in self.pods.store.objects():
            if not self.schedulable(p):
                continue
            if podcontrol.job_id_of(p) is None:
                unlabelled.add(str(p["metadata"]["uid"]))
            else:
                self.unseen.add(placeholder.pod_key(p))
        if not unlabelled:
            return 0
        return len(await self.find_submitted(unlabelled))

    async def find_submitted(self, uids: set[str]) -> dict[str, int]:
        """Pod UID -> live job id of ours, for the given pods, from every job's comment."""
        jobs, _ = await self.slurm.client.list_jobs()
        found: dict[str, int] = {}
        for job in jobs or []:
            if job.is_finished:
                continue
            if workload_sync.unconfirmed(job, self.config) and not self.ledger.is_confirming(
                job.job_id
            ):
                # An allocation whose answer was lost before it was marked as ours: its pod
                # gets another job; this one ran nothing.
                mark = placeholder.read_comment(str(job.raw.get("comment") or ""))
                await self.cancel_later(job.job_id, mark.pods if mark is not None else {})
                continue
            comment = placeholder.read_comment(str(job.raw.get("admin_comment") or ""))
            if comment is None:
                continue
            if not comment.made_by(self.config):
                continue
            for key, uid in comment.pods.items():
                if uid in uids:
                    found[uid] = job.job_id
                    self.ledger.made(job.job_id, [(key, uid)])
                    log.info("pod %s: found its job %d in Slurm", key, job.job_id)
        return found

    # ------------------------------------------------------------ 1. submit

    async def submit(self, pod: JSON) -> Result:
        key = placeholder.pod_key(pod)
        uid = str(pod["metadata"]["uid"])
        if self.ledger.is_uncertain(key):
            # One read of the job list answers for every pod whose submission went
            # unanswered (slurmrestd was down for all of them at once, typically).
            asked = self.ledger.uncertain()
            found = await self.find_submitted(set(asked.values()))
            self.ledger.settled(asked)
            if uid in found:
                return Result(requeue=True)
        try:
            desc = placeholder.job_description(pod, self.config)
        except placeholder.PlaceholderProblem as p:
            SLURM_ERRORS.labels(p.reason).inc()
            if await podcontrol.set_unschedulable(self.kube, pod, p.reason, p.message):
                self.recorder.event(pod, events.WARNING, p.reason, p.message, action="Schedule")
            return DONE  # nothing changes until the pod does
        where = self.placement(pod, str(desc["partition"]))
        if where.impossible:
            self.unfit.add(key)
            message = where.explain()
            SLURM_ERRORS.labels("NoManagedNodeFits").inc()
            if await podcontrol.set_unschedulable(self.kube, pod, "NoManagedNodeFits", message):
                self.recorder.event(
                    pod, events.WARNING, "NoManagedNodeFits", message, action="Schedule"
                )
            return DONE  # a node change brings it back
        informer = self.slurm.informer
        sizes = [
            (n, informer.nodes[n].cpus, informer.nodes[n].real_memory)
            for n in where.allowed
            if n in informer.nodes
        ]
        if (too_large := constraints.too_large(desc, sizes)) is not None:
            self.unfit.add(key)
            SLURM_ERRORS.labels("Unschedulable").inc()
            if await podcontrol.set_unschedulable(self.kube, pod, "Unschedulable", too_large):
                self.recorder.event(
                    pod, events.WARNING, "Unschedulable", too_large, action="Schedule"
                )
            return DONE  # a node change brings it back
        self.unfit.discard(key)
        if (wait := self.backing_off([uid])) is not None:
            return Result(requeue_after=wait)
        if where.excluded:
            desc["excluded_nodes"] = where.excluded
        try:
            job_id = await self.create_job(
                desc,
                where.allowed,
                [uid],
                as_user=placeholder.allocation_user(pod, self.config),
                key=key,
            )
        except (errors.SlurmUnavailable, errors.SlurmAuthError) as e:
            # Not an answer about the job: retried with the controller's backoff, after
            # looking for the job in case the request reached slurmctld. The pod says why.
            SLURM_ERRORS.labels(type(e).__name__).inc()
            self.ledger.unsure(key, uid)
            await self.cannot_ask(pod, e)
            raise
        except errors.SlurmError as e:
            return await self.rejected(pod, e)
        self.ledger.made(job_id, [(key, uid)])
        self.accepted([uid])
        age = pod_age(pod)
        if age is not None:
            SUBMIT_LATENCY.observe(age)
        log.info("pod %s: submitted placeholder job %d (%s)", key, job_id, desc["partition"])
        # A job allocated at once was read already: its pod is bound first, the job id in the
        # Binding, and labelled just after (a restart in between finds the job by that
        # annotation, or by its admin_comment). A submitted job's pod waits: it is labelled
        # now, beside the job's first read (one round trip instead of two).
        if job_id in self.watch.jobs:
            return await self.place(pod, job_id, label_after=True)
        self.watch.track(job_id, fresh=True)
        await asyncio.gather(
            podcontrol.mark_submitted(self.kube, pod, job_id), self.first_read(job_id)
        )
        return await self.place(pod, job_id)

    async def cannot_ask(self, pod: JSON, e: errors.SlurmError) -> None:
        """The pod waits because Slurm cannot be asked at all: PodScheduled=False says so
        (`SlurmAuthFailed`: the bridge's credentials were refused; `SlurmUnreachable`)."""
        if isinstance(e, errors.SlurmAuthError):
            reason = "SlurmAuthFailed"
            message = (
                f"slurmrestd refused the bridge's credentials ({e}); retrying. Check "
                "slurmAuth: a JWT key file is re-read when it changes, and slurmctld and "
                "slurmrestd must run with the same key (restart them after a rotation)"
            )
        else:
            reason = "SlurmUnreachable"
            message = f"slurmrestd cannot be reached ({e}); retrying"
        with contextlib.suppress(rest.ApiError):
            if await podcontrol.set_unschedulable(self.kube, pod, reason, message):
                self.recorder.event(pod, events.WARNING, reason, message, action="Schedule")

    async def create_job(
        self, desc: JSON, allowed: list[str], uids: list[str], *, as_user: str | None, key: str
    ) -> int:
        """The placeholder job `desc` for the pods `uids` (reconciled as pod `key`):
        allocated inside the request when enough `allowed` nodes look free (see
        `immediate`) and the bridge can ask as the job's Slurm user `as_user` (None: it may
        not), else submitted to wait for Slurm's pass. Raises what `submit_job` raises."""
        await self.cancel_pending_cancels()
        await self.turn(key)
        tokens = self.allocation_tokens(as_user)
        if (
            tokens is not None
            and self.allocate_at_once
            and not any(u in self.rejections for u in uids)
            and not self.pending_in(str(desc["partition"]))
        ):
            job_id = await self.allocate(desc, allowed, tokens)
            if job_id is not None:
                return job_id
        partition = str(desc["partition"])
        # From here until the pod waits on it (`place`), the job counts as pending in its
        # partition for the pods deciding beside this one; and it goes to Slurm only after
        # the allocations asked before it were answered: a pending job of ours ahead of
        # them would make Slurm refuse them ("insufficient priority").
        self.submitting[partition] = self.submitting.get(partition, 0) + 1
        try:
            await wait_at_most(self._answered, lambda: not self.claims.in_flight)
            job_id = await self.slurm.client.submit_job(desc)
            self.watch.given_again(job_id)
            self.ledger.submitted(job_id, partition)
        finally:
            self.submitting[partition] -= 1
        JOBS_CREATED.labels("submitted").inc()
        return job_id

    def allocation_tokens(self, user: str | None) -> TokenProvider | None:
        """Tokens to ask an allocation as `user` (see `create_job`), or None: not that user,
        or one whose tokens slurmctld refused lately."""
        if user is None or self.refused_users.get(user, 0.0) > time.monotonic():
            return None
        return self.slurm.tokens_for(user)

    def pending_in(self, partition: str) -> bool:
        """Whether a placeholder job of ours waits in `partition`: Slurm would refuse a
        newer one at once ("insufficient priority"), and rightly, as pods go in order.
        Until every pod found labelled at start was looked at, its job may be one."""
        if self.unseen or self.submitting.get(partition):
            return True
        if self.ledger.submitted_unwaited(partition):
            return True
        for job_id in self.ledger.waited_jobs():
            if job_id not in self.watch.jobs:
                return True  # not read yet: it may be
            job = self.watch.jobs[job_id]
            if job is not None and job.is_pending and job.partition == partition:
                return True
        return False

    async def allocate(self, desc: JSON, allowed: list[str], tokens: TokenProvider) -> int | None:
        """Ask Slurm, as `tokens`' user, to allocate `desc` now if the nodes look free: the
        job id, or None (not asked, refused, or not confirmed as ours: no job is left).
        Whether to ask and the claim on the free nodes are decided in one step, with no
        await between them, so each request sees what the ones before it took (see
        `immediate.Claims`); the requests themselves are in flight together (a burst is
        not one round trip per pod), and slurmctld decides them one by one."""
        informer = self.slurm.informer
        taken = self.claims.overlay(informer.nodes, informer.shows_since)
        flying = self.claims.in_flight.values()
        if not immediate.worth_allocating(desc, allowed, informer.nodes, taken, flying):
            return None
        token = self.claims.start(desc)
        own = tokens is self.slurm.client.tokens
        nodes: list[str] = []
        try:
            job_id = await self.ask_allocation(desc if own else as_its_user(desc), tokens)
            if job_id is None:
                return None
            self.watch.given_again(job_id)
            if own:
                job = await self.read_quietly(job_id)
            else:
                # Marked and read together (one round trip, not two): the read may come
                # before the mark lands, so the job is kept as marked once it has been
                # (place() trusts only a job whose admin_comment names the pod). The job
                # is not tracked yet: the watch records nothing of that read.
                confirmed, job = await asyncio.gather(
                    self.confirm(job_id, desc), self.read_quietly(job_id)
                )
                if not confirmed:
                    return None
                if job is not None:
                    job = marked(job, str(desc["admin_comment"]))
            if job is None:
                self.watch.track(job_id, fresh=True)  # place() reads it again
            else:
                self.watch.adopt(job_id, job)
                nodes = expand_hostlist(job.nodes)
        finally:
            # Marked when the answer is in: a poll that started before Slurm allocated
            # (while the request was in flight) must not clear the claim.
            self.claims.finish(token, desc, nodes, informer.mark())
            async with self._answered:
                self._answered.notify_all()
        return job_id

    async def read_quietly(self, job_id: int) -> Job | None:
        """The job as Slurm has it now, or None when Slurm does not know it or the read
        failed."""
        with contextlib.suppress(errors.SlurmError):
            return await self.watch.read(job_id)
        return None

    async def confirm(self, job_id: int, desc: JSON) -> bool:
        """A job allocated as its own user carries the bridge's mark only in `comment` (a
        user may not set admin_comment, which alone the bridge trusts): the bridge writes
        admin_comment as administrator now. False: not written, the job is cancelled (now,
        or later: `cancel_pending_cancels`) and the pod submitted instead."""
        mark = placeholder.read_comment(str(desc["admin_comment"]))
        pods = mark.pods if mark is not None else {}
        try:
            with self.ledger.confirming(job_id):
                await self.slurm.client.update_job(job_id, {"admin_comment": desc["admin_comment"]})
            return True
        except errors.SlurmError as e:
            log.info("job %d: allocated but not marked as ours (%s); cancelling it", job_id, e)
        except BaseException:
            # Interrupted: whether it was marked is not known.
            self.ledger.owe_cancel(job_id, pods)
            raise
        await self.cancel_later(job_id, pods)
        return False

    async def cancel_later(self, job_id: int, pods: Mapping[str, str]) -> None:
        """Cancel `job_id`, made for `pods`, now, or keep retrying (see
        `cancel_pending_cancels`)."""
        self.ledger.owe_cancel(job_id, pods)
        await self.cancel_pending_cancels()

    async def cancel_pending_cancels(self) -> None:
        """Cancel the jobs this scheduler owes a cancel (`Ledger.owed`); tried at each new job
        and, while any is left, at a reconcile at most every CANCEL_RETRY_S. A leader that
        dies with some left leaves an allocation never marked as ours to the workload
        controller (`workload.sync.unconfirmed`)."""
        self._cancel_tried = time.monotonic()
        for job_id, pods in self.ledger.owed():
            try:
                # Owed from before a slurmctld restart, the id may name another job now,
                # another pod's placeholder too: cancelled only while it is still marked
                # for the pods it was made for.
                job = await self.slurm.client.get_job(job_id)
            except errors.SlurmNotFound:
                job = None
            except errors.SlurmError:
                return
            if job is not None and not job.is_finished:
                if not placeholder.marked_for(job, self.config, pods):
                    log.warning(
                        "job %d: owed a cancel, not sent: it is not the job made for %s now",
                        job_id,
                        sorted(pods),
                    )
                    self.ledger.paid(job_id)  # the live job under that id is not ours to touch
                    continue
                try:
                    await self.slurm.client.cancel_job(job_id)
                except errors.SlurmError:
                    return
            self.ledger.paid(job_id)
            self.ledger.drop_job(job_id)
            self.watch.untrack(job_id)

    async def ask_allocation(self, desc: JSON, tokens: TokenProvider) -> int | None:
        """`job/allocate` with immediate, as `tokens`' user: the job id, or None when Slurm
        refused it or slurmrestd has no such route (then never again in this process)."""
        try:
            job_id = await self.slurm.client.allocate_job(desc, tokens=tokens)
        except errors.SlurmEndpointMissing:
            log.info("slurmrestd has no job/allocate: placeholder jobs are submitted only")
            self.allocate_at_once = False
            return None
        except errors.SlurmAuthError as e:
            if tokens is self.slurm.client.tokens:
                raise  # the bridge's own credentials: nothing works, retried with backoff
            # slurmctld refuses to act as that user (unknown to it, say): submitting as the
            # bridge, with the user named in the job, still works.
            self.refused_users[tokens.user] = time.monotonic() + REFUSED_USER_S
            log.info("allocation as Slurm user %s refused (%s); submitting", tokens.user, e)
            return None
        except errors.SlurmUnavailable:
            raise
        except errors.SlurmError as e:
            IMMEDIATE_REFUSED.inc()
            log.debug("%s: not allocated at once (%s); submitting", desc["name"], e)
            return None
        JOBS_CREATED.labels("allocated").inc()
        return job_id

    async def first_read(self, job_id: int) -> None:
        """Read a job just submitted (place() then uses the read); a failed read is left to
        place(), which reads it again."""
        with contextlib.suppress(errors.SlurmError):
            await self.watch.read(job_id)

    async def rejected(
        self, pod: JSON, e: errors.SlurmError, others: Sequence[JSON] = ()
    ) -> Result:
        """Slurm refused the job of `pod` (and of the `others` of its group): say so on each
        pod and try again later (the partition may be created, the limit raised); no job
        was made, so none is left behind."""
        uid = str(pod["metadata"]["uid"])
        message = f"Slurm refused the placeholder job: {slurm_message(e)}"
        SLURM_ERRORS.labels("SlurmRejected").inc()
        for other in others:
            await podcontrol.set_unschedulable(self.kube, other, "SlurmRejected", message)
        if await podcontrol.set_unschedulable(self.kube, pod, "SlurmRejected", message):
            self.recorder.event(pod, events.WARNING, "SlurmRejected", message, action="Schedule")
        n = self.rejections.get(uid, 0)
        delay = REJECT_BACKOFF_S * 2 ** min(n, REJECT_DOUBLINGS)
        delay = min(delay, REJECT_BACKOFF_MAX_S)
        uids = [uid, *(str(o["metadata"]["uid"]) for o in others)]
        for u in uids:
            self.rejections[u] = n + 1
            self.not_before[u] = time.monotonic() + delay
        log.info("pod %s: %s; trying again in %.0fs", placeholder.pod_key(pod), message, delay)
        return Result(requeue_after=delay)

    def backing_off(self, uids: Iterable[str]) -> float | None:
        """Seconds until the pods `uids` may be asked for again after Slurm refused their
        job, or None when they may now."""
        now = time.monotonic()
        wait = max((self.not_before.get(u, now) - now for u in uids), default=0.0)
        return wait if wait > 0 else None

    def accepted(self, uids: Iterable[str]) -> None:
        for u in uids:
            self.rejections.pop(u, None)
            self.not_before.pop(u, None)

    def placement(self, pod: JSON, partition: str) -> constraints.Placement:
        """The partition's Slurm nodes (Slurm informer cache), split by the pod's constraints."""
        slurm_nodes = [
            n.name for n in self.slurm.informer.nodes.values() if partition in n.partitions
        ]
        kube_node_of: dict[str, JSON] = {}
        for name in slurm_nodes:
            standing = sorted(
                self.nodes.store.by_index(BY_SLURM_NAME, name), key=lambda n: n["metadata"]["name"]
            )
            if standing:
                kube_node_of[name] = standing[0]
        return constraints.placement(
            pod, slurm_nodes, kube_node_of, scheduler_name=self.config.scheduler_name
        )

    # ------------------------------------------------------------ 2. place

    async def job(self, job_id: int) -> Job | None:
        if self.watch.known(job_id):
            return self.watch.jobs[job_id]
        return await self.watch.read(job_id)

    def kube_node(self, slurm_node: str) -> JSON | None:
        """The Kubernetes node whose Slurm name is `slurm_node` (label, else its name)."""
        nodes = sorted(
            self.nodes.store.by_index(BY_SLURM_NAME, slurm_node),
            key=lambda n: str(n["metadata"]["name"]),
        )
        return nodes[0] if nodes else None

    async def place(self, pod: JSON, job_id: int, *, label_after: bool = False) -> Result:
        """`label_after`: the pod has no job-id label yet; it gets it once bound, or before
        any other outcome of this pass."""
        key = placeholder.pod_key(pod)

        async def labelled_first() -> None:
            if label_after:
                await podcontrol.mark_submitted(self.kube, pod, job_id)

        self.ledger.wait(key, job_id)
        self.unseen.discard(key)
        self.watch.track(job_id)
        await self.cancel_replaced(pod)
        job = await self.job(job_id)
        if job is None:
            return await self.job_lost(pod, job_id, "Slurm no longer knows it (slurmctld lost it)")
        if not placeholder.job_is_for(job, self.config, key=key, uid=placeholder.pod_uid(pod)):
            # Checked before anything is read from the job, its end included: the id names
            # another job (given again after a slurmctld restart, or a label someone else
            # wrote), so the pod's own is lost. Never bound there, never cancelled by us.
            return await self.job_lost(pod, job_id, "it is not the pod's placeholder job")
        if job.is_finished:
            await labelled_first()
            return DONE  # the workload controller ends the pod with its job
        allocated = expand_hostlist(job.nodes) if job.is_running else []
        if job.is_pending:
            await self.follow_nodes(pod, job)
        if not allocated:
            await labelled_first()
            state = "/".join(job.state) or "PENDING"
            why = (
                f" ({job.state_reason})" if job.state_reason and job.state_reason != "None" else ""
            )
            await podcontrol.set_unschedulable(
                self.kube, pod, "SlurmJobPending", f"Slurm job {job_id} is {state}{why}"
            )
            return DONE  # the job watch brings the pod back when the job changes
        slurm_node = allocated[0]
        node_obj = self.kube_node(slurm_node)
        if node_obj is not None and not exclusion.allows(
            pod, node_obj, scheduler_name=self.config.scheduler_name
        ):
            await labelled_first()  # the replacement relabels, the finalizer stays
            return await self.replace(pod, job_id, slurm_node)
        node = None if node_obj is None else str(node_obj["metadata"]["name"])
        if node is None:
            await labelled_first()
            message = (
                f"Slurm job {job_id} was allocated Slurm node {slurm_node}, which no "
                "Kubernetes node stands for"
            )
            self.recorder.event(pod, events.WARNING, "NodeNotFound", message, action="Bind")
            return Result(requeue_after=NO_NODE_RECHECK_S)
        if node_obj is not None and (leaving := self.leaving_blocks(pod, node_obj)):
            await labelled_first()
            return await self.wait_for_release(pod, job_id, node, leaving)
        try:
            await podcontrol.bind(self.kube, pod, node, slurm_node, job_id)
        except rest.ApiError as e:
            if e.not_found or e.conflict:
                return DONE  # deleted, or bound already (by an earlier pass)
            raise
        age = pod_age(pod)
        if age is not None:
            BIND_LATENCY.observe(age)
        PODS_BOUND.inc()
        log.info("pod %s: bound to %s (Slurm job %d on %s)", key, node, job_id, slurm_node)
        self.recorder.event(
            pod,
            events.NORMAL,
            "Scheduled",
            f"Slurm job {job_id} allocated Slurm node {slurm_node}; bound to node {node}",
            action="Bind",
        )
        self.forget(key)
        self.just_bound[key] = placeholder.pod_uid(pod)
        if label_after:
            await podcontrol.label_bound(self.kube, pod, job_id)
        return DONE

    def leaving_blocks(self, pod: JSON, node_obj: JSON) -> str | None:
        """A pod of ours leaving the node that `pod` does not fit beside (`handover`)."""
        node = str(node_obj["metadata"]["name"])
        return handover.leaving_blocks(
            pod, node_obj, self.pods.store.by_index(handover.BY_NODE, node)
        )

    async def wait_for_release(self, pod: JSON, job_id: int, node: str, leaving: str) -> Result:
        """`pod` waits for `leaving` to be terminal or gone (`released` brings it back);
        after RELEASE_QUIET_S it says so."""
        key = placeholder.pod_key(pod)
        self.held.setdefault(node, set()).add(key)
        since = self.held_since.setdefault(key, time.monotonic())
        if time.monotonic() - since >= RELEASE_QUIET_S:
            await podcontrol.set_unschedulable(
                self.kube,
                pod,
                "NodeReleasing",
                f"Slurm job {job_id} was allocated node {node}, where pod {leaving} has ended "
                "but the kubelet has not released it yet; the pod does not fit beside it",
            )
        return Result(requeue_after=RELEASE_RECHECK_S)

    def released(self, pod: JSON) -> list[str]:
        """The pods held for `pod`'s node (`wait_for_release`), when `pod` is terminal or
        gone now (a mapper of pod events)."""
        node = podcontrol.node_of(pod)
        if node not in self.held:
            return []
        now = self.pods.store.get(placeholder.pod_key(pod))
        if now is not None and not podcontrol.is_terminal(now):
            return []
        return sorted(self.held.pop(node))

    async def job_lost(self, pod: JSON, job_id: int, why: str) -> Result:
        """The job of a pod that was never bound is lost (`why`): Slurm no longer knows it
        (slurmctld restarted from state saved before the job was: Slurm's own loss, the pod
        never ran), or its id now names a job that is not the pod's (a job made after that
        restart got it again). The pod loses the job-id label, and the job the scheduler
        remembers for it, and comes back to be submitted again. No second live job of its
        own can result: Slurm answered that the id is not its job."""
        key = placeholder.pod_key(pod)
        name, ns, uid = podcontrol.name_ns_uid(pod)
        self.forget(key)
        # Not to be labelled with it again, nor cancelled when the pod goes (not ours).
        self.ledger.labelled(key, uid)
        message = f"Slurm job {job_id}: {why}; submitting again"
        log.info("pod %s: %s", key, message)
        self.recorder.event(pod, events.WARNING, "SlurmJobLost", message, action="Schedule")
        try:
            await self.kube.patch(
                rest.PODS,
                name,
                {"metadata": {"uid": uid, "labels": {SLURM_JOBID: None}}},
                ns,
                kind="strategic",
            )
        except rest.ApiError as e:
            if not (e.not_found or e.conflict):
                raise
        return DONE  # the label's removal brings the pod back

    # ------------------------------------------------------------ nodes changed (see exclusion)

    async def follow_nodes(self, pod: JSON, job: Job) -> None:
        """A pending job's excluded_nodes brought up to date with the managed nodes."""
        where = self.placement(pod, job.partition or self.config.partition)
        want = exclusion.stale_exclusion(job, where)
        if want is None:
            return
        try:
            await self.slurm.client.update_job(job.job_id, {"excluded_nodes": want})
        except errors.SlurmError as e:
            # Allocated meanwhile, typically: the check before binding has the last word.
            log.info("job %d: excluded_nodes not updated (%s)", job.job_id, e)
            return
        EXCLUSION_UPDATES.inc()
        log.info("job %d: excluded_nodes now %s", job.job_id, ",".join(want) or "(none)")
        self.watch.track(job.job_id, soon=True)

    async def replace(self, pod: JSON, old: int, slurm_node: str) -> Result:
        """Slurm allocated the job a node the pod's constraints reject (a node that changed
        before its excluded_nodes could follow): the pod gets a new job, then the old one
        is cancelled (it ran nothing: the pod was never bound)."""
        key, uid = placeholder.pod_key(pod), str(pod["metadata"]["uid"])
        message = (
            f"Slurm job {old} was allocated Slurm node {slurm_node}, which the pod's node "
            "selector, affinity or tolerations reject; submitting a new job"
        )
        self.recorder.event(pod, events.WARNING, "SlurmNodeRejected", message, action="Bind")
        new = self.ledger.replacement(uid)
        if new is None:
            # Submitted before a crash, but not on the pod yet? (Rare path: a full read.)
            found = [j for j in await self.live_jobs_naming(uid) if j != old]
            new = found[0] if found else None
        if new is None:
            desc = placeholder.job_description(pod, self.config)
            where = self.placement(pod, str(desc["partition"]))
            if where.excluded:
                desc["excluded_nodes"] = where.excluded
            new = await self.slurm.client.submit_job(desc)
            log.info("pod %s: submitted job %d to replace job %d", key, new, old)
        self.ledger.replacing(uid, new)
        name, ns, _ = podcontrol.name_ns_uid(pod)
        relabelled = await self.kube.patch(
            rest.PODS,
            name,
            {
                "metadata": {
                    "uid": uid,
                    "labels": {SLURM_JOBID: str(new)},
                    "annotations": {REPLACED_JOB: str(old)},
                }
            },
            ns,
            kind="strategic",
        )
        self.ledger.replaced(uid)
        REPLACEMENTS.inc()
        self.forget(key)
        return await self.place(relabelled, new)

    async def cancel_replaced(self, pod: JSON) -> None:
        """The job named by the pod's replaced-job annotation is cancelled, if it is still
        this pod's placeholder and still live (repeated on every pass: a crash between
        relabelling and cancelling leaves it to the next)."""
        text = str(((pod["metadata"].get("annotations")) or {}).get(REPLACED_JOB) or "")
        if not text.isdigit() or int(text) == podcontrol.job_id_of(pod):
            return
        old = int(text)
        try:
            job = await self.slurm.client.get_job(old)
        except errors.SlurmNotFound:
            return
        if job.is_finished or not placeholder.job_is_for(
            job, self.config, key=placeholder.pod_key(pod), uid=placeholder.pod_uid(pod)
        ):
            return
        await self.slurm.client.cancel_job(old)
        log.info("job %d: cancelled: replaced for pod %s", old, placeholder.pod_key(pod))
        job_id = podcontrol.job_id_of(pod)
        if job.nodes and job_id is not None:
            # Its node is free: the replacement may take it at once rather than at
            # Slurm's next periodic pass.
            await nudge(
                self.slurm.client,
                job_id,
                placeholder.admin_comment([pod], self.config),
            )

    async def live_jobs_naming(self, uid: str) -> list[int]:
        """The live jobs of ours whose admin_comment names the pod `uid` (the job list)."""
        jobs, _ = await self.slurm.client.list_jobs()
        out = []
        for job in jobs or []:
            comment = placeholder.read_comment(str(job.raw.get("admin_comment") or ""))
            if job.is_finished or comment is None:
                continue
            if comment.made_by(self.config) and uid in comment.pods.values():
                out.append(job.job_id)
        return sorted(out)
