"""One reconcile of a bridge pod that has a placeholder job (key: namespace/name), as named
steps. Slurm is the source of truth for what runs on managed nodes:

1. `pod_gone`      — the pod is gone (or a new pod took its name before the deletion was
                     reconciled): its job is cancelled unless another pod of the job
                     still runs;
2. `pod_finished`  — the pod is terminal (Succeeded/Failed) or every container of it has
                     ended for good (`podcontrol.containers_ended`: the kubelet says so
                     about a second before the phase, and Slurm can give the node to the
                     next job meanwhile), or deleted while it never left
                     Pending: its job is cancelled (same rule), then the finalizer goes. A
                     bound pod that is Terminating but still runs keeps its job until the
                     kubelet reports it terminal, so its containers keep what Slurm gave them;
3. `job_ended`     — the job ended in Slurm (completed, cancelled with scancel, timed out,
                     node failure), or Slurm no longer knows the job of a bound pod, or the
                     job of a bound pod no longer holds its node (pending again after an
                     admin's requeue or a slurmctld restart that lost the allocation, or
                     suspended): the pod is deleted, with an event naming the job's state
                     (after one read of the live pod: a pod the scheduler just relabelled
                     with a replacement job is left alone). A pod that runs must never run
                     where Slurm thinks nothing does. An unbound pod whose job Slurm no
                     longer knows is the scheduler's: it gets a new job.

A group's job (one job for the pods of a PodGroup, LeaderWorkerSet replica, gang Job or
JobSet, see `groups`) follows the same rules, with one more: a pod of the group that *fails*
ends the job at once, so every other pod of the group is deleted with it. A gang runs all
its pods or none, and the owners restart a gang as a whole (LeaderWorkerSet recreates the
group, JobSet's failure policy restarts its jobs, a Job makes new pods, which form a new
group and get a new job). A pod that succeeds leaves the job to the others; the last one to
end it cancels it. An unbound pod of a group whose pending job was cancelled because another
pod left (the scheduler removes its job-id label first) is not deleted: the live pod is
read before any pod is deleted for its job.

A job the controller cancelled is followed until Slurm purges it (`JobWatch.
follow_cancelled`); if slurmctld brings it back (a crash right after it acknowledged the
cancel), `revived` cancels it again. `cancel_orphans` runs at start and, at most once a
minute, after slurmctld returned its node list and if it started again since the last
sweep (when a job this process never followed may be back): a live job of ours whose pods
are all gone or ended (confirmed by the apiserver, not only the cache) is cancelled, and so
is a job allocated as its user that was never marked as ours (`unconfirmed`), once it is old
enough that no scheduler can be marking it (`abandoned_allocation`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from slinky.bridge import placeholder, podcontrol
from slinky.bridge.config import BridgeConfig
from slinky.bridge.connection import SlurmConnection
from slinky.bridge.jobwatch import JobWatch
from slinky.bridge.labels import SLURM_JOBID
from slinky.bridge.nudge import nudge
from slinky.kube import events, rest
from slinky.kube.controller import DONE, Result
from slinky.kube.informer import Informer
from slinky.slurm.models import Job, number
from slinky.transport import TransportError
from slinky.types import JSON

log = logging.getLogger(__name__)

BY_JOB = "slurm-jobid"
# How many pending jobs of ours a nudge tries before it leaves the pass to Slurm's timer.
NUDGE_TRIES = 3
REVIVED_PREFIX = "revived-job:"  # work queue key of a cancelled job Slurm brought back
UNCONFIRMED_PREFIX = "unconfirmed-job:"  # ... of an allocation never marked as ours
ORPHANS_KEY = "orphaned-jobs"  # ... of a sweep for live jobs whose pods are gone or ended
# A sweep runs at most this often: after slurmctld returned the node list (a node changed,
# or slurmctld restarted: then a job cancelled before may be live again from saved state).
ORPHAN_SWEEP_S = 60.0
# How old an allocation never marked as ours must be before it is taken for abandoned: the
# scheduler marks its own within milliseconds of the allocation.
UNCONFIRMED_GRACE_S = 60.0
# A sweep takes an answer about slurmctld's start at most this old (the job watch asks too).
SWEEP_START_AGE_S = 1.0
# A pod bound with its job id in the Binding only is labelled by the scheduler just after;
# one still unlabelled this long after the workload controller first saw it is labelled here.
ADOPT_AFTER_S = 3.0
ADOPT_RETRY_S = 30.0


def index_job(pod: JSON) -> list[str]:
    job_id = podcontrol.job_id_of(pod)
    return [str(job_id)] if job_id is not None else []


def is_group_job(job: Job) -> bool:
    """The job stands for more than one pod (a group's job)."""
    comment = placeholder.read_comment(str(job.raw.get("admin_comment") or ""))
    return comment is not None and len(comment.pods) > 1


def unconfirmed(job: Job, config: BridgeConfig) -> bool:
    """A job the scheduler allocated as its Slurm user (the mark in `comment`) but never
    marked as its own in admin_comment (it stopped between the two requests): no pod was
    ever bound to it. A Slurm user who writes such a comment gets their own job cancelled."""
    if job.raw.get("admin_comment"):
        return False
    comment = placeholder.read_comment(str(job.raw.get("comment") or ""))
    return comment is not None and comment.made_by(config)


def lost_its_node(job: Job) -> bool:
    """A bound pod's job that no longer holds its node: pending again (requeued by an admin,
    or a slurmctld restart lost the allocation) or suspended."""
    return job.is_pending or job.is_suspended


def state_of(job: Job | None) -> str:
    if job is None:
        return "no longer known to Slurm"
    return "/".join(job.state) or "UNKNOWN"


class WorkloadSync:
    """The workload controller's reconciler; see the module docstring for its steps."""

    def __init__(
        self,
        kube: rest.Kube,
        *,
        config: BridgeConfig,
        pods: Informer,
        slurm: SlurmConnection,
        watch: JobWatch,
        recorder: events.EventRecorder,
    ) -> None:
        self.kube = kube
        self.config = config
        self.pods = pods
        self.slurm = slurm
        self.watch = watch
        self.recorder = recorder
        # Pod key -> (job id, UID) of pods deleted from the cache, until reconciled.
        self.gone: dict[str, tuple[int, str]] = {}
        # Jobs whose cancel is on its way: a group's pods ending together cancel it once.
        self.cancelling: set[int] = set()
        self.enqueue: Callable[[str], None] = lambda _key: None  # set by the controller
        # When the slurmctld the last sweep read the job list from started (`diag`).
        self.slurmctld_started: int | None = None
        # Pod key -> when it was first seen bound without its job-id label (`adopt`).
        self.unlabelled_since: dict[str, float] = {}

    async def reconcile(self, key: str) -> Result:
        if key.startswith(REVIVED_PREFIX):
            return await self.revived(int(key.removeprefix(REVIVED_PREFIX)))
        if key == ORPHANS_KEY:
            await self.sweep_if_restarted()
            return DONE
        if key.startswith(UNCONFIRMED_PREFIX):
            return await self.abandoned_allocation(int(key.removeprefix(UNCONFIRMED_PREFIX)))
        pod = self.pods.store.get(key)
        gone = self.gone.get(key)
        if gone is not None and (pod is None or pod["metadata"].get("uid") != gone[1]):
            # The deleted pod's job first: a new pod made under its name meanwhile (a
            # StatefulSet's) is another pod, reconciled below.
            await self.pod_gone(key)
        if pod is None:
            self.unlabelled_since.pop(key, None)
            return DONE
        job_id = podcontrol.job_id_of(pod)
        if job_id is None:
            if podcontrol.has_ended(pod) or podcontrol.is_deleting(pod):
                await podcontrol.remove_finalizer(self.kube, pod)
            return DONE
        if podcontrol.has_ended(pod) or (
            podcontrol.is_deleting(pod) and not podcontrol.node_of(pod)
        ):
            self.unlabelled_since.pop(key, None)
            if not podcontrol.has_finalizer(pod) and podcontrol.is_labelled(pod):
                # Settled: its job was cancelled before the finalizer went, or is left to
                # the group's other pods. A finished pod left in place (Job pods, `kubectl
                # run --restart=Never`) costs nothing. (One with the Binding's job id only
                # was never labelled: its job is cancelled all the same.)
                if not self.held_by_another(job_id, key) and not self.watch.is_following(job_id):
                    self.watch.untrack(job_id)  # (a cancelled job stays followed)
                return DONE
            return await self.pod_finished(pod, job_id)
        if podcontrol.is_deleting(pod):
            return DONE  # still running: the kubelet reports it terminal, which brings it back
        waiting = await self.adopt(pod, job_id)
        result = await self.job_ended(pod, job_id)
        return waiting if waiting is not None and result == DONE else result

    async def adopt(self, pod: JSON, job_id: int) -> Result | None:
        """A bound pod without its job-id label or the finalizer (its job id in the Binding's
        annotation): the scheduler writes both just after binding it; one still without them
        ADOPT_AFTER_S later (the write failed, or the scheduler stopped) gets them here, if
        the job is the pod's own. The result: when to look again
        (None: nothing to wait for)."""
        key = placeholder.pod_key(pod)
        if podcontrol.is_labelled(pod) and podcontrol.has_finalizer(pod):
            self.unlabelled_since.pop(key, None)
            return None
        now = time.monotonic()
        waited = now - self.unlabelled_since.setdefault(key, now)
        if waited < ADOPT_AFTER_S:
            return Result(requeue_after=ADOPT_AFTER_S - waited)
        job = await self.job(job_id)
        if job is not None and self.owns(job, key, placeholder.pod_uid(pod)):
            try:
                await podcontrol.mark_submitted(self.kube, pod, job_id)
            except (rest.ApiError, TransportError) as e:
                # Not this pass's only step (`job_ended` follows): tried again later.
                log.warning("pod %s: job-id label and finalizer not written (%s)", key, e)
                return Result(requeue_after=ADOPT_RETRY_S)
            log.info("pod %s: job-id label and finalizer written (job %d)", key, job_id)
        self.unlabelled_since.pop(key, None)
        return None

    async def job(self, job_id: int, *, track: bool = True) -> Job | None:
        """The job as last read by the watch, else as another watch of the process read it
        within RECENT_S, else read now; `track`: keep watching it (a running pod's job),
        not for a job about to be cancelled."""
        if track:
            self.watch.track(job_id)
        if self.watch.known(job_id):
            return self.watch.jobs[job_id]
        lent = self.watch.borrow(job_id, track=track)  # the scheduler read it just now?
        return lent if lent is not None else await self.watch.read(job_id)

    def held_by_another(self, job_id: int, key: str) -> bool:
        """Whether a pod other than `key` that carries the job id has not ended: the job is
        still followed for it. (Untracked, the running pod took the job back from a read
        the scheduler lent, told every pod of the job "changed", and the ended one untracked
        it again, round and round with nothing awaited: the event loop never turned.)"""
        return any(
            placeholder.pod_key(p) != key and not podcontrol.has_ended(p)
            for p in self.pods.store.by_index(BY_JOB, str(job_id))
        )

    def others_running(self, job: Job, key: str) -> bool:
        """Whether a pod of the job other than `key` still runs or waits to: one its
        admin_comment names (that very pod, by UID) that carries its job id or none yet. A
        pod that merely carries the job id in a label (anyone who may patch a pod can write
        one) never keeps the job alive."""
        comment = placeholder.read_comment(str(job.raw.get("admin_comment") or ""))
        for other, uid in (comment.pods if comment else {}).items():
            p = self.pods.store.get(other)
            if (
                other != key
                and p is not None
                and (not uid or p["metadata"].get("uid") == uid)
                and podcontrol.job_id_of(p) in (None, job.job_id)
                and not podcontrol.has_ended(p)
                and not podcontrol.is_deleting(p)
            ):
                return True
        return False

    def owns(self, job: Job | None, key: str, uid: str = "") -> bool:
        """Whether the job is this scheduler's placeholder for pod `key`, by its
        admin_comment: a job-id label alone (anyone who may patch the pod can set one)
        never gets a job cancelled or a pod deleted."""
        return job is not None and placeholder.job_is_for(job, self.config, key=key, uid=uid)

    async def cancel(
        self, job_id: int, key: str, why: str, uid: str = "", *, failed: bool = False
    ) -> None:
        """Cancel the job unless another pod of it still runs; `failed`: the pod failed,
        which ends a group's job whatever its other pods do."""
        if job_id in self.cancelling or self.watch.is_following(job_id):
            return  # cancelled by us already (or about to be): one DELETE per job
        # Read now, never taken from a cache: a slurmctld restarted since the last read may
        # have given the id to another user's job, in the same state.
        job = await self.watch.read(job_id)
        if job is None or job.is_finished:
            self.watch.untrack(job_id)
            return
        if not self.owns(job, key, uid):
            log.warning(
                "job %d: not cancelled (%s): its admin_comment does not name %s", job_id, why, key
            )
            self.watch.untrack(job_id)
            return
        if self.others_running(job, key) and not (failed and is_group_job(job)):
            return
        self.cancelling.add(job_id)
        try:
            await self.slurm.client.cancel_job(job_id)
        finally:
            self.cancelling.discard(job_id)
        self.slurm.informer.poke()
        self.watch.follow_cancelled(job_id)
        log.info("job %d: cancelled (%s)", job_id, why)
        if job.nodes:
            await self.nudge_slurm()

    async def nudge_slurm(self) -> None:
        """A cancelled job freed its node: Slurm is nudged into a scheduling pass through
        one pending job of ours (see `nudge`). A job the watch last saw pending may have
        started since (a pass that ran just before this node was freed): the next one is
        tried, up to NUDGE_TRIES; without a nudge the node would wait for Slurm's periodic
        pass (the hand-over bench saw a node idle 7 s)."""
        tries = 0
        for job_id, job in list(self.watch.jobs.items()):
            if job is None or not job.is_pending:
                continue
            comment = str(job.raw.get("admin_comment") or "")
            if placeholder.read_comment(comment) is None:
                continue
            if await nudge(self.slurm.client, job_id, comment):
                return
            tries += 1
            if tries >= NUDGE_TRIES:
                return

    # ------------------------------------------------------------ 1. pod gone

    async def pod_gone(self, key: str) -> None:
        gone = self.gone.get(key)
        if gone is not None:
            job_id, uid = gone
            # Forgotten only once cancelled: a failed cancel is retried with the key.
            await self.cancel(job_id, key, f"pod {key} was deleted", uid)
            self.gone.pop(key, None)

    # ------------------------------------------------------------ 2. pod finished

    async def pod_finished(self, pod: JSON, job_id: int) -> Result:
        key = placeholder.pod_key(pod)
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if not podcontrol.is_terminal(pod) and podcontrol.containers_ended(pod):
            phase = "ended (every container exited)"
        why = f"pod {key} is {phase}" + (" and deleted" if podcontrol.is_deleting(pod) else "")
        await self.cancel(
            job_id,
            key,
            why,
            str(pod["metadata"].get("uid") or ""),
            failed=podcontrol.ended_failed(pod),
        )
        await podcontrol.remove_finalizer(self.kube, pod)
        return DONE

    # ------------------------------------------------------------ 3. job ended

    async def job_ended(self, pod: JSON, job_id: int) -> Result:
        job = await self.job(job_id)
        bound = bool(podcontrol.node_of(pod))
        if job is None and not bound:
            return DONE  # lost by slurmctld before the pod started: the scheduler resubmits
        key, uid = placeholder.pod_key(pod), placeholder.pod_uid(pod)
        if bound and job is not None and placeholder.names_another_pod(job, key=key, uid=uid):
            # The id now names a job that is not the pod's: slurmctld restarted from state
            # saved before the pod's job and gave the id to a new one. The pod's own job
            # is gone (as if Slurm no longer knew it); the other job is never touched.
            fresh = await self.watch.read(job_id)
            if fresh is not None and placeholder.names_another_pod(fresh, key=key, uid=uid):
                return await self.lost_to_another_job(pod, job_id)
            job = fresh
        if job is not None and not job.is_finished and not (bound and lost_its_node(job)):
            return DONE
        if job is not None and not job.is_finished:
            # The cached read may predate the allocation this pod was bound on: only a
            # fresh one may say the job lost its node.
            job = await self.watch.read(job_id)
            if job is not None and not job.is_finished and not lost_its_node(job):
                return DONE
        if job is not None and not self.owns(job, key, uid):
            self.recorder.event(
                pod,
                events.WARNING,
                "NotBridgeJob",
                f"Slurm job {job_id} in label {SLURM_JOBID} is not this pod's placeholder job; "
                "the pod is left alone",
            )
            return DONE
        if not await self.still_names(pod, job_id):
            # Relabelled with a new job (the scheduler replaced this one), or a group pod set
            # free of a cancelled pending job: it waits again.
            return DONE
        state = state_of(job)
        message = f"Slurm job {job_id} is {state}: deleting the pod"
        if job is not None and not job.is_finished:
            message = (
                f"Slurm job {job_id} is {state}: it no longer holds node "
                f"{podcontrol.node_of(pod)}, where the pod runs; deleting the pod (its job "
                "is cancelled once the pod stopped)"
            )
        return await self.delete_pod(pod, message)

    async def lost_to_another_job(self, pod: JSON, job_id: int) -> Result:
        """A bound pod whose job id names another job now: it runs where no job of its own
        holds the node, so it goes, as when Slurm lost its job (its job was Slurm's loss;
        nothing is cancelled: the job under that id is someone else's)."""
        if not await self.still_names(pod, job_id):
            return DONE  # relabelled meanwhile
        return await self.delete_pod(
            pod,
            f"Slurm job {job_id} is no longer this pod's (slurmctld restarted from older saved "
            "state and gave the id to another job): its own job is gone; deleting the pod",
        )

    async def delete_pod(self, pod: JSON, message: str) -> Result:
        """The pod runs without a job of its own: it goes, and says why (SlurmJobEnded)."""
        log.info("pod %s: %s", placeholder.pod_key(pod), message)
        self.recorder.event(pod, events.WARNING, "SlurmJobEnded", message, action="Delete")
        await podcontrol.delete(self.kube, pod)
        return DONE

    async def still_names(self, pod: JSON, job_id: int) -> bool:
        """Whether the live pod still carries `job_id` (the cache may lag a relabelling by
        the scheduler, which replaces a job before cancelling it, or the freeing of a group
        pod from a cancelled pending job): one read, only before a deletion."""
        name, ns, uid = podcontrol.name_ns_uid(pod)
        live = await podcontrol.live(self.kube, name, ns)
        return (
            live is not None
            and live["metadata"].get("uid") == uid
            and podcontrol.job_id_of(live) == job_id
        )

    # ------------------------------------------------------------ 4. revived

    async def revived(self, job_id: int) -> Result:
        """A job we cancelled is live again (slurmctld crashed after acknowledging the
        cancel and came back from state saved before it): cancelled again when it is ours
        and no pod of it still runs."""
        job = await self.watch.read(job_id)
        if job is None or job.is_finished:
            return DONE
        comment = placeholder.read_comment(str(job.raw.get("admin_comment") or ""))
        if comment is None or not comment.made_by(self.config):
            return DONE
        for key, uid in comment.pods.items():
            pod = await self.live_pod(key, uid)
            if pod is not None and not podcontrol.has_ended(pod):
                return DONE  # its pod runs (or waits): the job is its, not an orphan
        await self.slurm.client.cancel_job(job_id)
        self.slurm.informer.poke()
        self.watch.follow_cancelled(job_id)
        log.warning(
            "job %d: cancelled again: Slurm brought it back after it was cancelled (its pods %s "
            "are gone or finished)",
            job_id,
            sorted(comment.pods),
        )
        if job.nodes:
            await self.nudge_slurm()
        return DONE

    async def abandoned_allocation(self, job_id: int) -> Result:
        """A job allocated as its user and never marked as ours (`unconfirmed`), found at
        start: cancelled once it is UNCONFIRMED_GRACE_S old and still unmarked (a scheduler
        may be marking it this moment; one that died between the two requests never will).
        No pod was ever bound to it."""
        job = await self.watch.read(job_id)
        if job is None or job.is_finished or not unconfirmed(job, self.config):
            return DONE
        submitted = number(job.raw.get("submit_time")) or 0
        age = time.time() - submitted
        if age < UNCONFIRMED_GRACE_S:
            return Result(requeue_after=UNCONFIRMED_GRACE_S - age)
        await self.slurm.client.cancel_job(job_id)
        log.info("job %d: cancelled: allocated %.0fs ago, never marked as ours", job_id, age)
        return DONE

    # ------------------------------------------------------------ start-up

    async def slurmctld_start(self) -> int | None:
        """When slurmctld started (`diag`'s req_time_start: its statistics start with it,
        and again when an admin resets them); None when it does not say."""
        return await self.slurm.slurmctld.get(SWEEP_START_AGE_S)

    async def sweep_if_restarted(self) -> None:
        """`ORPHANS_KEY`: the sweep (`cancel_orphans`), when slurmctld started since the
        last one or cannot tell. slurmctld returns its node list whenever a node changed,
        which in a burst is every poll: a full job list each time was 3.6 s of slurmrestd
        in a 500-pod burst; one small request tells whether it is needed."""
        started = await self.slurmctld_start()
        if started is not None and started == self.slurmctld_started:
            return
        await self._sweep(started)

    async def cancel_orphans(self) -> int:
        """Cancel live jobs of ours whose pods are all gone or ended (one full read of the
        job list): at start, and (`ORPHANS_KEY`) at most every ORPHAN_SWEEP_S after
        slurmctld returned the node list, if it started again meanwhile: a job cancelled
        before a kill -9 may be back, its pods ended long ago and no process following it.
        Returns how many were cancelled."""
        return await self._sweep(await self.slurmctld_start())

    async def _sweep(self, started: int | None) -> int:
        """`cancel_orphans`, for the slurmctld that started at `started` (as told)."""
        jobs, _ = await self.slurm.client.list_jobs()
        cancelled = 0
        for job in jobs or []:
            if job.is_finished:
                continue
            if unconfirmed(job, self.config):
                self.enqueue(f"{UNCONFIRMED_PREFIX}{job.job_id}")  # see abandoned_allocation
                continue
            comment = placeholder.read_comment(str(job.raw.get("admin_comment") or ""))
            if comment is None or not comment.made_by(self.config):
                continue
            if [key for key, uid in comment.pods.items() if await self.holds(key, uid)]:
                continue
            await self.slurm.client.cancel_job(job.job_id)
            self.watch.follow_cancelled(job.job_id)
            log.info(
                "job %d: cancelled: its pods %s are gone or ended", job.job_id, list(comment.pods)
            )
            cancelled += 1
        # Only a sweep that went through counts: one that failed is made again next time.
        self.slurmctld_started = started
        return cancelled

    async def holds(self, key: str, uid: str) -> bool:
        """Whether the pod (that very one, when the UID is known) exists and has not ended:
        it may still need its job."""
        pod = await self.live_pod(key, uid)
        return pod is not None and not podcontrol.has_ended(pod)

    async def live_pod(self, key: str, uid: str) -> JSON | None:
        """The pod (that very one, when the UID is known), or None; asks the apiserver when
        the cache says no, as the cache may lag a pod created a moment ago."""
        cached = self.pods.store.get(key)
        if cached is not None and (not uid or cached["metadata"].get("uid") == uid):
            return cached
        ns, _, name = key.partition("/")
        live = await podcontrol.live(self.kube, name, ns)
        if live is None or (uid and live["metadata"].get("uid") != uid):
            return None
        return live
