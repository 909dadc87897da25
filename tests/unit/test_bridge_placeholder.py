"""The placeholder job of a pod, by value: resources, annotations, names, the admin_comment;
and the order in which the scheduler takes pods."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slinky.bridge import placeholder
from slinky.bridge.config import BridgeConfig, parse_config
from slinky.bridge.labels import SLURMJOB_PREFIX
from slinky.bridge.placeholder import PlaceholderProblem
from slinky.bridge.scheduler.queue import RankedKeys, pod_rank
from slinky.slurm.models import Job

JSON = dict[str, Any]
CONFIG = parse_config(
    {
        "partition": "bridge",
        "schedulerName": "s1",
        "mcsLabel": "k8s",
        "clusterId": "c1",
        # What the annotations below ask for is allowed (the policy's own rules are in
        # test_bridge_policy.py).
        "policy": {
            "default": {
                "users": ["65534", "1000"],
                "groups": ["65534", "0"],
                "accounts": ["physics"],
                "qos": ["high"],
                "partitions": ["gpu"],
                "reservations": ["maint"],
                "allowPriority": True,
            }
        },
    }
)


def container(name: str = "c", requests: JSON | None = None, limits: JSON | None = None) -> JSON:
    resources: JSON = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": name, "resources": resources}


def pod(
    *containers: JSON,
    init: list[JSON] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> JSON:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u-1",
            "annotations": {SLURMJOB_PREFIX + k: v for k, v in (annotations or {}).items()},
        },
        "spec": {"containers": list(containers) or [container()], "initContainers": init or [],
                 **spec},
    }  # fmt: skip


def job(p: JSON, config: BridgeConfig = CONFIG) -> JSON:
    return placeholder.job_description(p, config)


# ---------------------------------------------------------------- the basics


def test_a_pod_becomes_one_external_job_on_one_node_without_a_script() -> None:
    j = job(pod())
    assert j["flags"] == ["EXTERNAL_JOB"]
    assert "script" not in j
    assert (j["minimum_nodes"], j["maximum_nodes"], j["tasks"], j["tasks_per_node"]) == (1, 1, 1, 1)
    assert j["partition"] == "bridge"
    assert j["mcs_label"] == "k8s"
    assert j["name"] == "ns/p"


def test_the_job_is_exclusive_unless_the_pod_says_false() -> None:
    assert job(pod())["shared"] == ["none"]
    assert job(pod(annotations={"exclusive": "true"}))["shared"] == ["none"]
    assert "shared" not in job(pod(annotations={"exclusive": "false"}))
    with pytest.raises(PlaceholderProblem, match="exclusive"):
        job(pod(annotations={"exclusive": "yes"}))


def test_admin_comment_names_the_pod_its_uid_the_scheduler_and_the_cluster() -> None:
    comment = job(pod())["admin_comment"]
    assert json.loads(comment)["pods"] == ["ns/p"]  # upstream's shape, kept
    read = placeholder.read_comment(comment)
    assert read == placeholder.Comment(scheduler="s1", pods={"ns/p": "u-1"}, cluster="c1")


@pytest.mark.parametrize("text", ["", "x", "[]", '{"pods": "ns/p"}', "null"])
def test_a_comment_that_is_not_the_bridges_is_not_read_as_one(text: str) -> None:
    assert placeholder.read_comment(text) is None


def test_an_upstream_comment_without_uids_is_read() -> None:
    assert placeholder.read_comment('{"pods":["a/b"]}') == placeholder.Comment("", {"a/b": ""})


# ---------------------------------------------------------------- resources


def test_cpus_and_memory_are_rounded_up_to_whole_cpus_and_mib() -> None:
    j = job(pod(container(requests={"cpu": "1500m", "memory": "100M"})))
    assert j["cpus_per_task"] == 2
    assert j["memory_per_node"] == {"set": True, "number": 96}  # 100e6 B = 95.4 MiB


def test_containers_add_up_and_the_larger_of_request_and_limit_counts() -> None:
    p = pod(
        container("a", requests={"cpu": "1"}, limits={"cpu": "2", "memory": "1Gi"}),
        container("b", requests={"cpu": "500m", "memory": "512Mi"}),
    )
    assert placeholder.cpus(p) == 3  # 2 + 0.5, rounded up
    assert placeholder.memory_mib(p) == 1536


def test_an_init_container_larger_than_the_app_sets_the_size() -> None:
    p = pod(container(requests={"cpu": "1"}), init=[container("i", requests={"cpu": "3"})])
    assert placeholder.cpus(p) == 3


def test_sidecars_run_beside_the_app_and_beside_later_init_containers() -> None:
    sidecar = {**container("s", requests={"cpu": "1"}), "restartPolicy": "Always"}
    later = container("i", requests={"cpu": "2"})
    p = pod(container(requests={"cpu": "1"}), init=[sidecar, later])
    # app 1 + sidecar 1 = 2; init "i" runs beside the sidecar: 2 + 1 = 3
    assert placeholder.cpus(p) == 3
    p = pod(container(requests={"cpu": "4"}), init=[sidecar, later])
    assert placeholder.cpus(p) == 5


def test_pod_overhead_is_added() -> None:
    p = pod(container(requests={"cpu": "1", "memory": "1Gi"}))
    p["spec"]["overhead"] = {"cpu": "250m", "memory": "128Mi"}
    assert placeholder.cpus(p) == 2
    assert placeholder.memory_mib(p) == 1152


def test_a_pod_asking_for_nothing_gets_one_cpu_and_one_mib_never_the_whole_node() -> None:
    j = job(pod(container()))
    assert j["cpus_per_task"] == 1
    assert j["memory_per_node"]["number"] == 1


def test_gpus_of_both_vendors_become_gres_per_node() -> None:
    p = pod(
        container("a", limits={"nvidia.com/gpu": "2"}),
        container("b", limits={"amd.com/gpu": "1"}),
    )
    assert job(p)["tres_per_node"] == "gres/gpu:3"
    assert "tres_per_node" not in job(pod())


def test_a_bad_quantity_names_the_container_and_field() -> None:
    with pytest.raises(PlaceholderProblem, match=r"'c' requests.cpu is not a quantity: 'lots'"):
        job(pod(container(requests={"cpu": "lots"})))


# ---------------------------------------------------------------- annotations


def test_annotations_override_partition_name_cpus_memory_and_gres() -> None:
    j = job(
        pod(
            container(requests={"cpu": "1"}),
            annotations={
                "partition": "gpu",
                "job-name": "train",
                "cpu-per-task": "8",
                "mem-per-node": "4096",
                "gres": "gpu:a100:1",
            },
        )
    )
    assert j["partition"] == "gpu"
    assert j["name"] == "train"
    assert j["cpus_per_task"] == 8
    assert j["memory_per_node"] == {"set": True, "number": 4096}
    assert j["tres_per_node"] == "gres/gpu:a100:1"


def test_size_annotations_never_make_the_job_smaller_than_the_pod() -> None:
    # The containers use 4 CPUs and 2 GiB (a limit counts); the annotations ask for less:
    # Slurm must still reserve what the pod takes on the node.
    p = pod(
        container(requests={"cpu": "2", "memory": "1Gi"}, limits={"cpu": "4", "memory": "2Gi"}),
        annotations={"cpu-per-task": "1", "mem-per-node": "512"},
    )
    j = job(p)
    assert j["cpus_per_task"] == 4
    assert j["memory_per_node"] == {"set": True, "number": 2048}
    # The same holds for every pod of a group, whose root's annotations are merged in.
    assert placeholder.at_least_the_pods(p, "cpu-per-task", 4) == 4
    assert placeholder.at_least_the_pods(p, "mem-per-node", 100) == 512


def test_text_annotations_pass_through_and_ids_become_strings() -> None:
    j = job(
        pod(
            annotations={
                "account": "physics",
                "qos": "high",
                "reservation": "maint",
                "licenses": "matlab:1",
                "constraints": "avx512",
                "wckey": "w",
                "priority": "100",
                "user-id": "1000",
                "group-id": "0",
            }
        )
    )
    assert (j["account"], j["qos"], j["reservation"]) == ("physics", "high", "maint")
    assert (j["licenses"], j["constraints"], j["wckey"]) == ("matlab:1", "avx512", "w")
    assert j["priority"] == {"set": True, "number": 100}
    assert (j["user_id"], j["group_id"]) == ("1000", "0")


def test_time_limit_from_the_annotation_else_the_active_deadline_rounded_up() -> None:
    assert job(pod(annotations={"timelimit": "90"}))["time_limit"] == {"set": True, "number": 90}
    assert job(pod(activeDeadlineSeconds=61))["time_limit"]["number"] == 2
    assert job(pod(activeDeadlineSeconds=1))["time_limit"]["number"] == 1
    both = pod(annotations={"timelimit": "5"}, activeDeadlineSeconds=6000)
    assert job(both)["time_limit"]["number"] == 5
    assert "time_limit" not in job(pod())


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cpu-per-task", "0"),
        ("cpu-per-task", "two"),
        ("timelimit", "-1"),
        ("priority", "1.5"),
        ("user-id", "\u00b2"),  # a digit to str.isdigit(), not to int()
        ("mem-per-node", "\u0663"),
    ],
)
def test_a_bad_number_annotation_is_named(key: str, value: str) -> None:
    with pytest.raises(PlaceholderProblem, match=SLURMJOB_PREFIX + key) as e:
        job(pod(annotations={key: value}))
    assert e.value.reason == "InvalidAnnotation"


def test_the_config_partition_is_the_default() -> None:
    assert job(pod(), parse_config({}))["partition"] == "slurm-bridge"


# ---------------------------------------------------------------- order


def ranked(priority: int | None, created: str) -> JSON:
    spec = {} if priority is None else {"priority": priority}
    return {"metadata": {"creationTimestamp": created}, "spec": spec}


def test_pods_are_taken_by_priority_then_age_then_arrival() -> None:
    pods = {
        "low-old": ranked(0, "2026-01-01T00:00:00Z"),
        "high-new": ranked(10, "2026-01-02T00:00:00Z"),
        "low-new": ranked(None, "2026-01-02T00:00:00Z"),
        "high-old": ranked(10, "2026-01-01T00:00:00Z"),
        "low-new-2": ranked(0, "2026-01-02T00:00:00Z"),
    }
    keys = RankedKeys(lambda k: pod_rank(pods.get(k)))
    for k in ["low-new", "low-old", "high-new", "low-new-2", "high-old"]:
        keys.append(k)
    out = [keys.popleft() for _ in range(len(keys))]
    assert out == ["high-old", "high-new", "low-old", "low-new", "low-new-2"]


def placeholder_job(admin_comment: str, job_id: int = 10) -> Job:
    """Job `job_id` as slurmrestd returns it, with `admin_comment`."""
    return Job.parse({"job_id": job_id, "job_state": ["RUNNING"], "admin_comment": admin_comment})


def test_only_a_comment_naming_the_pod_scheduler_and_cluster_makes_a_job_its_placeholder() -> None:
    ours = placeholder_job(job(pod())["admin_comment"])
    other_scheduler = parse_config({"schedulerName": "s2", "clusterId": "c1"})
    other_cluster = parse_config({"schedulerName": "s1", "clusterId": "c2"})
    assert placeholder.job_is_for(ours, CONFIG, key="ns/p")
    assert not placeholder.job_is_for(ours, other_scheduler, key="ns/p")
    assert not placeholder.job_is_for(ours, other_cluster, key="ns/p")
    assert not placeholder.job_is_for(ours, CONFIG, key="ns/q")
    assert not placeholder.job_is_for(placeholder_job(""), CONFIG, key="ns/p")
    assert not placeholder.job_is_for(placeholder_job("not json"), CONFIG, key="ns/p")
    # Written before clusterId existed: the scheduler name is all there is to go by.
    legacy = placeholder_job('{"pods":["ns/p"],"uids":["u-1"],"scheduler":"s1"}')
    assert placeholder.job_is_for(legacy, other_cluster, key="ns/p")


def test_a_comment_recorded_for_another_pod_of_the_same_name_is_not_its_placeholder() -> None:
    ours = placeholder_job(job(pod())["admin_comment"])  # written for UID u-1
    assert placeholder.job_is_for(ours, CONFIG, key="ns/p", uid="u-1")
    assert not placeholder.job_is_for(ours, CONFIG, key="ns/p", uid="u-2")
    upstream = '{"pods":["ns/p"]}'  # no UIDs recorded: the name is all there is to go by
    read = placeholder.read_comment(upstream)
    assert read is not None and read.pods == {"ns/p": ""} and read.scheduler == ""


def named(name: str, uid: str) -> JSON:
    p = pod()
    p["metadata"].update(name=name, uid=uid)
    return p


def test_a_job_id_is_not_identity_only_the_admin_comment_says_whose_job_it_is() -> None:
    """Job 10 was pod ns/p's (UID u-1); slurmctld restarted from an older state save and
    gave 10 to another job: the same id, another job."""
    assert placeholder.job_is_for(
        placeholder_job(placeholder.admin_comment([pod()], CONFIG)), CONFIG, key="ns/p", uid="u-1"
    )
    for comment in (
        placeholder.admin_comment([named("q", "u-9")], CONFIG),  # another pod's
        placeholder.admin_comment([named("a", "u-a"), named("b", "u-b")], CONFIG),  # a gang's
        placeholder.admin_comment([named("p", "u-0")], CONFIG),  # an earlier pod named p
        "",  # a user's job
    ):
        assert not placeholder.job_is_for(placeholder_job(comment), CONFIG, key="ns/p", uid="u-1")


def test_without_a_policy_the_job_runs_as_nobody_never_the_bridges_own_user() -> None:
    j = job(pod(), parse_config({}))
    assert (j["user_id"], j["group_id"]) == ("65534", "65534")


def test_an_annotation_outside_the_policy_is_a_policy_problem_not_a_job() -> None:
    with pytest.raises(PlaceholderProblem) as e:
        job(pod(annotations={"user-id": "0"}), parse_config({}))
    assert e.value.reason == "PolicyDenied" and "policy.default.users" in e.value.message
