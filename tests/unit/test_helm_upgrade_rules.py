"""What a `helm upgrade` of the slurm chart may not do to running jobs: roll the pods of the
NodeSets it does not touch (their DNS search list named every NodeSet), start slurmctld with
accounting before slurmdbd answers, or change ProctrackType/TaskPlugin under running jobs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from slinky.api.schema import parse
from slinky.api.v1alpha1.nodeset import NodeSetSpec
from slinky.operator import upgradecheck
from slinky.operator.nodeset import builder
from slinky.slurm.models import Job
from tests.unit.test_helm_charts import CHARTS, HELM, helm, kinds, load_all, one, render_values

JSON = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "images/slurm/slurm-entrypoint"

pytestmark = pytest.mark.skipif(
    not HELM.exists(), reason=f"{HELM} not built (`make testbed-build` builds it)"
)


def nodesets_values(*names: str, login: bool = True) -> JSON:
    return {
        "login": {"enabled": login},
        "compute": {"nodesets": [{"name": n, "replicas": 1} for n in names]},
    }


def nodeset(objs: list[JSON], name: str) -> JSON:
    return one(objs, "NodeSet", f"slurm-compute-{name}")


def revision(obj: JSON) -> str:
    spec = parse(NodeSetSpec, obj["spec"], "spec")
    return builder.revision_hash(spec.template, "x:6817", builder.service_name(obj, spec))


# ------------------------------------------------------------ NodeSets and DNS


def test_adding_a_nodeset_changes_no_other_nodesets_pods_nor_the_login_pods(
    tmp_path: Path,
) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    before = render_values("slurm", nodesets_values("batch"), tmp_path / "one")
    after = render_values("slurm", nodesets_values("batch", "gpu"), tmp_path / "two")
    assert nodeset(after, "batch") == nodeset(before, "batch")
    assert revision(nodeset(after, "batch")) == revision(nodeset(before, "batch"))
    login = "slurm-login"
    assert (
        one(after, "Deployment", login)["spec"]["template"]
        == one(before, "Deployment", login)["spec"]["template"]
    )


def test_every_slurmd_pod_resolves_by_name_in_one_service_all_pods_search(tmp_path: Path) -> None:
    objs = render_values("slurm", nodesets_values("batch", "gpu"), tmp_path)
    svc = one(objs, "Service", "slurm-slurmd")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    domain = "slurm-slurmd.slurm.svc.cluster.local"
    for name in ("batch", "gpu"):
        ns = nodeset(objs, name)
        template = ns["spec"]["template"]
        # The pod's subdomain (the operator sets it from serviceName) is the shared Service,
        # which selects it, and its search list names that Service's domain alone.
        assert ns["spec"]["serviceName"] == "slurm-slurmd"
        labels = template["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items(), (svc["spec"], labels)
        assert template["spec"]["dnsConfig"] == {"searches": [domain]}
        pod = builder.build_pod(
            ns | {"metadata": {**ns["metadata"], "uid": "u"}},
            parse(NodeSetSpec, ns["spec"], "spec"),
            0,
            revision="r",
            conf_server=None,
        )
        assert pod["spec"]["subdomain"] == "slurm-slurmd"
    login = one(objs, "Deployment", "slurm-login")["spec"]["template"]["spec"]
    assert login["dnsConfig"] == {"searches": [domain]}


# ------------------------------------------------------------ slurmctld waits for slurmdbd


def accounting_values() -> JSON:
    return {"accounting": {"enabled": True, "mariadb": {"enabled": True}}}


def test_slurmctld_with_accounting_starts_only_after_slurmdbd_answers(tmp_path: Path) -> None:
    objs = render_values("slurm", accounting_values(), tmp_path)
    spec = one(objs, "StatefulSet", "slurm-controller")["spec"]["template"]["spec"]
    inits = [c["name"] for c in spec["initContainers"]]
    # After the config is in /etc/slurm (it reads slurm.conf and slurm.key), before slurmctld.
    assert inits.index("wait-for-slurmdbd") == inits.index("config") + 1, inits
    wait = next(c for c in spec["initContainers"] if c["name"] == "wait-for-slurmdbd")
    assert wait["args"] == ["wait-for-slurmdbd"]
    mounts = {m["mountPath"]: m for m in wait["volumeMounts"]}
    assert mounts["/var/spool/slurmctld"]["readOnly"] is True  # saved associations: no wait
    assert "command" not in wait  # the image's entrypoint (tini, slurm-entrypoint)
    assert {"name": "etc-slurm", "mountPath": "/etc/slurm"} in wait["volumeMounts"]


def test_slurmctld_without_accounting_waits_for_nothing(tmp_path: Path) -> None:
    objs = render_values("slurm", {}, tmp_path)
    spec = one(objs, "StatefulSet", "slurm-controller")["spec"]["template"]["spec"]
    assert "wait-for-slurmdbd" not in [c["name"] for c in spec["initContainers"]]


def _entrypoint(tmp_path: Path, conf: str, answers: list[str]) -> subprocess.CompletedProcess[str]:
    """`slurm-entrypoint wait-for-slurmdbd` with a fake sacctmgr giving `answers` in turn
    ("<exit code> <output>"), the last one for good."""
    if "StateSaveLocation" not in conf:  # never the host's own
        conf += f"StateSaveLocation={tmp_path / 'state'}\n"
    (tmp_path / "slurm.conf").write_text(conf)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for n, answer in enumerate(answers):
        (tmp_path / f"answer{n}").write_text(answer)
    fake = bin_dir / "sacctmgr"
    fake.write_text(
        "#!/bin/sh\n"
        f'd={tmp_path}; n=$(cat "$d/count" 2>/dev/null || echo 0)\n'
        f'[ -e "$d/answer$n" ] || n={len(answers) - 1}\n'
        'echo $((n + 1)) > "$d/count"\n'
        'read -r code out < "$d/answer$n"\n'
        'echo "$out"; exit "$code"\n'
    )
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env["SLURM_CONF"] = str(tmp_path / "slurm.conf")
    return subprocess.run(
        ["sh", str(ENTRYPOINT), "wait-for-slurmdbd"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )


ACCOUNTING_CONF = (
    "ClusterName=c\n"
    "AccountingStorageType=accounting_storage/slurmdbd\n"
    "AccountingStorageHost=dbd.slurm.svc.cluster.local\n"
    "AccountingStoragePort=6819\n"
)


def test_the_entrypoint_waits_until_slurmdbd_answers_up_logging_each_try(tmp_path: Path) -> None:
    # A ping that exits 0 but says DOWN is no answer; neither is a failed one.
    got = _entrypoint(
        tmp_path,
        ACCOUNTING_CONF,
        [
            "0 slurmdbd(primary) at dbd is DOWN",
            "1 unable to run ping",
            "0 slurmdbd(primary) at dbd is UP",
        ],
    )
    assert got.returncode == 0, got.stderr
    lines = got.stderr.splitlines()
    waiting = [ln for ln in lines if "not answering" in ln]
    assert len(waiting) == 2, lines
    assert "slurmdbd dbd.slurm.svc.cluster.local:6819 not answering" in waiting[0]
    assert "slurmctld starts with accounting only once it does" in waiting[0]
    assert lines[-1] == "slurm-entrypoint: slurmdbd dbd.slurm.svc.cluster.local:6819 answers"
    assert (tmp_path / "count").read_text().strip() == "3"


def test_a_slurmctld_with_saved_associations_starts_while_slurmdbd_is_down(
    tmp_path: Path,
) -> None:
    """Only a first start with accounting waits: a restart (a config change, an eviction)
    during a slurmdbd or database outage runs from the saved associations, as Slurm means
    it to, instead of leaving the cluster without a controller."""
    state = tmp_path / "saved"
    state.mkdir()
    # The marker slurmctld's first start with accounting left, then the state it saved.
    (state / "slinky-slurmdbd-accounting").touch()
    os.utime(state / "slinky-slurmdbd-accounting", (1_000_000, 1_000_000))
    (state / "assoc_mgr_state").write_bytes(b"saved")
    conf = ACCOUNTING_CONF + f"StateSaveLocation={state}\n"
    got = _entrypoint(tmp_path, conf, ["0 slurmdbd(primary) at dbd is DOWN"])
    assert got.returncode == 0, got.stderr
    assert "associations saved" in got.stderr
    assert not (tmp_path / "count").exists()  # sacctmgr never asked


@pytest.mark.parametrize("marker_age", ["none", "newer"])
def test_associations_saved_without_accounting_do_not_skip_the_wait(
    tmp_path: Path, marker_age: str
) -> None:
    """slurmctld without accounting saves an assoc_mgr_state too, holding no association:
    the start that turns accounting on (no marker yet), or one before slurmctld saved since
    its first start with it (the marker is newer), waits for slurmdbd (the crash case)."""
    state = tmp_path / "saved"
    state.mkdir()
    (state / "assoc_mgr_state").write_bytes(b"no association")
    os.utime(state / "assoc_mgr_state", (1_000_000, 1_000_000))
    if marker_age == "newer":
        (state / "slinky-slurmdbd-accounting").touch()
    conf = ACCOUNTING_CONF + f"StateSaveLocation={state}\n"
    got = _entrypoint(tmp_path, conf, ["0 slurmdbd(primary) at dbd is UP"])
    assert got.returncode == 0, got.stderr
    assert "associations saved" not in got.stderr
    assert got.stderr.splitlines()[-1].endswith("answers"), got.stderr
    assert (tmp_path / "count").read_text().strip() == "1"


def test_the_entrypoint_runs_sackd_for_sacctmgr_while_it_waits_with_auth_slurm(
    tmp_path: Path,
) -> None:
    # auth/slurm: a client command signs with a sack socket only (slurmctld's, sackd's), and
    # none is there before slurmctld starts: sacctmgr said "failed to connect to any sack
    # sockets" for good. The fake sacctmgr answers UP only while the fake sackd runs.
    d = tmp_path
    (d / "slurm.conf").write_text("AuthType=auth/slurm\n" + ACCOUNTING_CONF)
    bin_dir = d / "bin"
    bin_dir.mkdir()
    fakes = {
        "sackd": (
            f'd={d}; echo "$@" > "$d/sackd.args"\n'
            "trap 'rm -f \"$d/sackd.running\"; exit 0' TERM\n"
            'touch "$d/sackd.running" "$d/sack.socket"\n'
            "while :; do sleep 0.1; done\n"
        ),
        "sacctmgr": (
            f"d={d}\n"
            'if [ -e "$d/sackd.running" ]; then echo "slurmdbd(primary) at dbd is UP"; exit 0; fi\n'
            'echo "sacctmgr: error: failed to connect to any sack sockets"\n'
            'echo "slurmdbd(primary) at dbd is DOWN"; exit 1\n'
        ),
    }
    for name, body in fakes.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env["SLURM_CONF"] = str(d / "slurm.conf")
    env["SLURM_ENTRYPOINT_SACK_SOCKET"] = str(d / "sack.socket")
    got = subprocess.run(
        ["sh", str(ENTRYPOINT), "wait-for-slurmdbd"],
        capture_output=True,
        text=True,
        env=env,
        timeout=10,
        check=False,
    )
    assert got.returncode == 0, got.stderr
    assert "not answering" not in got.stderr, got.stderr  # it waited for sackd's socket
    assert got.stderr.splitlines()[-1].endswith("6819 answers"), got.stderr
    assert (d / "sackd.args").read_text().split() == ["-D", "-f", str(d / "slurm.conf")]
    assert not (d / "sackd.running").exists()  # stopped before slurmctld starts


def test_the_entrypoint_does_not_wait_without_slurmdbd_accounting(tmp_path: Path) -> None:
    got = _entrypoint(tmp_path, "ClusterName=c\n", ["1 unable to run ping"])
    assert got.returncode == 0, got.stderr
    assert "no slurmdbd accounting; not waiting" in got.stderr
    assert not (tmp_path / "count").exists()  # sacctmgr never ran


# ------------------------------------------------------------ ProctrackType/TaskPlugin changes


def render_upgrade(tmp_path: Path, values: JSON, *extra: str) -> list[JSON]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    args = ["template", "slurm", str(REPO / "helm/slurm"), "-n", "slurm", "-f", str(path)]
    return load_all(helm(*args, *extra).stdout)


def test_an_upgrade_asks_slurm_first_with_the_slurm_conf_it_would_write(tmp_path: Path) -> None:
    # `helm template` cannot read the release's ConfigMap (lookup is empty), as an upgrade
    # that cannot tell whether slurm.conf changes: the hook is there.
    objs = render_upgrade(tmp_path, {"slurmConfig": {"jobIsolation": "none"}}, "--is-upgrade")
    job = one(objs, "Job", "slurm-upgrade-check")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    assert job["spec"]["backoffLimit"] == 0
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    conf = one(objs, "ConfigMap", "slurm-config")["data"]["slurm.conf"]
    assert env["NEW_SLURM_CONF"] == conf
    assert "ProctrackType=proctrack/linuxproc" in conf
    assert container["args"][:3] == ["python3", "-m", "slinky.operator.upgradecheck"]
    assert "--configmap=slurm-config" in container["args"]
    assert "--slurmrestd=http://slurm-restapi.slurm.svc.cluster.local:6820" in container["args"]
    role = one(objs, "Role", "slurm-upgrade-check")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["slurm-config"],
            "verbs": ["get"],
        }
    ]
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        assert (
            one(objs, kind, "slurm-upgrade-check")["metadata"]["annotations"]["helm.sh/hook-weight"]
            == "-10"
        )


def test_no_check_on_install_or_when_switched_off(tmp_path: Path) -> None:
    assert not [
        o
        for o in kinds(render_upgrade(tmp_path, {}), "Job")
        if "upgrade-check" in o["metadata"]["name"]
    ]
    off = render_upgrade(tmp_path, {"upgradeCheck": {"enabled": False}}, "--is-upgrade")
    assert not [o for o in kinds(off, "Job") if "upgrade-check" in o["metadata"]["name"]]


CGROUP = "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n"
LINUXPROC = "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"


def test_options_are_read_as_slurm_reads_them() -> None:
    conf = (
        "# ProctrackType=proctrack/pgid\n"
        "proctracktype = proctrack/cgroup  # a comment\n"
        "TaskPlugin=task/cgroup, task/affinity\n"
        "ProctrackType=proctrack/linuxproc\n"
    )
    assert upgradecheck.options(conf) == {
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/cgroup,task/affinity",
    }
    assert (
        upgradecheck.changed(CGROUP, "TaskPlugin=task/cgroup\nProctrackType=proctrack/cgroup") == {}
    )
    assert upgradecheck.changed(CGROUP + "MaxNodeCount=9\n", CGROUP) == {}
    assert upgradecheck.changed(CGROUP, LINUXPROC) == {
        "ProctrackType": ("proctrack/cgroup", "proctrack/linuxproc"),
        "TaskPlugin": ("task/cgroup", "task/none"),
    }


def job(job_id: int, *state: str, nodes: str = "") -> Job:
    return Job(job_id=job_id, name="j", state=list(state), nodes=nodes)


def test_a_change_under_running_jobs_is_refused_naming_them_and_the_ways_on() -> None:
    changes = upgradecheck.changed(CGROUP, LINUXPROC)
    jobs = [
        job(7, "RUNNING", nodes="slurm-compute-batch-0"),
        job(8, "PENDING"),
        job(9, "SUSPENDED"),
        job(10, "COMPLETED"),
        job(11, "COMPLETING"),
    ]
    v = upgradecheck.verdict(changes, jobs, "")
    assert not v.ok
    assert "ProctrackType proctrack/cgroup -> proctrack/linuxproc" in v.message
    assert "3 job(s) run: 7 (RUNNING on slurm-compute-batch-0), 9 (SUSPENDED), 11 (COMPLETING)" in (
        v.message
    )
    assert "slurmConfig.jobIsolation" in v.message and "DRAIN" in v.message
    assert "upgradeCheck.enabled=false" in v.message
    many = upgradecheck.verdict(changes, [job(n, "RUNNING") for n in range(25)], "")
    assert "and 5 more" in many.message


def test_a_change_with_no_job_running_or_no_change_goes_on() -> None:
    changes = upgradecheck.changed(CGROUP, LINUXPROC)
    assert upgradecheck.verdict(changes, [job(8, "PENDING"), job(10, "COMPLETED")], "").ok
    assert upgradecheck.verdict({}, None, "unreachable").ok


def test_no_answer_from_slurm_is_not_no_jobs() -> None:
    changes = upgradecheck.changed(CGROUP, LINUXPROC)
    v = upgradecheck.verdict(changes, None, "slurmrestd http://x unreachable")
    assert not v.ok
    assert "could not say whether jobs run (slurmrestd http://x unreachable)" in v.message


@pytest.mark.parametrize("dropped", ["upgradeCheck", "sssd.minId", "sssd.caCert"])
def test_values_of_an_earlier_chart_are_refused_saying_how_to_upgrade(dropped: str) -> None:
    """`helm upgrade --reuse-values` from an earlier chart keeps its values without this
    version's new ones: a clear refusal naming the way on, not a nil-pointer error."""
    out = helm("template", "slurm", str(CHARTS / "slurm"), "--set", f"{dropped}=null", check=False)
    assert out.returncode != 0
    assert "--reset-then-reuse-values" in out.stderr, out.stderr
    assert "nil pointer" not in out.stderr
