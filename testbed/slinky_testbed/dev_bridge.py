"""The host-run environment's bridge part (slinky_testbed.dev; `make dev` installs the
bridge's chart instead, dev_site, and uses the node helpers here): run slurm-bridge
(every component, one process) on the test bed with a sample config whose managed
namespace is `slurm-bridge`, register its webhook with the test bed's apiserver, and label
the nodes meant for the bridge so that they register in Slurm as EXTERNAL nodes.
Idempotent, like the rest of the environment.

The bridge's node is a real node (kubelet + containerd), so that a pod Slurm places there
really runs: the last real node of the test bed, set aside (labelled, and tainted as the
bridge will taint it) before the operator's slurmd pods are created, so none lands there.
A test bed with a single real node leaves it to the operator and gives the bridge the kwok
nodes, where pods are placed by Slurm but no container runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from slinky_testbed import nodes, paths, pki, procs
from slinky_testbed.bed import Testbed

MANAGED_NAMESPACE = "slurm-bridge"
BRIDGE_NAMESPACE = "slinky-system"
SCHEDULER_NAME = "slurm-bridge-scheduler"
EXTERNAL_NODE_LABEL = "scheduler.slinky.slurm.net/external-node"
MANAGED_NODE_TAINT = "slinky.slurm.net/managed-node"
# Nodes the test bed dedicates to the bridge carry this label; without any, the kwok nodes
# are used (nothing of the operator runs there, so the NoExecute taint evicts nothing).
BRIDGE_NODE_LABEL = "testbed.slinky.slurm.net/bridge"

Kubectl = Callable[..., str]
GANG_EXAMPLE = Path(__file__).resolve().parents[2] / "config/groups/example-gang.yaml"
PODGROUP_CRD = (
    Path(__file__).resolve().parents[2] / "config/groups/scheduling.x-k8s.io_podgroups.yaml"
)


def config(bed: Testbed) -> dict[str, object]:
    return {
        "schedulerName": SCHEDULER_NAME,
        "slurmRestApi": bed.slurm_rest_url,
        "managedNamespaces": [MANAGED_NAMESPACE],
        "partition": "slurm-bridge",
        "slurmAuth": {"jwtKeyFile": str(bed.jwt_key_path), "user": "root"},
    }


def running(bed: Testbed) -> bool:
    pid = bed.load().pids.get("bridge")
    return pid is not None and procs.Proc(pid[0], pid[1]).alive()


def start(bed: Testbed, config_path: Path, cert: tuple[Path, Path]) -> int:
    """Start the bridge in the background (stopped by `make dev-down`); its webhook port."""
    mport, pport, wport = procs.free_ports(3)
    argv = [
        sys.executable,
        "-m",
        "slinky.bridge.main",
        f"--config={config_path}",
        f"--kubeconfig={bed.kubeconfig}",
        f"--namespace={BRIDGE_NAMESPACE}",
        f"--metrics-bind-address=127.0.0.1:{mport}",
        f"--health-probe-bind-address=127.0.0.1:{pport}",
        f"--webhook-bind-address=127.0.0.1:{wport}",
        f"--webhook-cert-path={cert[0].parent}",
        f"--webhook-cert-name={cert[0].name}",
        f"--webhook-cert-key={cert[1].name}",
    ]
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    bed.spawn_extra("bridge", argv, env=env)
    (bed.dir / "bridge" / "ports").write_text(f"{mport} {pport} {wport}\n")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{pport}/readyz", timeout=2) as r:
                if r.status == 200:
                    return wport
        except (urllib.error.URLError, OSError):
            pass
        if not running(bed):
            break
        time.sleep(0.2)
    raise SystemExit("slurm-bridge did not become ready; see " + str(bed.logs / "bridge.log"))


def bridge_nodes(kubectl: Kubectl) -> list[str]:
    """The real node set aside for the bridge and the kwok nodes: at least two, so a gang
    (one Slurm job of several nodes) can be tried."""
    names: list[str] = []
    for selector in (BRIDGE_NODE_LABEL, "type=kwok"):
        names += [
            n.removeprefix("node/")
            for n in kubectl("get", "nodes", "-l", selector, "-o", "name").split()
        ]
    return names


def give_internal_ip(kubectl: Kubectl, node: str) -> None:
    """kwok nodes report no address, and Slurm needs a NodeAddr: give them loopback (Slurm
    never contacts an EXTERNAL node, so nothing is sent there)."""
    if kubectl("get", "node", node, "-o", "jsonpath={.status.addresses}").strip():
        return
    patch = '{"status":{"addresses":[{"type":"InternalIP","address":"127.0.0.1"}]}}'
    kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", patch)


def reserve_node(bed: Testbed) -> None:
    """Set the last real node aside for the bridge (when there are two or more and none is
    set aside yet): labelled, and tainted as the bridge's node controller will taint it, so
    the slurmd pods the operator creates next never land there."""
    kubectl = kubectl_for(bed)
    if kubectl("get", "nodes", "-l", BRIDGE_NODE_LABEL, "-o", "name").split():
        return
    real = bed.load().real_nodes
    if len(real) < 2:
        return
    node = real[-1]
    kubectl("label", "--overwrite", "node", node, f"{BRIDGE_NODE_LABEL}=true")
    kubectl(
        "taint", "node", node, f"{MANAGED_NODE_TAINT}={SCHEDULER_NAME}:NoExecute", "--overwrite"
    )


def setup(bed: Testbed) -> None:
    """Bring the dev bridge up (or keep it) and print how to watch it."""
    kubectl = kubectl_for(bed)
    work = bed.dir / "bridge"
    work.mkdir(exist_ok=True)
    config_path = work / "config.yaml"
    config_path.write_text(yaml.safe_dump(config(bed), sort_keys=False))
    cert = pki.serving_cert(bed.pki, "slurm-bridge-webhook", ["127.0.0.1", "localhost"])
    namespaces = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
        for n in (MANAGED_NAMESPACE, BRIDGE_NAMESPACE)
    ]
    kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(namespaces))
    if running(bed):
        wport = int((work / "ports").read_text().split()[2])
    else:
        wport = start(bed, config_path, cert)
    webhooks = subprocess.run(
        [
            sys.executable,
            "-m",
            "slinky.bridge.admission.manifests",
            f"--config={config_path}",
            f"--namespace={BRIDGE_NAMESPACE}",
            f"--url=https://127.0.0.1:{wport}",
            f"--ca-file={bed.pki / 'ca.crt'}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    kubectl("apply", "--server-side", "--field-manager=slinky-dev", "-f", "-", stdin=webhooks)
    # The scheduler-plugins PodGroup CRD, so a gang can be tried (see the README).
    kubectl("apply", "--server-side", "--field-manager=slinky-dev", "-f", str(PODGROUP_CRD))
    names = bridge_nodes(kubectl)
    for node in names:
        give_internal_ip(kubectl, node)
        kubectl("label", "--overwrite", "node", node, f"{EXTERNAL_NODE_LABEL}=true")
    k = paths.bin_dir() / "kubectl"
    s = f".venv/bin/slinky testbed --dir {bed.dir} slurm"
    print(f"""
  slurm-bridge: config {config_path}, log {bed.logs / "bridge.log"}
    managed namespace {MANAGED_NAMESPACE}; nodes registered in Slurm: {", ".join(names) or "none"}
    {s} sinfo -p slurm-bridge -N -o "%N %T %f"          # the bridge's EXTERNAL nodes
    {k} -n {MANAGED_NAMESPACE} run demo --image={nodes.image_ref("slurm")} -- sleep 30
    {s} squeue -p slurm-bridge -o "%i %j %T %N"         # its placeholder job
    {k} -n {MANAGED_NAMESPACE} get pod demo -o wide     # Running on the node Slurm chose
    {k} -n {MANAGED_NAMESPACE} apply -f {GANG_EXAMPLE}   # a gang: 2 pods, one Slurm job
    {s} squeue -p slurm-bridge -o "%i %j %T %D %N"      # one job, two nodes""")


def kubectl_for(bed: Testbed) -> Kubectl:
    def kubectl(*args: str, stdin: str | None = None) -> str:
        out = subprocess.run(
            [str(paths.bin_dir() / "kubectl"), f"--kubeconfig={bed.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)} failed:\n{out.stderr}")
        return out.stdout

    return kubectl
