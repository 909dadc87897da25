"""What the slurm chart gives the workloads users bring (issue 48 part 2): MPI and srun
settings, job accounting, a sized /dev/shm, the site's config files and scripts (from values
or from ConfigMaps), which changes restart slurmctld and which the reconfigure container
applies, and that container's script run against a fake scontrol (its logic only: the test
bed's e2e test runs it against Slurm)."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_helm_charts import CHARTS, HELM, helm, kinds, one, render, render_values

JSON = dict[str, Any]

pytestmark = pytest.mark.skipif(
    not HELM.exists(), reason=f"{HELM} not built (`make testbed-build` builds it)"
)


def slurm_conf(objs: list[JSON]) -> list[str]:
    return str(one(objs, "ConfigMap", "slurm-config")["data"]["slurm.conf"]).splitlines()


def pod_spec(obj: JSON) -> JSON:
    spec: JSON = obj["spec"]["template"]["spec"]
    return spec


def container(obj: JSON, name: str) -> JSON:
    (found,) = [c for c in pod_spec(obj)["containers"] if c["name"] == name]
    return found


def volume(obj: JSON, name: str) -> JSON | None:
    found = [v for v in pod_spec(obj)["volumes"] if v["name"] == name]
    return found[0] if found else None


def refused(*sets: str) -> str:
    args = ["template", "slurm", str(CHARTS / "slurm")]
    for s in sets:
        args += ["--set", s]
    out = helm(*args, check=False)
    assert out.returncode != 0, "rendered, expected a refusal"
    return out.stderr


# ---------------------------------------------------------------- slurm.conf settings


def test_mpi_srun_ports_and_job_accounting_by_default() -> None:
    conf = slurm_conf(render("slurm"))
    assert "MpiDefault=pmi2" in conf
    assert "SrunPortRange=60001-63000" in conf
    assert "JobAcctGatherType=jobacct_gather/cgroup" in conf
    assert not any(line.startswith("JobAcctGatherFrequency") for line in conf)
    assert not any(line.startswith(("Prolog", "Epilog", "JobSubmitPlugins")) for line in conf)


def test_accounting_follows_job_isolation_and_settings_can_be_left_out() -> None:
    conf = slurm_conf(
        render(
            "slurm",
            "slurmConfig.jobIsolation=none",
            "slurmConfig.mpiDefault=",
            "slurmConfig.srunPortRange=",
            "slurmConfig.jobAcctGatherFrequency=task=5",
        )
    )
    assert "JobAcctGatherType=jobacct_gather/linux" in conf
    assert "JobAcctGatherFrequency=task=5" in conf
    assert not any(line.startswith(("MpiDefault", "SrunPortRange")) for line in conf)


def test_a_bad_srun_port_range_is_refused_naming_the_key() -> None:
    assert "srunPortRange" in refused("slurmConfig.srunPortRange=60000")


# ---------------------------------------------------------------- /dev/shm


def test_slurmd_and_login_pods_get_a_sized_memory_backed_dev_shm() -> None:
    objs = render("slurm", "login.enabled=true")
    nodeset = one(objs, "NodeSet")
    login = one(objs, "Deployment", "slurm-login")
    for obj, name, size in ((nodeset, "slurmd", "1Gi"), (login, "sshd", "256Mi")):
        assert volume(obj, "dev-shm") == {
            "name": "dev-shm",
            "emptyDir": {"medium": "Memory", "sizeLimit": size},
        }
        assert {"name": "dev-shm", "mountPath": "/dev/shm"} in container(obj, name)["volumeMounts"]
    objs = render(
        "slurm",
        "login.enabled=true",
        "login.devShmSizeLimit=",
        "compute.nodesetDefaults.devShmSizeLimit=",
    )
    assert volume(one(objs, "NodeSet"), "dev-shm") is None
    assert volume(one(objs, "Deployment", "slurm-login"), "dev-shm") is None
    assert "devShmSizeLimit" in refused("compute.nodesetDefaults.devShmSizeLimit=lots")


# ---------------------------------------------------------------- files and scripts

LUA = "function slurm_job_submit(d, p, u)\n  return slurm.SUCCESS\nend\n"
SITE: JSON = {
    "slurmConfig": {
        "configFiles": {"job_submit.lua": LUA, "mpi.conf": "PMIxDebug=0\n"},
        "configFileRefs": [{"configMap": "site-conf", "key": "oci.conf"}],
        "prologScripts": {"marker": "#!/bin/sh\ntouch /tmp/marker\n"},
        "epilogScriptRefs": [{"configMap": "site-scripts", "key": "unmark.sh"}],
        "prologSlurmctldScripts": {"log": "#!/bin/sh\nexit 0\n"},
        "epilogSlurmctldScriptRefs": [{"configMap": "site-scripts", "key": "end.sh"}],
    },
    "login": {"enabled": True},
}


def test_files_and_scripts_from_values_and_configmaps_are_where_slurm_reads_them(
    tmp_path: Path,
) -> None:
    objs = render_values("slurm", SITE, tmp_path)
    data = one(objs, "ConfigMap", "slurm-config")["data"]
    assert data["job_submit.lua"] == LUA and data["mpi.conf"] == "PMIxDebug=0\n"
    assert data["prolog-marker"].startswith("#!/bin/sh")
    assert "prolog-slurmctld-log" in data
    conf = slurm_conf(objs)
    # slurmd's scripts: relative names beside slurm.conf, which configless slurmd fetch.
    assert "Prolog=prolog-marker" in conf and "Epilog=epilog-unmark.sh" in conf
    assert "PrologSlurmctld=/etc/slurm/prolog-slurmctld-log" in conf
    assert "EpilogSlurmctld=/etc/slurm/epilog-slurmctld-end.sh" in conf
    assert "JobSubmitPlugins=lua" in conf
    # The site's ConfigMaps' keys, under the names Slurm reads, in the one config volume of
    # slurmctld and slurmrestd.
    for obj in (one(objs, "StatefulSet"), one(objs, "Deployment", "slurm-restapi")):
        config = volume(obj, "config")
        assert config is not None
        assert config["projected"]["sources"] == [
            {"configMap": {"name": "slurm-config"}},
            {
                "configMap": {
                    "name": "site-conf",
                    "items": [{"key": "oci.conf", "path": "oci.conf"}],
                }
            },
            {
                "configMap": {
                    "name": "site-scripts",
                    "items": [{"key": "unmark.sh", "path": "epilog-unmark.sh"}],
                }
            },
            {
                "configMap": {
                    "name": "site-scripts",
                    "items": [{"key": "end.sh", "path": "epilog-slurmctld-end.sh"}],
                }
            },
        ]
    # The init container copies them all, scripts executable.
    init = pod_spec(one(objs, "StatefulSet"))["initContainers"][0]["command"][-1]
    assert "prolog-* | epilog-*) m=0755" in init and "stage /etc/slurm" in init


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["slurmConfig.prologScripts.a/b=x"],
            r'slurmConfig.prologScripts["a/b"]: "a/b" is not a file name',
        ),
        (
            ["slurmConfig.configFiles.slurm\\.conf=x"],
            'slurmConfig.configFiles["slurm.conf"]: slurm.conf is a file the chart renders',
        ),
        (
            ["slurmConfig.gresConf=AutoDetect=off", "slurmConfig.configFiles.gres\\.conf=x"],
            'slurmConfig.configFiles["gres.conf"]: gres.conf is a file the chart renders',
        ),
        (
            ["slurmConfig.configFileRefs[0].configMap=c", "slurmConfig.configFileRefs[0].key=.."],
            'slurmConfig.configFileRefs[0]: ".." is not a file name',
        ),
        (
            ["slurmConfig.configFiles.prolog-x=x"],
            "names starting with prolog- or epilog- are the scripts'",
        ),
        (
            ["slurmConfig.prologScripts.slurmctld-a=x", "slurmConfig.prologSlurmctldScripts.a=y"],
            "both make the file prolog-slurmctld-a",
        ),
        (["slurmConfig.configFileRefs[0].configMap=c"], "missing property 'key'"),
    ],
)
def test_a_bad_file_or_script_name_is_refused_naming_the_value(
    sets: list[str], message: str
) -> None:
    assert message in refused(*sets)


def test_a_gres_conf_from_a_configmap_is_fine_without_gres_conf_in_values() -> None:
    objs = render(
        "slurm",
        "slurmConfig.configFileRefs[0].configMap=gpus",
        "slurmConfig.configFileRefs[0].key=gres.conf",
    )
    assert "gres.conf" not in one(objs, "ConfigMap", "slurm-config")["data"]


# ---------------------------------------------------------------- restart or reconfigure


def restart_annotations(objs: list[JSON]) -> dict[str, str]:
    out = {}
    for obj in kinds(objs, "StatefulSet") + kinds(objs, "Deployment"):
        if obj["metadata"]["name"] not in ("slurm-controller", "slurm-restapi"):
            continue
        annotations = obj["spec"]["template"]["metadata"].get("annotations") or {}
        assert "checksum/config" not in annotations
        out[obj["metadata"]["name"]] = annotations["checksum/restart-settings"]
    return out


BASE = ["login.enabled=true"]


@pytest.mark.parametrize(
    "change",
    [
        "slurmConfig.prologScripts.marker=#!/bin/sh",
        "slurmConfig.configFiles.mpi\\.conf=PMIxDebug=1",
        "slurmConfig.configFileRefs[0].configMap=c,slurmConfig.configFileRefs[0].key=oci.conf",
        "slurmConfig.mpiDefault=none",
        "slurmConfig.extraSlurmConf=MinJobAge=30",
        "slurmConfig.gresConf=AutoDetect=off",
        "compute.healthCheck.script=#!/bin/sh",
    ],
)
def test_a_change_slurm_takes_by_reconfigure_restarts_no_daemon(change: str) -> None:
    before = restart_annotations(render("slurm", *BASE))
    assert set(before) == {"slurm-controller", "slurm-restapi"}
    assert restart_annotations(render("slurm", *BASE, change)) == before


@pytest.mark.parametrize(
    "change",
    [
        "slurmConfig.jobIsolation=none",  # ProctrackType, TaskPlugin
        "controller.port=6900",
        "slurmConfig.extraSlurmConf=AuthAltTypes=auth/jwt",
        "slurmConfig.extraSlurmConf=SelectType=select/linear",
        "accounting.enabled=true,accounting.mariadb.enabled=true",
        "clusterName=other",
    ],
)
def test_a_change_slurm_takes_only_at_start_restarts_slurmctld_restapi_and_login(
    change: str,
) -> None:
    before = restart_annotations(render("slurm", *BASE))
    after = restart_annotations(render("slurm", *BASE, change))
    assert all(after[name] != before[name] for name in before), (before, after)


def test_a_slurmctld_restart_tells_the_configless_daemons_to_fetch_again() -> None:
    """slurmd and sackd fetch the files at start and at a reconfigure, not when slurmctld
    restarts with new ones (on the test bed, slurmd pods went on without a Prolog line
    slurmctld had restarted with): reconfig_on_restart has slurmctld tell them."""
    assert "SlurmctldParameters=enable_configless,reconfig_on_restart" in slurm_conf(
        render("slurm")
    )


def test_login_pods_take_config_changes_from_slurmctld_without_restarting() -> None:
    """sackd on the login pods is registered with slurmctld, which pushes it every
    reconfigure: no checksum of slurm.conf or of a config file rolls the login pods (they
    used to restart, and one starting before the reconfigure kept the old slurm.conf)."""
    for sets in ((), ("slurmConfig.mpiDefault=none",), ("slurmConfig.configFiles.mpi\\.conf=x",)):
        login = one(render("slurm", *BASE, *sets), "Deployment", "slurm-login")
        annotations = login["spec"]["template"]["metadata"].get("annotations") or {}
        assert not [k for k in annotations if "slurm-conf" in k], annotations


def test_login_sackd_runs_as_slurm_user_by_its_full_path_on_a_key_copy() -> None:
    """slurmctld signs its reconfigure push for SlurmUser alone (a root sackd refused it:
    "asked to verify token with r_uid=64030 for uid=0") and sackd re-executes itself by
    argv[0] ("execv() failed: No such file or directory" for a bare `sackd`). The login
    template does it, so an image of the same tag from before works too."""
    for user in ("slurm", "slurmadm"):
        login = one(
            render("slurm", *BASE, f"slurmConfig.slurmUser={user}"), "Deployment", "slurm-login"
        )
        script = container(login, "sackd")["args"][-1]
        assert f'setpriv --reuid={user} --regid="$(id -g {user})" --init-groups' in script
        assert "/usr/sbin/sackd -D --conf-server slurm-controller." in script
        assert f"install -o {user} -m 0400 /etc/slurm/slurm.key /run/sackd/slurm.key" in script
        assert "--key-file /run/sackd/slurm.key" in script and "--disable-reconfig" not in script
        assert f"chown {user}: /run/slurm /run/sackd" in script


def test_the_accounts_hook_sackd_does_not_register_for_pushes() -> None:
    """The hook Job ends: slurmctld would push to a gone address at every reconfigure."""
    objs = render(
        "slurm", "accounting.enabled=true", "accounting.mariadb.enabled=true",
        "accounting.accounts[0].name=physics",
    )  # fmt: skip
    jobs = [o for o in kinds(objs, "Job") if "sacctmgr" in str(o)]
    assert jobs and all("sackd --disable-reconfig" in str(j) for j in jobs)


def test_values_name_every_setting_that_restarts() -> None:
    """The list in values.yaml's comment is the template's."""
    root = CHARTS / "slurm"
    helpers = (root / "templates/_helpers.tpl").read_text()
    start = helpers.index('define "slurm.restartSettings"')
    pattern = helpers[start:].split("(?mi)^[ \\\\t]*(", 1)[1].split(")", 1)[0]
    comment = " ".join(
        line.lstrip("# ").strip()
        for line in (root / "values.yaml").read_text().split("slurmConfig:")[0].splitlines()
        if line.startswith("#")
    )
    for key in pattern.split("|"):
        named = key in comment or (
            key.startswith("AccountingStorage") and "AccountingStorageType/Host/Port" in comment
        )
        assert named, key


def test_slurmctld_has_a_reconfigure_container_on_its_config_and_etc() -> None:
    ss = one(render("slurm"), "StatefulSet")
    sidecar = container(ss, "reconfigure")
    assert {"name": "etc-slurm", "mountPath": "/etc/slurm"} in sidecar["volumeMounts"]
    assert {"name": "config", "mountPath": "/mnt/config", "readOnly": True} in sidecar[
        "volumeMounts"
    ]
    assert "scontrol reconfigure" in sidecar["command"][-1]
    # Its scontrol signs through slurmctld's sack socket (the test bed: "failed to connect
    # to any sack sockets" without it).
    sack = {"name": "run-slurmctld", "mountPath": "/run/slurmctld"}
    assert sack in sidecar["volumeMounts"] and sack in container(ss, "slurmctld")["volumeMounts"]
    annotations = ss["spec"]["template"]["metadata"]["annotations"]
    assert annotations["kubectl.kubernetes.io/default-container"] == "slurmctld"


# ---------------------------------------------------------------- the reconfigure script

FAKE_SCONTROL = """#!/bin/sh
echo "$*" >> "$FAKE/calls"
case "$1" in
  ping)
    if [ -e "$FAKE/down" ]; then echo "Slurmctld(primary) at c is DOWN"; exit 1; fi
    echo "Slurmctld(primary) at c is UP" ;;
  show)
    if grep -q BogusKey "$SLURM_CONF"; then
      echo "scontrol: error: _parse_next_key: Parsing error at unrecognized key: BogusKey" >&2
      echo "scontrol: fatal: Unable to process configuration file" >&2
      exit 1
    fi
    echo localhost ;;
  reconfigure)
    # slurmctld refuses a file it cannot use (here: a Refuse= line) or, in the foreground,
    # exits on it (here: a Crash= line).
    if grep -q Refuse "$SLURM_ETC/slurm.conf"; then
      echo "slurm_reconfigure error: Unspecified error" >&2
      exit 1
    fi
    if grep -q Crash "$SLURM_ETC/slurm.conf"; then touch "$FAKE/down"; fi ;;
esac
"""

# What post-event.py is given (RECONFIGURE_EVENT): TYPE REASON MESSAGE, a line each.
FAKE_EVENT = """#!/bin/sh
echo "$1 $2 $3" >> "$FAKE/events"
"""


class Sidecar:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.etc, self.src, self.fake = tmp / "etc", tmp / "src", tmp / "fake"
        for d in (self.etc, self.src, self.fake, tmp / "bin"):
            d.mkdir()
        for name, text in (("scontrol", FAKE_SCONTROL), ("record-event", FAKE_EVENT)):
            (tmp / "bin" / name).write_text(text)
            (tmp / "bin" / name).chmod(0o755)
        self.out = tmp / "out"

    def write(self, name: str, text: str) -> None:
        (self.src / name).write_text(text)

    def log(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    def calls(self) -> list[str]:
        path = self.fake / "calls"
        return path.read_text().splitlines() if path.exists() else []

    def events(self) -> list[str]:
        path = self.fake / "events"
        return path.read_text().splitlines() if path.exists() else []

    def wait_event(self, start: str, *words: str) -> str:
        """The one Event recorded that starts with `start` (type and reason) and has
        every word."""

        def found() -> list[str]:
            return [e for e in self.events() if e.startswith(start) and all(w in e for w in words)]

        self.wait_for(f"Event {start} {words}", lambda: bool(found()))
        (event,) = found()
        return event

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout} s; log:\n{self.log()}")
            time.sleep(0.05)


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    script = container(one(render("slurm"), "StatefulSet"), "reconfigure")["command"][-1]
    s = Sidecar(tmp_path)
    s.write("slurm.conf", "ClusterName=c\n")
    s.write("cgroup.conf", "CgroupPlugin=autodetect\n")
    s.write("healthcheck", "#!/bin/sh\n")  # not Slurm's: never copied
    for name in ("slurm.conf", "cgroup.conf"):
        (s.etc / name).write_text((s.src / name).read_text())
    (s.etc / "slurm.key").write_text("key")
    env = dict(
        os.environ,
        PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        FAKE=str(s.fake),
        SLURM_ETC=str(s.etc),
        CONFIG_SRC=str(s.src),
        RECONFIGURE_WORK=str(tmp_path / "work"),
        RECONFIGURE_PERIOD="0.1",
        RECONFIGURE_DEADLINE="2",
        RECONFIGURE_EVENT=str(tmp_path / "bin/record-event"),
    )
    with s.out.open("w") as out:
        proc = subprocess.Popen(["/bin/sh", "-c", script], env=env, stdout=out, stderr=out)
    try:
        yield s
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_sidecar_applies_a_change_refuses_what_slurm_refuses_and_keeps_the_last_good(
    sidecar: Sidecar,
) -> None:
    s = sidecar
    good = "ClusterName=c\nProlog=prolog-marker\n"
    s.write("prolog-marker", "#!/bin/sh\ntouch /tmp/marker\n")
    s.write("slurm.conf", good)
    s.wait_for("applied", lambda: "reconfigure: applied" in s.log())
    assert (s.etc / "slurm.conf").read_text() == good
    assert stat.S_IMODE((s.etc / "prolog-marker").stat().st_mode) == 0o755
    assert not (s.etc / "healthcheck").exists() and (s.etc / "slurm.key").read_text() == "key"
    assert s.calls().count("reconfigure") == 1
    # Each outcome is an Event on the pod too (post-event.py), naming the changed files.
    s.wait_event("Normal Reconfigured", "slurm.conf +prolog-marker", "applied")

    # Refused by Slurm's parser: not installed, not reconfigured, named once.
    s.write("slurm.conf", good + "BogusKey=1\n")
    s.wait_for("refusal", lambda: "refused by Slurm" in s.log())
    assert "Parsing error at unrecognized key: BogusKey" in s.log()
    assert (s.etc / "slurm.conf").read_text() == good
    assert s.calls().count("reconfigure") == 1
    s.wait_event(
        "Warning ConfigRefused",
        "slurm.conf:",
        "refused by Slurm's parser",
        "Parsing error at unrecognized key: BogusKey",
    )

    # Refused by slurmctld (scontrol reconfigure fails): the last good files go back.
    s.write("slurm.conf", good + "Refuse=1\n")
    s.wait_for("reconfigure refusal", lambda: "scontrol reconfigure refused it" in s.log())
    assert (s.etc / "slurm.conf").read_text() == good
    s.wait_event("Warning ConfigRefused", "scontrol reconfigure refused it", "Unspecified error")

    # slurmctld exits on what the parser took: the last good files go back.
    s.write("slurm.conf", good + "Crash=1\n")
    s.wait_for("restore", lambda: "did not answer" in s.log())
    assert (s.etc / "slurm.conf").read_text() == good
    assert (s.etc / "prolog-marker").exists()
    assert s.log().count("refused by Slurm") == 1, s.log()
    s.wait_event("Warning ConfigRefused", "did not answer within 2 s", "the last good files")
    assert len([e for e in s.events() if "ConfigRefused" in e]) == 3, s.events()

    # Back up, and a script removed from the values goes from /etc/slurm.
    (s.fake / "down").unlink()
    (s.src / "prolog-marker").unlink()
    s.write("slurm.conf", "ClusterName=c\n")
    s.wait_for(
        "second apply",
        lambda: (
            (s.etc / "slurm.conf").read_text() == "ClusterName=c\n"
            and not (s.etc / "prolog-marker").exists()
        ),
    )
    assert "-prolog-marker" in s.log()


def test_the_sidecar_waits_for_slurmctld_before_applying(sidecar: Sidecar) -> None:
    s = sidecar
    (s.fake / "down").touch()
    s.write("slurm.conf", "ClusterName=c\nMinJobAge=30\n")
    s.wait_for("pings", lambda: s.calls().count("ping") >= 3)
    assert "reconfigure" not in s.calls() and "refused" not in s.log()
    assert s.log().count("a change waits for slurmctld to answer: Slurmctld(primary)") == 1
    (s.fake / "down").unlink()
    s.wait_for("applied", lambda: "reconfigure: applied" in s.log())
    assert s.calls().count("reconfigure") == 1
