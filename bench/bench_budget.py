"""What steady state costs Slurm: slurmrestd requests per minute of the operator and the
bridge when nothing changes, measured from their own `slurm_rest_requests_total` counters on
a `make dev`-like test bed of its own (~/.cache/slinky/testbeds/budget: 2 real nodes,
2 kwok nodes, the sample Cluster, NodeSet `compute` with its partition and an HPA, the
bridge managing one real node and the two kwok nodes).

Windows, each `BENCH_BUDGET_WINDOW` seconds (default 120), one after another:

1. operator, the sample HPA scaling `compute` (the test bed's kube-controller-manager asks
   every 2 s); the bridge idle, no pod;
2. operator, no HPA: this benchmark asks the external metric through the apiserver every
   15 s, as an HPA with Kubernetes' default sync period does;
3. operator, nothing asks (a Cluster and an idle NodeSet);
4. bridge with 3 running placeholder jobs (pods on the kwok nodes, which never end) and 10
   finished pods left in place (Succeeded on the real node, as Job pods stay).

Printed beside the budget of issue 22 and upstream's figures measured on this project's
test bed (upstream slurm-bridge v1.2.1: ~23 requests/min idle; `GET /jobs` and `GET /nodes`
every 30 s). Run: `python -m bench.bench_budget` (the test bed is started anew and left up;
`--down` stops it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from slinky_testbed import nodes, paths
from slinky_testbed.bed import Testbed

JSON = dict[str, Any]
BED_DIR = Path(
    os.environ.get("SLINKY_BUDGET_TESTBED_DIR", paths.cache_dir() / "testbeds" / "budget")
)
WINDOW_S = float(os.environ.get("BENCH_BUDGET_WINDOW", "120"))
HPA_PERIOD_S = 15.0  # kube-controller-manager's default --horizontal-pod-autoscaler-sync-period
NS, BRIDGE_NS = "slurm", "slurm-bridge"
METRIC = (
    f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/slurm_nodeset_jobs_pending_nodes"
    "?labelSelector=nodeset%3Dcompute"
)
UPSTREAM_BRIDGE_IDLE = 23.0  # requests/min, measured on this test bed (see docs/bridge.md)


def kubectl(bed: Testbed, *args: str, stdin: str | None = None) -> str:
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


def counters(metrics_url: str) -> dict[str, float]:
    """The process's slurmrestd requests so far, by "METHOD endpoint code"."""
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "slurm_rest_requests_total":
                labels = sample.labels
                key = f"{labels['method']} {labels['endpoint']} {labels['code']}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def requests(metrics_url: str) -> float:
    return sum(counters(metrics_url).values())


BREAKDOWN: dict[str, dict[str, float]] = {}  # window -> requests/min by endpoint


def per_minute(metrics_url: str, seconds: float, during: Any = None, *, name: str = "") -> float:
    """Requests per minute over a window; `during(now)` is called once a second."""
    start, t0 = counters(metrics_url), time.monotonic()
    while (left := seconds - (time.monotonic() - t0)) > 0:
        if during is not None:
            during(time.monotonic() - t0)
        time.sleep(min(1.0, left))
    end, minutes = counters(metrics_url), (time.monotonic() - t0) / 60
    rates = {k: (v - start.get(k, 0.0)) / minutes for k, v in end.items()}
    BREAKDOWN[name] = {k: v for k, v in rates.items() if v > 0}
    return sum(rates.values())


def wait(check: Any, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(1)


def pod(name: str, args: list[str], *, kwok: bool) -> JSON:
    spec: JSON = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "main",
                "image": nodes.image_ref("slurm"),
                "imagePullPolicy": "IfNotPresent",
                "args": args,
                "resources": {"requests": {"cpu": "500m", "memory": "64Mi"}},
            }
        ],
    }
    annotations = {}
    if kwok:
        spec["nodeSelector"] = {"type": "kwok"}
        spec["tolerations"] = [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]
        annotations["slurmjob.slinky.slurm.net/exclusive"] = "false"
    else:
        spec["nodeSelector"] = {"testbed.slinky.slurm.net/kubelet": "real"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": BRIDGE_NS, "annotations": annotations},
        "spec": spec,
    }


def phases(bed: Testbed) -> list[str]:
    out = kubectl(bed, "-n", BRIDGE_NS, "get", "pods", "-o", "json")
    return [str((p.get("status") or {}).get("phase")) for p in json.loads(out)["items"]]


def main() -> None:
    p = argparse.ArgumentParser(prog="bench.bench_budget")
    p.add_argument("--down", action="store_true", help="stop the test bed at the end")
    args = p.parse_args(sys.argv[1:] if __name__ == "__main__" else [])
    bed = Testbed(BED_DIR)
    if bed.status_lines(only_running=True):
        bed.down(log=print)  # a fresh operator and bridge, of the code measured
    bed.up(real_nodes=2, kwok_nodes=2, log=print)
    try:
        run(bed)
    finally:
        if args.down:
            bed.down(log=print)


def run(bed: Testbed) -> None:
    subprocess.run(
        [sys.executable, "-m", "slinky_testbed.dev", "--dir", str(bed.dir)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    operator = f"http://127.0.0.1:{(bed.dir / 'operator-ports').read_text().split()[0]}/metrics"
    bridge = f"http://127.0.0.1:{(bed.dir / 'bridge' / 'ports').read_text().split()[0]}/metrics"
    kubectl(bed, "-n", BRIDGE_NS, "delete", "pods", "--all", "--wait=true")

    def compute_settled() -> bool:
        out = kubectl(bed, "-n", NS, "get", "nodeset", "compute", "-o", "json")
        st = json.loads(out).get("status") or {}
        return (
            st.get("replicas") == 0
            and not kubectl(bed, "-n", NS, "get", "pods", "-o", "name").strip()
        )

    print("waiting for the HPA to take compute to 0 (empty queue) ...")
    wait(compute_settled, "NodeSet compute at 0 replicas")
    results: list[tuple[str, float, str]] = []

    print(f"window 1: the HPA asks every 2 s ({WINDOW_S:.0f} s)")
    t0 = requests(bridge), time.monotonic()
    what = "operator, HPA asking every 2 s (the test bed's sync period)"
    results.append((what, per_minute(operator, WINDOW_S, name=what), "(15 s: 6)"))
    bridge_idle = (requests(bridge) - t0[0]) / (time.monotonic() - t0[1]) * 60
    results.append(("bridge, idle (no pod)", bridge_idle, "<= 6"))

    kubectl(bed, "-n", NS, "delete", "hpa", "compute")
    last_ask = [-HPA_PERIOD_S]

    def ask(now: float) -> None:
        if now - last_ask[0] >= HPA_PERIOD_S:
            last_ask[0] = now
            kubectl(bed, "get", "--raw", METRIC)

    print(f"window 2: asked every {HPA_PERIOD_S:.0f} s, as a default HPA ({WINDOW_S:.0f} s)")
    what = f"operator, metric asked every {HPA_PERIOD_S:.0f} s (default HPA)"
    results.append((what, per_minute(operator, WINDOW_S, during=ask, name=what), "<= 6"))
    print(f"window 3: nothing asks ({WINDOW_S:.0f} s)")
    what = "operator, nothing asks"
    results.append((what, per_minute(operator, WINDOW_S, name=what), ""))

    for i in range(10):
        kubectl(bed, "apply", "-f", "-", stdin=json.dumps(pod(f"done-{i}", ["true"], kwok=False)))
    wait(lambda: phases(bed).count("Succeeded") == 10, "10 finished pods", timeout=600)
    for i in range(3):
        kubectl(
            bed, "apply", "-f", "-", stdin=json.dumps(pod(f"runs-{i}", ["sleep", "1"], kwok=True))
        )
    wait(lambda: phases(bed).count("Running") == 3, "3 running pods on kwok nodes")
    time.sleep(30)  # past the first reads of the new jobs
    print(f"window 4: bridge, 3 running jobs, 10 finished pods left ({WINDOW_S:.0f} s)")
    what = "bridge, 3 running jobs + 10 finished pods left"
    results.append((what, per_minute(bridge, WINDOW_S, name=what), "<= 9"))
    kubectl(bed, "-n", BRIDGE_NS, "delete", "pods", "--all", "--wait=false")

    print("\nslurmrestd requests per minute in steady state (one run)")
    print(f"{'':52} {'measured':>9} {'budget':>8}")
    for what, value, budget in results:
        print(f"{what:52} {value:9.1f} {budget:>8}")
    for window, rates in BREAKDOWN.items():
        print(f"  {window}: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(rates.items())))
    print(
        f"upstream slurm-bridge v1.2.1, idle, same test bed: {UPSTREAM_BRIDGE_IDLE:.0f}/min "
        f"(ratio bridge idle / upstream: {bridge_idle / UPSTREAM_BRIDGE_IDLE:.2f}x)"
    )


if __name__ == "__main__":
    main()
