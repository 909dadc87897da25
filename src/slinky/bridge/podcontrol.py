"""Kubernetes-side effects of the scheduler and the workload controller on pods, each one
request, each safe to repeat. Every write names the pod's UID, so a pod deleted and created
again under the same name is never changed on behalf of the old one."""

from __future__ import annotations

import logging

from slinky.bridge.labels import FINALIZER, SLURM_JOBID, SLURM_JOBID_ANNOTATION, SLURM_NODE
from slinky.kube import conditions, rest
from slinky.transport import TransportError
from slinky.types import JSON

log = logging.getLogger(__name__)

POD_SCHEDULED = "PodScheduled"
TERMINAL_PHASES = ("Succeeded", "Failed")


def name_ns_uid(pod: JSON) -> tuple[str, str, str]:
    meta = pod["metadata"]
    return str(meta["name"]), str(meta["namespace"]), str(meta["uid"])


def job_id_of(pod: JSON) -> int | None:
    """The placeholder job id: on a bound pod, the annotation its Binding carried (it cannot
    change once bound; a label anyone may have written before the binding can differ), else
    the label; None when absent or not a number."""
    meta = pod.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(SLURM_JOBID_ANNOTATION) if node_of(pod) else None
    if text is None:
        text = (meta.get("labels") or {}).get(SLURM_JOBID)
    return int(text) if text is not None and str(text).isdigit() else None


def is_labelled(pod: JSON) -> bool:
    """The pod carries the job-id label naming its job (on a bound pod, the job its Binding
    named, when the Binding named one), not only the Binding's annotation."""
    meta = pod.get("metadata") or {}
    label = (meta.get("labels") or {}).get(SLURM_JOBID)
    if label is None:
        return False
    bound = (meta.get("annotations") or {}).get(SLURM_JOBID_ANNOTATION) if node_of(pod) else None
    return bound is None or bound == label


def is_terminal(pod: JSON) -> bool:
    """The kubelet reported the pod's phase terminal: it no longer counts the pod at all."""
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def _terminated(statuses: list[JSON] | None, name: str) -> JSON | None:
    for s in statuses or []:
        if s.get("name") == name:
            return ((s.get("state") or {}).get("terminated")) or None
    return None


def containers_ended(pod: JSON) -> bool:
    """Every container of the pod has ended and none will run again (restartPolicy Never,
    or OnFailure with every exit code 0; sidecars ended too). The kubelet reports this
    about a second before the terminal phase, which it writes only once it has torn down
    the pod's sandbox. A container with restart rules of its own is left to the phase."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    policy = spec.get("restartPolicy") or "Always"
    containers = spec.get("containers") or []
    if policy == "Always" or not containers:
        return False
    if any(c.get("restartPolicy") or c.get("restartPolicyRules") for c in containers):
        return False
    for c in containers:
        ended = _terminated(status.get("containerStatuses"), str(c.get("name")))
        if ended is None or (policy == "OnFailure" and ended.get("exitCode") != 0):
            return False
    return all(
        _terminated(status.get("initContainerStatuses"), str(c.get("name"))) is not None
        for c in spec.get("initContainers") or []
        if c.get("restartPolicy") == "Always"
    )


def has_ended(pod: JSON) -> bool:
    """Terminal, or its containers have all ended for good (`containers_ended`): nothing of
    it runs any more, so its Slurm job is no longer needed."""
    return is_terminal(pod) or containers_ended(pod)


def ended_failed(pod: JSON) -> bool:
    """The pod failed: phase Failed, or its containers ended and one exited non-zero."""
    if is_terminal(pod):
        return (pod.get("status") or {}).get("phase") == "Failed"
    if not containers_ended(pod):
        return False
    return any(
        ((s.get("state") or {}).get("terminated") or {}).get("exitCode") != 0
        for s in (pod.get("status") or {}).get("containerStatuses") or []
    )


def is_deleting(pod: JSON) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def node_of(pod: JSON) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def has_finalizer(pod: JSON) -> bool:
    return FINALIZER in ((pod.get("metadata") or {}).get("finalizers") or [])


async def live(kube: rest.Kube, name: str, ns: str) -> JSON | None:
    """The pod as the apiserver has it now (not the cache, which may lag); None when gone."""
    try:
        return await kube.get(rest.PODS, name, ns)
    except rest.ApiError as e:
        if e.not_found:
            return None
        raise


async def mark_submitted(kube: rest.Kube, pod: JSON, job_id: int) -> JSON:
    """Label the pod with its job id and add the finalizer (strategic merge appends it);
    the pod as the apiserver answered (the informer may show it a moment later)."""
    name, ns, uid = name_ns_uid(pod)
    return await kube.patch(
        rest.PODS,
        name,
        {
            "metadata": {
                "uid": uid,
                "labels": {SLURM_JOBID: str(job_id)},
                "finalizers": [FINALIZER],
            }
        },
        ns,
        kind="strategic",
    )


async def label_bound(kube: rest.Kube, pod: JSON, job_id: int) -> None:
    """The job-id label and the finalizer, on a pod bound with the job id in its Binding
    (`mark_submitted`). Not written (the apiserver failed): the workload controller writes
    them when it finds them missing; a pod gone meanwhile needs neither."""
    name, ns, _ = name_ns_uid(pod)
    try:
        await mark_submitted(kube, pod, job_id)
    except (rest.ApiError, TransportError) as e:
        if not (isinstance(e, rest.ApiError) and e.not_found):
            log.warning("pod %s/%s: bound, but its job-id label not written (%s)", ns, name, e)


async def bind(kube: rest.Kube, pod: JSON, node: str, slurm_node: str, job_id: int) -> None:
    """Bind the pod to `node`; the Binding's annotations are copied onto the pod by the
    apiserver, so the Slurm node and job id annotations cost no request of their own."""
    name, ns, uid = name_ns_uid(pod)
    await kube.request(
        "POST",
        rest.PODS.path(ns, name, "binding"),
        body={
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": uid,
                "annotations": {SLURM_NODE: slurm_node, SLURM_JOBID_ANNOTATION: str(job_id)},
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
    )


async def set_unschedulable(kube: rest.Kube, pod: JSON, reason: str, message: str) -> bool:
    """PodScheduled=False with `reason` and `message` (no write when already so). True
    when written."""
    current = (pod.get("status") or {}).get("conditions") or []
    updated, changed = conditions.set_condition(
        current, POD_SCHEDULED, False, reason=reason, message=message
    )
    if not changed:
        return False
    name, ns, uid = name_ns_uid(pod)
    condition = conditions.find(updated, POD_SCHEDULED)
    await kube.patch(
        rest.PODS,
        name,
        {"metadata": {"uid": uid}, "status": {"conditions": [condition]}},
        ns,
        subresource="status",
        kind="strategic",
    )
    return True


async def remove_finalizer(kube: rest.Kube, pod: JSON) -> None:
    """Remove the bridge's finalizer; the `test` makes a concurrent change fail (422) rather
    than remove someone else's finalizer. The cached pod may be behind (the finalizer gone
    already, or the list changed): on a failed test the live pod is read and tried once."""
    name, ns, uid = name_ns_uid(pod)
    for attempt in range(2):
        finalizers = list((pod.get("metadata") or {}).get("finalizers") or [])
        if FINALIZER not in finalizers:
            return
        i = finalizers.index(FINALIZER)
        try:
            await kube.patch(
                rest.PODS,
                name,
                [
                    {"op": "test", "path": f"/metadata/finalizers/{i}", "value": FINALIZER},
                    {"op": "remove", "path": f"/metadata/finalizers/{i}"},
                ],
                ns,
                kind="json",
            )
            return
        except rest.ApiError as e:
            if e.not_found:
                return
            if e.code != 422 or attempt:
                raise
        try:
            pod = await kube.get(rest.PODS, name, ns)
        except rest.ApiError as e:
            if e.not_found:
                return
            raise
        if pod["metadata"].get("uid") != uid:
            return  # gone, and another pod of the same name in its place


async def delete(kube: rest.Kube, pod: JSON) -> None:
    name, ns, uid = name_ns_uid(pod)
    try:
        await kube.delete(rest.PODS, name, ns, uid=uid)
    except rest.ApiError as e:
        if not (e.not_found or e.conflict):
            raise
