"""What `helm uninstall` of the bridge runs first (a pre-delete hook Job). Finished pods the
running bridge has not settled yet (cancelled their placeholder jobs, then taken its
finalizer off) are waited for, a minute at most: stopped a moment after a pod ended, the
bridge would leave that pod's job RUNNING in Slurm with no end, holding its node. The
bridge's scheduler and controllers are stopped next (their Deployments deleted, their pods waited
for: a running node controller would taint the nodes again), then the marks the bridge put
on objects Helm does not own are taken off, so nothing of the bridge is left behind where it
would get in the way:

- the bridge's `NoExecute` taint (`slinky.slurm.net/managed-node=<scheduler name>`) on the
  Nodes it managed: left there, it keeps every other pod off those nodes for good;
- the bridge's finalizer on pods: left there, a pod deleted later stays Terminating for ever.

What it does not touch, and says so in its output: the pods themselves (they run on; their
placeholder jobs stay in Slurm until the pods end, then Slurm's own time limit or an admin's
`scancel` ends them), the label that chose the managed nodes (the admin's), and the Slurm
nodes the bridge registered (the hook holds no Slurm credentials: `scontrol delete
nodename=...` removes them).

    python -m slinky.bridge.uninstall --scheduler-name=slurm-bridge-scheduler \
        --namespace=slurm --deployments=x-scheduler,x-controllers --pods-selector=...
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from slinky.bridge import podcontrol
from slinky.bridge.labels import FINALIZER, MANAGED_NODE_TAINT
from slinky.kube import flags, rest
from slinky.types import JSON


def without_our_taint(node: JSON, scheduler_name: str) -> list[JSON] | None:
    """The node's taints less the bridge's own, or None when it has none of ours."""
    taints = list((node.get("spec") or {}).get("taints") or [])
    kept = [
        t
        for t in taints
        if not (t.get("key") == MANAGED_NODE_TAINT and t.get("value") == scheduler_name)
    ]
    return None if len(kept) == len(taints) else kept


async def untaint_nodes(kube: rest.Kube, scheduler_name: str) -> list[str]:
    """Take the bridge's taint off every Node; the names of those it was on."""
    done = []
    for node in (await kube.list(rest.NODES))["items"]:
        kept = without_our_taint(node, scheduler_name)
        if kept is None:
            continue
        name = str(node["metadata"]["name"])
        taints = node["spec"]["taints"]
        # The test makes it apply only to the taints read (a changed list: read again).
        patch = [
            {"op": "test", "path": "/spec/taints", "value": taints},
            {"op": "replace", "path": "/spec/taints", "value": kept},
        ]
        try:
            await kube.patch(rest.NODES, name, patch, kind="json")
        except rest.ApiError as e:
            if e.not_found:
                continue
            raise
        done.append(name)
    return done


async def release_pods(kube: rest.Kube, scheduler_name: str) -> list[str]:
    """Take the bridge's finalizer off the pods of this bridge (their schedulerName: another
    bridge's pods keep theirs); their keys. A finished pod among them (it ended after the
    settling wait) is printed with its job: nothing cancels that job now."""
    done = []
    params = {"fieldSelector": f"spec.schedulerName={scheduler_name}"}
    for pod in (await kube.list(rest.PODS, params=params))["items"]:
        meta = pod["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if FINALIZER not in finalizers:
            continue
        if (pod.get("spec") or {}).get("schedulerName") != scheduler_name:
            continue
        i = finalizers.index(FINALIZER)
        patch = [
            {"op": "test", "path": f"/metadata/finalizers/{i}", "value": FINALIZER},
            {"op": "remove", "path": f"/metadata/finalizers/{i}"},
        ]
        try:
            await kube.patch(rest.PODS, meta["name"], patch, meta["namespace"], kind="json")
        except rest.ApiError as e:
            if e.not_found:
                continue
            raise
        done.append(f"{meta['namespace']}/{meta['name']}")
        if unsettled(pod, scheduler_name):
            print(f"finished pod {with_job(pod)} was not settled: scancel its job", flush=True)
    return done


def unsettled(pod: JSON, scheduler_name: str) -> bool:
    """A finished pod of this bridge whose placeholder job the bridge has not cancelled yet
    (it takes its finalizer off after the cancel)."""
    return (
        podcontrol.has_finalizer(pod)
        and (pod.get("spec") or {}).get("schedulerName") == scheduler_name
        and podcontrol.has_ended(pod)
    )


def with_job(pod: JSON) -> str:
    meta = pod["metadata"]
    job = podcontrol.job_id_of(pod) or "?"
    return f"{meta['namespace']}/{meta['name']} (job {job})"


async def settle_finished_pods(
    kube: rest.Kube, scheduler_name: str, *, timeout: float = 60.0, interval: float = 1.0
) -> list[str]:
    """Wait until the running bridge has settled every finished pod of its own; those still
    unsettled at the deadline, as `namespace/name (job N)`."""
    deadline = time.monotonic() + timeout
    params = {"fieldSelector": f"spec.schedulerName={scheduler_name}"}
    while True:
        pods = (await kube.list(rest.PODS, params=params))["items"]
        left = [p for p in pods if unsettled(p, scheduler_name)]
        if not left or time.monotonic() >= deadline:
            break
        await asyncio.sleep(interval)
    out = [with_job(p) for p in left]
    if out:
        print(
            f"finished pods the bridge did not settle within {timeout:.0f}s (their placeholder "
            "jobs may still run: scancel them): " + ", ".join(out),
            flush=True,
        )
    else:
        print("every finished bridge pod settled (its placeholder job cancelled)", flush=True)
    return out


async def stop_bridge(
    kube: rest.Kube,
    namespace: str,
    deployments: list[str],
    pods_selector: str,
    *,
    timeout: float = 300.0,
    interval: float = 1.0,
) -> None:
    """Delete the Deployments and wait until no pod matches `pods_selector`."""
    for name in deployments:
        try:
            await kube.delete(rest.DEPLOYMENTS, name, namespace)
        except rest.ApiError as e:
            if not e.not_found:
                raise
    deadline = time.monotonic() + timeout
    while True:
        params = {"labelSelector": pods_selector}
        left = (await kube.list(rest.PODS, namespace, params=params))["items"]
        if not left:
            break
        if time.monotonic() > deadline:
            names = ", ".join(p["metadata"]["name"] for p in left)
            raise TimeoutError(f"bridge pods still there after {timeout:.0f}s: {names}")
        await asyncio.sleep(interval)
    print(f"stopped: {', '.join(deployments) or 'nothing'}", flush=True)


async def run(kube: rest.Kube, scheduler_name: str, attempts: int = 5) -> None:
    for attempt in range(attempts):
        try:
            nodes = await untaint_nodes(kube, scheduler_name)
            pods = await release_pods(kube, scheduler_name)
            break
        except rest.ApiError as e:
            # 409, or 422: a JSON patch's test failed (the object changed since the list).
            if e.code not in (409, 422) or attempt == attempts - 1:
                raise
    print(f"taint {MANAGED_NODE_TAINT}={scheduler_name} removed from {len(nodes)} nodes: "
          + (", ".join(nodes) or "none"), flush=True)  # fmt: skip
    print(f"finalizer {FINALIZER} removed from {len(pods)} pods: " + (", ".join(pods) or "none"),
          flush=True)  # fmt: skip
    print(
        "left in place: running bridge pods (their Slurm placeholder jobs end with them or "
        "with scancel), the label that chose the managed nodes, and the Slurm nodes the bridge "
        "registered (scontrol delete nodename=<node>)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slinky.bridge.uninstall", description=__doc__)
    p.add_argument("--scheduler-name", default="slurm-bridge-scheduler")
    p.add_argument("--namespace", default="", help="namespace of the bridge's Deployments")
    p.add_argument("--deployments", default="", help="comma-separated Deployments to stop")
    p.add_argument("--pods-selector", default="", help="label selector of their pods")
    p.add_argument(
        "--settle-timeout",
        default="60s",
        type=flags.parse_duration,
        help="how long to wait for the running bridge to cancel the placeholder jobs of pods "
        "that already finished (Go duration)",
    )
    p.add_argument("--kubeconfig", default=None)
    args = p.parse_args(argv)
    deployments = [d for d in args.deployments.split(",") if d]

    async def go() -> int:
        try:
            kube = rest.Kube.from_kubeconfig(args.kubeconfig)
        except ValueError as e:
            print(f"cannot start: {e}", file=sys.stderr)
            return 2
        try:
            if deployments:
                await settle_finished_pods(kube, args.scheduler_name, timeout=args.settle_timeout)
                await stop_bridge(kube, args.namespace, deployments, args.pods_selector)
            await run(kube, args.scheduler_name)
        finally:
            await kube.close()
        return 0

    return asyncio.run(go())


if __name__ == "__main__":
    sys.exit(main())
