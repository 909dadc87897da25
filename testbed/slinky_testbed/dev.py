"""The host-run environment: on a running test bed, install the CRDs, start slurm-operator in
the background, and create a sample Cluster and NodeSet whose slurmd pods join the test bed's
own Slurm (slurmctld run on the host, slurmconf.py); the NodeSet has its own partition and an
HPA on its pending jobs (the operator serves external.metrics.k8s.io). The bridge runs as a
process too (dev_bridge). What the monitoring e2e test, the chaos soak and the budget bench
run (`python -m slinky_testbed.dev`): the operator and the bridge alone, faster to start
and to kill than the charts' pods. `make dev` installs the charts instead (dev_site).
Idempotent: running it again keeps what is there and what others changed (the HPA's
replicas, a person's edits)."""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from slinky_testbed import dev_bridge, metricsapi, paths, pods, procs
from slinky_testbed.bed import ADMIN_USER, Testbed

NAMESPACE = "slurm"
EXTERNAL = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}"
REPO = Path(__file__).resolve().parents[2]


def run_kubectl(
    bed: Testbed, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(paths.bin_dir() / "kubectl"), f"--kubeconfig={bed.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )


def kubectl(bed: Testbed, *args: str, stdin: str | None = None) -> str:
    out = run_kubectl(bed, *args, stdin=stdin)
    if out.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout


# The field manager of the samples. Applied without --force-conflicts: a field another
# manager took (the HPA's replicas, a person's `kubectl edit`) is never taken back.
FIELD_MANAGER = "slinky-dev"
REPLICAS = ".spec.replicas"


def for_reapply(obj: dict[str, Any], live: dict[str, Any] | None) -> dict[str, Any]:
    """The manifest `make dev` applies for sample `obj` when `live` is what the API server
    holds (None: not there yet). A NodeSet's replicas are the sample's only at creation;
    afterwards the HPA (or a person's `kubectl scale`) sets them, so a rerun applies the live
    value: an equal value shares the field with its owner and changes nothing, where the
    sample's 2 would conflict with the HPA's field manager (or, forced, undo its decision)."""
    if obj.get("kind") != "NodeSet" or live is None:
        return obj
    replicas = (live.get("spec") or {}).get("replicas")
    spec = dict(obj["spec"])
    if replicas is None:
        spec.pop("replicas", None)
    else:
        spec["replicas"] = replicas
    return {**obj, "spec": spec}


def conflicting_fields(stderr: str) -> list[str] | None:
    """The fields a refused server-side apply names (kubectl's "Apply failed with N
    conflict(s): conflict with "manager" ...: .spec.x" or one "- .spec.x" line per field);
    None when the failure is not a conflict."""
    if "Apply failed with" not in stderr:
        return None
    return re.findall(r"(?:: |^- )(\.\S+)\s*$", stderr, re.M)


def _live(bed: Testbed, obj: dict[str, Any]) -> dict[str, Any] | None:
    meta = obj["metadata"]
    ref = f"{obj['kind'].lower()}.{obj['apiVersion'].split('/')[0]}/{meta['name']}"
    out = kubectl(bed, "get", "-n", meta["namespace"], ref, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def apply_sample(bed: Testbed, obj: dict[str, Any]) -> None:
    """Server-side apply one sample object without force. A conflict means someone changed a
    field the sample sets: their value stays and a line says so. Only the NodeSet's replicas
    are read first (see for_reapply), again if the HPA moved them between read and apply."""
    what = f"{obj['kind']} {obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
    for _ in range(5):
        manifest = for_reapply(obj, _live(bed, obj)) if obj["kind"] == "NodeSet" else obj
        args = ("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", "-")
        out = run_kubectl(bed, *args, stdin=yaml.safe_dump(manifest))
        if out.returncode == 0:
            return
        fields = conflicting_fields(out.stderr)
        if fields is None:
            raise SystemExit(f"kubectl apply of {what} failed:\n{out.stderr}")
        if fields != [REPLICAS] or obj["kind"] != "NodeSet":
            first = out.stderr.split("Please review")[0].strip()
            print(f"kept {what} as it is (a field the sample sets was changed since): {first}")
            return
    raise SystemExit(f"{what}: its replicas kept changing while `make dev` applied it")


# The username the policy below never refuses: the operator's. The chart's policy names the
# operator's ServiceAccount; `make dev` runs the operator as a process with the test bed's
# admin credentials.
OPERATOR_USERNAME = "system:serviceaccount:slinky-system:slurm-operator"


def busy_pod_policy() -> list[dict[str, object]]:
    """config/policy/ (a busy slurmd pod refuses a plain DELETE) for `make dev`'s operator,
    which acts as the test bed's admin: try it with `kubectl --as=someone
    --as-group=system:masters delete pod ...` (the admin itself passes, as the operator)."""
    text = (REPO / "config" / "policy" / "busy_pod_deletion.yaml").read_text()
    return list(yaml.safe_load_all(text.replace(OPERATOR_USERNAME, ADMIN_USER)))


def sample_objects(bed: Testbed) -> list[dict[str, object]]:
    host, port = bed.slurmctld_addr.split(":")
    key = base64.b64encode(bed.jwt_key_path.read_bytes()).decode()
    labels = {"app.kubernetes.io/instance": "compute"}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "slurm-jwt", "namespace": NAMESPACE},
            "data": {"jwt_hs256.key": key},
        },
        pods.slurm_key_secret(bed, NAMESPACE),
        {
            "apiVersion": "slinky.slurm.net/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": "slurm", "namespace": NAMESPACE},
            "spec": {
                "server": bed.slurm_rest_url,
                "username": "root",
                "jwtKeyRef": {"name": "slurm-jwt"},
                "controller": {"host": host, "port": int(port)},
            },
        },
        {
            "apiVersion": "slinky.slurm.net/v1alpha1",
            "kind": "NodeSet",
            "metadata": {"name": "compute", "namespace": NAMESPACE},
            "spec": {
                "clusterName": "slurm",
                "replicas": 2,
                "partition": {"enabled": True, "config": "MaxTime=60"},
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    # As the slurm chart's default: a slurmd pod deleted in the moment
                    # between a job's start and the operator's next look (the busy label
                    # not on it yet, so the policy let the delete through) waits in its
                    # preStop for that job (MaxTime 60) instead of killing it after 10 s.
                    "spec": pods.slurmd_pod_spec(["--conf", "CPUs=2 RealMemory=1000"], grace_s=300),
                },
            },
        },
        sample_hpa(),
        *busy_pod_policy(),
    ]


def sample_hpa() -> dict[str, object]:
    """Pending jobs' nodes of partition `compute` → replicas, 0 to 4, back to 0 after 30s."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "compute", "namespace": NAMESPACE},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "slinky.slurm.net/v1alpha1",
                "kind": "NodeSet",
                "name": "compute",
            },
            "minReplicas": 0,
            "maxReplicas": 4,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {
                            "name": "slurm_nodeset_jobs_pending_nodes",
                            "selector": {"matchLabels": {"nodeset": "compute"}},
                        },
                        "target": {"type": "AverageValue", "averageValue": "1"},
                    },
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 30}},
        },
    }


def operator_running(bed: Testbed) -> bool:
    pid = bed.load().pids.get("operator")
    return pid is not None and procs.Proc(pid[0], pid[1]).alive()


def start_operator(bed: Testbed) -> tuple[int, int]:
    mport, pport = procs.free_ports(2)
    api_args, api_port = metricsapi.operator_args(bed)
    api = metricsapi.manifests(bed, api_port, REPO / "config" / "autoscale" / "apiservice.yaml")
    kubectl(
        bed, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump_all(api)
    )
    argv = [
        sys.executable,
        "-m",
        "slinky.operator.main",
        f"--kubeconfig={bed.kubeconfig}",
        f"--metrics-bind-address=127.0.0.1:{mport}",
        f"--health-probe-bind-address=127.0.0.1:{pport}",
        "--leader-election-namespace=default",
        *api_args,
    ]
    bed.spawn_extra("operator", argv, env={"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    (bed.dir / "operator-ports").write_text(f"{mport} {pport}\n")  # metrics, probes
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{pport}/readyz", timeout=2) as r:
                if r.status == 200:
                    return mport, pport
        except (urllib.error.URLError, OSError):
            pass
        if not operator_running(bed):
            break
        time.sleep(0.2)
    raise SystemExit("slurm-operator did not become ready; see " + str(bed.logs / "operator.log"))


CRDS = ("clusters.slinky.slurm.net", "nodesets.slinky.slurm.net")


def install_crds(bed: Testbed, timeout: float = 60.0) -> None:
    """Apply the CRDs and wait until each is Established. (`kubectl wait --for=condition`
    fails at once, not waits, on a CRD whose status.conditions the apiserver has not filled
    yet: "accessor error: <nil>"; a fresh bed's tour hit it with the NodeSet CRD's full pod
    template schema.)"""
    kubectl(bed, "apply", "--server-side", "-f", str(REPO / "config" / "crd"))
    path = '{.status.conditions[?(@.type=="Established")].status}'
    deadline = time.monotonic() + timeout
    for crd in CRDS:
        while run_kubectl(bed, "get", f"crd/{crd}", "-o", f"jsonpath={path}").stdout != "True":
            if time.monotonic() > deadline:
                raise SystemExit(f"CRD {crd} not Established after {timeout:.0f}s")
            time.sleep(0.2)


def main() -> None:
    p = argparse.ArgumentParser(prog="slinky-dev")
    p.add_argument("--dir", type=Path, required=True)
    bed = Testbed(p.parse_args().dir)
    install_crds(bed)
    dev_bridge.reserve_node(bed)  # before any slurmd pod exists
    ports = None
    if not operator_running(bed):
        ports = start_operator(bed)
    objects = sample_objects(bed)
    nodesets = [o for o in objects if o["kind"] == "NodeSet"]
    # The Cluster first, and Ready: the operator hands slurmd pods `--conf-server` from the
    # Cluster it has connected to, and a pod created before that would lack it.
    for batch in ([o for o in objects if o["kind"] != "NodeSet"], nodesets):
        for obj in batch:
            apply_sample(bed, obj)
        if batch is not nodesets:
            kubectl(
                bed,
                "wait",
                "--for=condition=Ready",
                "-n",
                NAMESPACE,
                "slurmcluster/slurm",
                "--timeout=60s",
            )
    where = f"metrics http://127.0.0.1:{ports[0]}/metrics, " if ports else ""
    print(f"""
Slinky dev environment is up ({bed.dir}).
  slurm-operator: {where}log {bed.logs / "operator.log"}
  sample: Cluster slurm, NodeSet compute (partition compute) and its HPA in namespace {NAMESPACE}

  eval "$(make -s dev-env)"            # KUBECONFIG, SLURM_REST_URL, SLURM_JWT, SLURMCTLD_ADDR, ...
  K={paths.bin_dir()}/kubectl
  $K get slurmcluster,nodesets,pods -n {NAMESPACE}
  $K scale nodeset/compute -n {NAMESPACE} --replicas=3
  .venv/bin/slinky testbed --dir {bed.dir} slurm sinfo
  .venv/bin/slinky testbed --dir {bed.dir} slurm sbatch --wrap "sleep 60"
  .venv/bin/slinky testbed --dir {bed.dir} slurm squeue
  # autoscaling: the HPA takes compute to 0 once the queue is empty (30s window), then
  .venv/bin/slinky testbed --dir {bed.dir} slurm sbatch -p compute -N 2 --wrap "sleep 60"
  $K get hpa,nodeset -n {NAMESPACE} -w      # 0 -> 2 -> (job done, 30s) -> 0
  $K get --raw "{EXTERNAL}/slurm_nodeset_jobs_pending?labelSelector=nodeset=compute"

Stop everything with `make dev-down`.""")
    dev_bridge.setup(bed)


if __name__ == "__main__":
    main()
