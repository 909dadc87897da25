"""config/monitoring/ against real metrics: a `make dev` environment of its own (operator,
bridge, the sample Cluster, NodeSet `compute` with its HPA) scraped by the test bed's
Prometheus together with slurmctld's own endpoints, some work done (a Slurm job, a pod the
bridge places, a pod no managed node fits), then every dashboard query and every metric
selector of every alert must return series, and Prometheus must evaluate every alert rule
without error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import pytest
import yaml

from slinky_testbed import dev, dev_bridge
from slinky_testbed.bed import Testbed
from slinky_testbed.prometheus import Prometheus, PrometheusError, ScrapeJob, slurmctld_job
from slinky_testbed.waiting import WaitTimeout, wait_for
from tests.e2e.workers import worker_bed_dir
from tests.unit.test_monitoring import (
    ALERTS,
    alert_rules,
    as_promql,
    dashboard_exprs,
    selectors,
    slurmctld_names,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
REPO = Path(__file__).resolve().parents[2]
BRIDGE_NS = dev_bridge.MANAGED_NAMESPACE
IMAGE = "localhost/slinky/slurm:26.05"
SERIES_TIMEOUT = 120.0

# Selectors of alert expressions that a healthy test bed has no series for (what they
# select happens only in an outage); their metric is checked by name.
OUTAGE_ONLY = {
    'slurm_bridge_slurm_errors_total{reason=~"SlurmUnavailable|SlurmAuthError"}',
    'slurm_rest_requests_total{code!~"2..|304"}',
}


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    """A `make dev` environment of its own. With SLINKY_TESTBED_REUSE=1 one whose operator and
    bridge still run is reused and left running."""
    bed = Testbed(worker_bed_dir("SLINKY_MONITORING_TESTBED_DIR", "monitoring"))
    reuse = os.environ.get("SLINKY_TESTBED_REUSE") == "1"
    if reuse and dev.operator_running(bed) and dev_bridge.running(bed):
        yield bed
        return
    if bed.status_lines(only_running=True):
        bed.down(log=lambda line: None)
    bed.up(real_nodes=2, kwok_nodes=2, log=lambda line: None)
    try:
        subprocess.run(
            [sys.executable, "-m", "slinky_testbed.dev", "--dir", str(bed.dir)],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
        yield bed
    finally:
        if not reuse:
            bed.down(log=lambda line: None)


@pytest.fixture(scope="module")
async def prom(bed: Testbed) -> AsyncIterator[Prometheus]:
    operator_port = (bed.dir / "operator-ports").read_text().split()[0]
    bridge_port = (bed.dir / "bridge" / "ports").read_text().split()[0]
    jobs = [
        ScrapeJob("slurm-operator", [f"127.0.0.1:{operator_port}"]),
        ScrapeJob("slurm-bridge", [f"127.0.0.1:{bridge_port}"]),
        slurmctld_job(bed.slurmctld_addr),
    ]
    if Prometheus.running(bed):  # a reused bed
        prom = Prometheus.attach(bed)
        await prom.reload(jobs, [ALERTS])
    else:
        prom = Prometheus.start(bed, jobs, [ALERTS])
    await prom.wait_targets_up(timeout=60)
    yield prom


def kubectl(bed: Testbed, *args: str) -> str:
    out = bed.kubectl(list(args))
    assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
    return out.stdout


def pod(name: str, **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": BRIDGE_NS},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": IMAGE, "command": ["sleep", "1"]}],
            **spec,
        },
    }


@pytest.fixture(scope="module")
async def worked(bed: Testbed, prom: Prometheus) -> AsyncIterator[Prometheus]:
    """Work that makes every series the dashboards and alerts read exist: a Slurm job in
    `compute` (the HPA scales it up, then back to 0 while the job runs: the busy pod drains
    behind it, with a deadline 15 minutes out), a pod the bridge places, a pod no managed
    node fits. The job is cancelled at the end (its drain would outlast the module)."""
    out = bed.slurm(
        ["sbatch", "--parsable", "-p", "compute", "--time=15", "--wrap", "sleep 900"],
        capture=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    placed = pod("placed")
    unfit = pod("unfit", nodeSelector={"slinky.test/no-such-node": "true"})
    manifest = bed.dir / "monitoring-pods.yaml"
    manifest.write_text(yaml.safe_dump_all([placed, unfit]))
    kubectl(bed, "apply", "-f", str(manifest))

    def succeeded() -> bool:
        out = kubectl(bed, "-n", BRIDGE_NS, "get", "pod", "placed", "-o", "json")
        return bool(json.loads(out).get("status", {}).get("phase") == "Succeeded")

    await wait_for(succeeded, timeout=180, what="pod placed by the bridge Succeeded")
    await prom.wait_for_series(
        'slurm_bridge_slurm_errors_total{reason="NoManagedNodeFits"}', timeout=SERIES_TIMEOUT
    )
    await prom.wait_for_series(
        'slinky_nodeset_drain_deadline_timestamp_seconds{nodeset="compute"}', timeout=240
    )
    try:
        yield prom
    finally:
        bed.slurm(["scancel", job], capture=True, timeout=30)


async def test_every_dashboard_query_returns_series(worked: Prometheus) -> None:
    empty = []
    for uid, title, expr in dashboard_exprs():
        try:
            await worked.wait_for_series(as_promql(expr), timeout=SERIES_TIMEOUT)
        except (WaitTimeout, PrometheusError) as e:  # listed at the end
            empty.append(f"{uid} / {title}: {expr}: {e}")
    assert not empty, "queries without series:\n" + "\n".join(empty)


async def test_every_selector_of_every_alert_returns_series(worked: Prometheus) -> None:
    empty = []
    for rule in alert_rules():
        for sel in sorted(selectors(rule["expr"])):
            query = sel.split("{", 1)[0] if sel in OUTAGE_ONLY else sel
            try:
                await worked.wait_for_series(query, timeout=SERIES_TIMEOUT)
            except (WaitTimeout, PrometheusError) as e:
                empty.append(f"{rule['alert']}: {query}: {e}")
    assert not empty, "alert selectors without series:\n" + "\n".join(empty)


async def test_prometheus_evaluates_every_alert_rule_without_error(worked: Prometheus) -> None:
    names = {r["alert"] for r in alert_rules()}

    async def evaluated() -> list[dict[str, object]]:
        async with httpx2.AsyncClient(base_url=worked.url, timeout=10) as http:
            body = (await http.get("/api/v1/rules", params={"type": "alert"})).json()
        rules = [r for g in body["data"]["groups"] for r in g["rules"]]
        done = [r for r in rules if r.get("lastEvaluation", "").startswith("2")]
        return rules if {r["name"] for r in done} == names else []

    rules = await wait_for(evaluated, timeout=60, what="every alert rule evaluated")
    bad = [f"{r['name']}: {r.get('lastError')}" for r in rules if r.get("health") != "ok"]
    assert not bad, bad
    firing = [r["name"] for r in rules if r.get("state") == "firing"]
    assert not firing, f"alerts firing on a healthy test bed: {firing}"


async def test_slurmctld_still_serves_every_metric_the_unit_tests_know(prom: Prometheus) -> None:
    """tests/unit/data/slurmctld_metrics.txt, which the unit tests check names against, is
    what this Slurm serves: every name there, at its path."""
    served = {
        (s.name, s.labels.get("metrics_path", ""))
        for s in await prom.wait_for_series('count by (__name__, metrics_path) ({job="slurmctld"})')
    }
    gone = sorted(
        f"{path} {name}" for name, path in slurmctld_names().items() if (name, path) not in served
    )
    assert not gone, f"slurmctld no longer serves: {gone}"
