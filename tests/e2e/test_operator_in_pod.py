"""slurm-operator deployed as users deploy it: a pod from the Slinky image on a real node,
in-cluster configuration (its ServiceAccount, bound to config/rbac), reaching slurmrestd and
slurmctld at addresses pods reach. It runs a NodeSet whose slurmd pods take a job."""

from __future__ import annotations

import pytest

from slinky.kube import rest
from slinky.operator.resources import CLUSTERS, NODESETS
from slinky_testbed import nodes
from slinky_testbed.waiting import wait_for
from tests.e2e.nodeset_fixtures import Env, nodeset_manifest, wait_idle_nodes
from tests.e2e.operator_fixtures import OPERATOR_NS, cluster, condition

pytestmark = pytest.mark.e2e

DEPLOYMENTS = rest.DEPLOYMENTS


def operator_deployment(name: str, watch: str) -> dict[str, object]:
    labels = {"app.kubernetes.io/name": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": "slurm-operator",
                    "containers": [
                        {
                            "name": "operator",
                            "image": nodes.image_ref("slinky"),
                            "imagePullPolicy": "IfNotPresent",
                            "args": [
                                "slurm-operator",
                                f"--namespace={watch}",
                                # Its own Lease: the session's operator process is stopped
                                # meanwhile but may still hold the shared one.
                                f"--leader-election-id={name}.slinky.slurm.net",
                                "--metrics-bind-address=:8080",
                                "--health-probe-bind-address=:8081",
                            ],
                            "readinessProbe": {
                                "httpGet": {"path": "/readyz", "port": 8081},
                                "periodSeconds": 2,
                            },
                        }
                    ],
                },
            },
        },
    }


async def test_operator_in_a_pod_runs_a_nodeset_with_in_cluster_config(env: Env) -> None:
    kube, ns = env.kube, env.namespace
    # The session's operator process would act on the same objects: stop it meanwhile.
    env.operator.kill()
    try:
        await kube.create(DEPLOYMENTS, operator_deployment("op-in-pod", ns), OPERATOR_NS)

        async def ready() -> bool:
            got = await kube.get(DEPLOYMENTS, "op-in-pod", OPERATOR_NS)
            return (got.get("status") or {}).get("readyReplicas") == 1

        await wait_for(ready, timeout=120, interval=0.5, what="operator pod Ready")
        host, port = env.testbed.slurmctld_addr.split(":")
        await kube.create(
            CLUSTERS,
            cluster(
                "inpod",
                env.testbed.slurm_rest_url_for_pods,
                username="root",
                jwtKeyRef={"name": "slurm-jwt"},
                controller={"host": host, "port": int(port)},
            ),
            ns,
        )

        async def connected() -> bool:
            got = await kube.get(CLUSTERS, "inpod", ns)
            return condition(got).get("reason") == "Connected"

        await wait_for(connected, timeout=60, what="Cluster connected from the pod")
        manifest = nodeset_manifest("podop", 1)
        manifest["spec"]["clusterName"] = "inpod"
        await kube.create(NODESETS, manifest, ns)
        await wait_idle_nodes(env, "podop", 1, timeout=120)
        job = await env.submit("podop", 1)

        async def completed() -> bool:
            return "COMPLETED" in await env.job_state(job)

        await wait_for(completed, timeout=60, what=f"job {job} COMPLETED")
        await env.scale("podop", 0)

        async def empty() -> bool:
            return not await env.pods("podop")

        await wait_for(empty, timeout=60, what="NodeSet scaled in by the operator pod")
        assert await env.slurm_node("podop-0") is None
    finally:
        await kube.delete(DEPLOYMENTS, "op-in-pod", OPERATOR_NS)
        await env.operator.restart()
