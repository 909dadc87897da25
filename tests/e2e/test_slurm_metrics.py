"""slurmctld's own metrics (MetricsType=metrics/openmetrics in the test bed's slurm.conf),
served on its port and scraped by a real Prometheus of the test bed."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest

from slinky_testbed.bed import Testbed
from slinky_testbed.prometheus import SLURMCTLD_METRICS_PATHS, Prometheus, slurmctld_job

pytestmark = pytest.mark.e2e

NAME = "prometheus-e2e"


@pytest.fixture(scope="module")
def prometheus(testbed: Testbed) -> Iterator[Prometheus]:
    testbed.remove_extra(NAME)  # one left by a run on a reused test bed
    prom = Prometheus.start(testbed, [slurmctld_job(testbed.slurmctld_addr)], name=NAME)
    yield prom
    testbed.remove_extra(NAME)


async def test_slurmctld_serves_every_metrics_path_on_its_own_port(testbed: Testbed) -> None:
    async with httpx2.AsyncClient(base_url=f"http://{testbed.slurmctld_addr}", timeout=10) as h:
        index = await h.get("/metrics")
        assert index.status_code == 200
        for path in SLURMCTLD_METRICS_PATHS:
            assert f"'{path}'" in index.text, index.text
            resp = await h.get(path)
            assert resp.status_code == 200, (path, resp.text)
            if path == "/metrics/nodes":
                assert "# TYPE slurm_nodes gauge" in resp.text.splitlines()


async def test_prometheus_scrapes_slurmctld_and_sees_a_held_job(
    testbed: Testbed, prometheus: Prometheus
) -> None:
    targets = await prometheus.wait_targets_up(job="slurmctld", timeout=30)
    assert sorted(t.url.rsplit("/metrics", 1)[1] for t in targets) == sorted(
        p.removeprefix("/metrics") for p in SLURMCTLD_METRICS_PATHS
    )
    (parts,) = await prometheus.wait_for_series("slurm_partitions", timeout=30)
    assert parts.labels["metrics_path"] == "/metrics/partitions"
    assert parts.value >= 2  # all, slurm-bridge
    out = testbed.slurm(["sbatch", "--hold", "--parsable", "--wrap", "true"], capture=True)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    try:
        await prometheus.wait_for_series("slurm_jobs_hold >= 1 and slurm_jobs_pending >= 1")
        pending = await prometheus.wait_for_series(
            'slurm_partition_jobs_hold{partition="all"} >= 1'
        )
        assert pending[0].labels["job"] == "slurmctld"
    finally:
        testbed.slurm(["scancel", job])
