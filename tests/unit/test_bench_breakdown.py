"""The bridge bench's account of where a burst's time went, from two scrapes of /metrics."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from bench.bench_bridge import kube_requests, where_time_went
from bench.bench_handover import bridge_log, slurm_log
from bench.common import CpuMeter, cpu_seconds

WQ = '{controller="bridge-scheduler",name="bridge-scheduler"}'
ALLOC = '{endpoint="/slurm/v0.0.44/job/allocate",method="POST",server="s"}'
READ = '{endpoint="/slurm/v0.0.44/job/{id}",method="GET",server="s"}'


def test_means_are_taken_over_what_happened_between_the_two_scrapes() -> None:
    before = {
        f"workqueue_queue_duration_seconds_sum{WQ}": 1.0,
        f"workqueue_queue_duration_seconds_count{WQ}": 10.0,
        f"slurm_rest_request_duration_seconds_sum{ALLOC}": 0.5,
        f"slurm_rest_request_duration_seconds_count{ALLOC}": 5.0,
    }
    after = {
        f"workqueue_queue_duration_seconds_sum{WQ}": 3.0,
        f"workqueue_queue_duration_seconds_count{WQ}": 14.0,
        f"workqueue_work_duration_seconds_sum{WQ}": 0.4,
        f"workqueue_work_duration_seconds_count{WQ}": 4.0,
        f"slurm_rest_request_duration_seconds_sum{ALLOC}": 0.8,
        f"slurm_rest_request_duration_seconds_count{ALLOC}": 8.0,
        f"slurm_rest_request_duration_seconds_sum{READ}": 0.2,
        f"slurm_rest_request_duration_seconds_count{READ}": 0.0,  # none in the window
    }
    got = where_time_went(before, after)
    assert {k: round(v, 6) for k, v in got.items()} == {
        "queue": 0.5,
        "pass": 0.1,
        "POST job/allocate (n=3)": 0.1,
    }


def test_the_hand_over_bench_reads_cancels_and_binds_of_its_own_pods_from_the_bridge_log(
    tmp_path: Path,
) -> None:
    log = tmp_path / "bridge.log"
    log.write_text(
        "2026-11-30 03:00:05,377 INFO slinky.bridge.workload.sync: job 2: cancelled (pod "
        "ns/h1-01 is ended (every container exited))\n"
        "2026-11-30 03:00:05,400 INFO slinky.bridge.workload.sync: job 9: cancelled (pod "
        "ns/other-01 is ended (every container exited))\n"
        "  a traceback line\n"
        "2026-11-30 03:00:06,046 INFO slinky.bridge.scheduler.sync: pod ns/h1-02: bound to "
        "node-1 (Slurm job 3 on node-1)\n"
        "2026-11-30 03:00:07,000 INFO slinky.bridge.workload.sync: job 2: cancelled (pod "
        "ns/h1-01 is ended (every container exited))\n"
    )
    cancelled, job_of = bridge_log(log, {"h1-01", "h1-02"})
    at = datetime(2026, 11, 30, 3, 0, 5, 377000).timestamp()
    assert cancelled == {"h1-01": at}  # the first cancel counts
    assert job_of == {"h1-02": 3}


def test_the_hand_over_bench_reads_when_slurmctld_allocated_each_job(tmp_path: Path) -> None:
    log = tmp_path / "slurmctld.log"
    log.write_text(
        "[2026-11-30T03:36:33.595] _slurm_rpc_submit_batch_job: JobId=50 InitPrio=1 usec=133\n"
        "[2026-11-30T03:37:35.000] sched: Allocate JobId=50 NodeList=node-2 #CPUs=2\n"
        "[2026-11-30T03:37:36.010] backfill: Started JobId=51 in slurm-bridge on node-1\n"
        "[2026-11-30T03:37:37.000] sched: Allocate JobId=52 NodeList=node-1 #CPUs=2\n"
    )
    got = slurm_log(log, {50, 51})
    assert got == {
        50: datetime(2026, 11, 30, 3, 37, 35).timestamp(),
        51: datetime(2026, 11, 30, 3, 37, 36, 10000).timestamp(),
    }


def test_kubernetes_requests_are_counted_by_method_over_every_code() -> None:
    before = {
        'rest_client_requests_total{code="201",method="POST"}': 10.0,
        'rest_client_requests_total{code="200",method="PATCH"}': 4.0,
    }
    after = {
        'rest_client_requests_total{code="201",method="POST"}': 30.0,
        'rest_client_requests_total{code="409",method="POST"}': 1.0,
        'rest_client_requests_total{code="200",method="PATCH"}': 14.0,
        'rest_client_requests_total{code="200",method="GET"}': 0.0,
    }
    assert kube_requests(before, after) == {"PATCH": 10, "POST": 21}


def test_the_cpu_meter_counts_this_process_as_the_bench_by_its_command_line() -> None:
    seen = cpu_seconds()
    assert sum(seen.values()) > 0
    meter = CpuMeter()
    meter.start()
    spent = time.process_time()
    while time.process_time() - spent < 0.05:  # some CPU of its own, whatever the clock tick
        sum(i * i for i in range(1000))
    used = meter.stop()
    assert used.get("other", 0.0) + used.get("bench", 0.0) > 0
    assert meter.per(10).endswith(")")
