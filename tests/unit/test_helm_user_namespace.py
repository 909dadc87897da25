"""The slurm chart's NodeSet values hostUsers and runtimeClassName: a slurmd pod in a user
namespace of its own (docs/isolation.md, "What slurmd needs on cgroup v2")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.unit.test_helm_charts import CHARTS, JSON, _slurmd, helm, kinds, one, render_values

NO_DEVICES = (
    "CgroupPlugin=autodetect\nIgnoreSystemd=yes\nConstrainCores=yes\nConstrainRAMSpace=yes\n"
    "ConstrainDevices=no\n"
)


def pod_specs(objs: list[JSON]) -> dict[str, JSON]:
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in kinds(objs, "NodeSet")}


def refusal(tmp_path: Path, values: JSON) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    out = helm("template", "slurm", str(CHARTS / "slurm"), "-f", str(path), check=False)
    assert out.returncode != 0, out.stdout[:2000]
    return out.stderr


def test_by_default_the_pods_share_the_nodes_user_namespace_and_runtime(tmp_path: Path) -> None:
    objs = render_values("slurm", {"compute": {"nodesets": [{"name": "plain"}]}}, tmp_path)
    spec = pod_specs(objs)["slurm-compute-plain"]
    assert "hostUsers" not in spec and "runtimeClassName" not in spec
    assert _slurmd(objs)["slurm-compute-plain"]["securityContext"] == {
        "capabilities": {"add": ["SYS_PTRACE", "SYS_ADMIN"]}
    }


def test_own_user_namespace_renders_host_users_false_the_runtime_class_and_only_sys_ptrace(
    tmp_path: Path,
) -> None:
    values = {
        "slurmConfig": {"cgroupConf": NO_DEVICES},
        "compute": {
            "nodesets": [
                {"name": "own", "hostUsers": False, "runtimeClassName": "delegated-cgroup",
                 "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
                {"name": "plain"},
            ]
        },
    }  # fmt: skip
    objs = render_values("slurm", values, tmp_path)
    specs = pod_specs(objs)
    assert specs["slurm-compute-own"]["hostUsers"] is False
    assert specs["slurm-compute-own"]["runtimeClassName"] == "delegated-cgroup"
    assert "hostUsers" not in specs["slurm-compute-plain"]
    contexts = {name: c.get("securityContext") for name, c in _slurmd(objs).items()}
    assert contexts == {
        "slurm-compute-own": {
            "seccompProfile": {"type": "RuntimeDefault"},
            "capabilities": {"add": ["SYS_PTRACE"]},
        },
        "slurm-compute-plain": {"capabilities": {"add": ["SYS_PTRACE", "SYS_ADMIN"]}},
    }
    # Memory and CPUs are still confined per job.
    conf = one(objs, "ConfigMap", "slurm-config")["data"]
    assert "TaskPlugin=task/cgroup" in conf["slurm.conf"]
    assert "ConstrainRAMSpace=yes" in conf["cgroup.conf"].split()


def test_a_runtime_class_alone_keeps_the_nodes_user_namespace(tmp_path: Path) -> None:
    values = {"compute": {"nodesets": [{"name": "rc", "runtimeClassName": "crun"}]}}
    spec = pod_specs(render_values("slurm", values, tmp_path))["slurm-compute-rc"]
    assert spec["runtimeClassName"] == "crun" and "hostUsers" not in spec


@pytest.mark.parametrize("devices", ["ConstrainDevices=yes", "  constraindevices = YES"])
def test_own_user_namespace_with_device_confinement_is_refused_naming_both_values(
    tmp_path: Path, devices: str
) -> None:
    """slurmd cannot load its eBPF device program there: every job would fail to start."""
    values = {
        "slurmConfig": {"cgroupConf": NO_DEVICES.replace("ConstrainDevices=no", devices)},
        "compute": {"nodesets": [{"name": "a"}, {"name": "own", "hostUsers": False}]},
    }
    err = refusal(tmp_path, values)
    assert "compute.nodesets[1].hostUsers: false needs ConstrainDevices=no" in err
    assert "slurmConfig.cgroupConf" in err


def test_the_default_cgroup_conf_is_refused_with_own_user_namespace(tmp_path: Path) -> None:
    err = refusal(tmp_path, {"compute": {"nodesets": [{"name": "own", "hostUsers": False}]}})
    assert "compute.nodesets[0].hostUsers: false needs ConstrainDevices=no" in err


def test_own_user_namespace_needs_no_device_setting_without_cgroups(tmp_path: Path) -> None:
    values = {
        "slurmConfig": {"jobIsolation": "none"},
        "compute": {"nodesets": [{"name": "own", "hostUsers": False}]},
    }
    objs = render_values("slurm", values, tmp_path)
    assert pod_specs(objs)["slurm-compute-own"]["hostUsers"] is False
    # SYS_PTRACE only: root in the pod's namespace reads its jobs' /proc/<pid>/io with it.
    assert _slurmd(objs)["slurm-compute-own"].get("securityContext") == {
        "capabilities": {"add": ["SYS_PTRACE"]}
    }


def test_own_user_namespace_with_a_privileged_container_is_refused(tmp_path: Path) -> None:
    values = {
        "slurmConfig": {"cgroupConf": NO_DEVICES},
        "compute": {"nodesets": [{"name": "own", "hostUsers": False,
                                  "securityContext": {"privileged": True}}]},
    }  # fmt: skip
    err = refusal(tmp_path, values)
    assert "compute.nodesets[0]: hostUsers: false with securityContext.privileged: true" in err


def test_host_users_must_be_a_boolean(tmp_path: Path) -> None:
    err = refusal(tmp_path, {"compute": {"nodesets": [{"name": "a", "hostUsers": "no"}]}})
    assert "hostUsers" in err and "boolean" in err
