"""The bridge bench's account of where a burst's time went, from two scrapes of /metrics."""

from __future__ import annotations

from bench.bench_bridge import where_time_went

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
