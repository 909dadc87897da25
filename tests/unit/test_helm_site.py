"""The slurm chart's site pieces, rendered with the cached helm binary: accounting with the
chart's MariaDB or a database the user names, the accounts hook (its script run against a
stand-in sacctmgr), users and groups for nss extrausers, login pods with sshd, and homes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from slinky.operator.keys import Key
from tests.unit.test_helm_charts import (
    CHARTS,
    HELM,
    helm,
    keys_hook,
    kinds,
    one,
    render,
    render_values,
)

JSON = dict[str, Any]

pytestmark = pytest.mark.skipif(
    not HELM.exists(), reason=f"{HELM} not built (`make testbed-build` builds it)"
)

ALICE = {"name": "alice", "uid": 2001, "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3 alice@x"]}
BOB = {"name": "bob", "uid": 2002, "gid": 3000, "gecos": "Bob B", "shell": "/bin/sh"}


def pod_spec(obj: JSON) -> JSON:
    return dict(obj["spec"]["template"]["spec"])


def container(spec: JSON, name: str) -> JSON:
    return next(c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name)


def mounts(c: JSON) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}


def volumes(spec: JSON) -> dict[str, JSON]:
    return {v["name"]: v for v in spec.get("volumes", [])}


def slurm_conf(objs: list[JSON]) -> list[str]:
    return str(one(objs, "ConfigMap", "slurm-config")["data"]["slurm.conf"]).splitlines()


def failure(*sets: str) -> str:
    args = ["template", "slurm", str(CHARTS / "slurm"), "-n", "slurm"]
    for s in sets:
        args += ["--set", s]
    out = helm(*args, check=False)
    assert out.returncode != 0, "rendered"
    return out.stderr


# ---------------------------------------------------------------- accounting


def test_the_charts_mariadb_gets_a_made_password_that_slurmdbd_and_mariadb_both_read() -> None:
    objs = render("slurm", "accounting.enabled=true", "accounting.mariadb.enabled=true")
    # Made by the keys hook when missing (24 letters and digits), never rendered; not the
    # release's, so it stays with the data volume it opens.
    assert not [o for o in kinds(objs, "Secret") if o["metadata"]["name"] == "slurm-mariadb"]
    _, made, _ = keys_hook(objs)
    assert made["slurm-mariadb/password"] == Key("slurm-mariadb", "password", "alnum", "24")

    db = one(objs, "StatefulSet", "slurm-mariadb")
    spec = pod_spec(db)
    mariadb = container(spec, "mariadb")
    assert mariadb["args"][0] == "mariadbd"
    assert "--innodb-snapshot-isolation=OFF" in mariadb["args"]
    env = {e["name"]: e for e in mariadb["env"]}
    assert env["MARIADB_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "slurm-mariadb",
        "key": "password",
    }
    assert env["MARIADB_DATABASE"]["value"] == "slurm_acct_db"
    assert mounts(mariadb) == {"/var/lib/mysql": "data"}
    claim = db["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    assert one(objs, "Service", "slurm-mariadb")["spec"]["ports"][0]["port"] == 3306

    dbd = pod_spec(one(objs, "Deployment", "slurm-accounting"))
    conf_init = container(dbd, "slurmdbd-conf")
    script = conf_init["command"][2]
    assert "StorageHost=slurm-mariadb\n" in script
    assert "PidFile=/run/slurmdbd/slurmdbd.pid" in script
    assert conf_init["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "slurm-mariadb"
    assert container(dbd, "slurmdbd")["args"] == ["slurmdbd", "-D"]
    assert dbd["automountServiceAccountToken"] is False
    # No checksum of a password (a render has none to sum).
    assert "annotations" not in db["spec"]["template"]["metadata"]


def test_a_named_database_and_secret_run_no_mariadb() -> None:
    objs = render(
        "slurm",
        "accounting.enabled=true",
        "accounting.storage.host=db.site",
        "accounting.storage.passwordSecretRef.name=site-db",
    )
    assert not [o for o in objs if "mariadb" in o["metadata"]["name"]]
    dbd = pod_spec(one(objs, "Deployment", "slurm-accounting"))
    assert "StorageHost=db.site\n" in container(dbd, "slurmdbd-conf")["command"][2]


def test_the_charts_mariadb_with_a_named_password_secret_makes_none() -> None:
    objs = render(
        "slurm",
        "accounting.enabled=true",
        "accounting.mariadb.enabled=true",
        "accounting.storage.passwordSecretRef.name=mine",
    )
    assert not [o for o in kinds(objs, "Secret") if o["metadata"]["name"] == "slurm-mariadb"]
    env = container(pod_spec(one(objs, "StatefulSet", "slurm-mariadb")), "mariadb")["env"]
    assert {e["name"]: e for e in env}["MARIADB_PASSWORD"]["valueFrom"]["secretKeyRef"][
        "name"
    ] == "mine"


def test_accounting_without_a_database_is_refused_naming_both_ways() -> None:
    err = failure("accounting.enabled=true", "accounting.storage.passwordSecretRef.name=x")
    assert "accounting.storage.host is required" in err
    assert "accounting.mariadb.enabled=true" in err


def test_slurmctld_waits_for_accounting_at_its_first_start_and_enforces_what_is_asked() -> None:
    objs = render(
        "slurm",
        "accounting.enabled=true",
        "accounting.mariadb.enabled=true",
        "accounting.enforce=associations\\,limits\\,qos",
    )
    conf = slurm_conf(objs)
    assert "AccountingStorageEnforce=associations,limits,qos" in conf
    ctld = container(pod_spec(one(objs, "StatefulSet", "slurm-controller")), "slurmctld")
    assert ctld["startupProbe"]["failureThreshold"] * ctld["startupProbe"]["periodSeconds"] >= 3600
    plain = container(
        pod_spec(one(render("slurm"), "StatefulSet", "slurm-controller")), "slurmctld"
    )
    assert "startupProbe" not in plain
    assert not [line for line in slurm_conf(render("slurm")) if "Enforce" in line]


def test_an_enforce_value_that_is_not_a_list_of_words_is_refused() -> None:
    assert "enforce" in failure("accounting.enforce=associations;rm")


# ---------------------------------------------------------------- the accounts hook

SITE_ACCOUNTS: JSON = {
    "accounting": {
        "enabled": True,
        "mariadb": {"enabled": True},
        "qos": [{"name": "short", "options": {"MaxWall": "1:00:00"}}],
        "accounts": [
            {"name": "physics", "description": "it's physics"},
            {"name": "hep", "parent": "physics", "options": {"GrpTRES": "cpu=8"}},
        ],
        "users": [
            {
                "name": "alice",
                "account": "physics",
                "accounts": ["hep"],
                "qos": ["normal", "short"],
            },
        ],
    }
}


def apply_script(tmp_path: Path) -> str:
    objs = render_values("slurm", SITE_ACCOUNTS, tmp_path)
    cm = one(objs, "ConfigMap", "slurm-accounts")
    # The script is part of the release (there before the hook runs, gone on uninstall).
    assert "helm.sh/hook" not in (cm["metadata"].get("annotations") or {})
    job = one(objs, "Job", "slurm-accounts")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    spec = pod_spec(job)
    assert spec["automountServiceAccountToken"] is False
    assert (
        "sackd --disable-reconfig --conf-server slurm-controller.slurm.svc.cluster.local:6817"
        in (spec["containers"][0]["command"][4])
    )
    return str(cm["data"]["apply.sh"])


def run_apply(tmp_path: Path, script: str, existing: bool) -> list[list[str]]:
    """The hook's script against a stand-in sacctmgr that logs its arguments (one per line,
    calls separated by ---): the cluster is there; other `list`s find records when
    `existing`; every `modify` changes nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls"
    log.write_text("")
    fake = bin_dir / "sacctmgr"
    fake.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do printf "%s\\n" "$a" >> {log}; done; echo --- >> {log}\n'
        'case " $* " in\n'
        '  *" list cluster "*) echo slurm ;;\n'
        f'  *" list "*) {"echo found" if existing else ":"} ;;\n'
        '  *" modify "*) echo " Nothing modified"; exit 1 ;;\n'
        "esac\n"
    )
    fake.chmod(0o755)
    (tmp_path / "apply.sh").write_text(script)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    out = subprocess.run(
        ["sh", str(tmp_path / "apply.sh")],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    calls = log.read_text().split("---\n")
    return [c.splitlines() for c in calls if c.strip()]


def test_the_accounts_hook_adds_what_is_missing_and_sets_what_is_given(tmp_path: Path) -> None:
    script = apply_script(tmp_path)
    calls = run_apply(tmp_path, script, existing=False)
    adds = [c for c in calls if "add" in c]
    assert ["-i", "add", "qos", "short"] in adds
    assert [
        "-i", "add", "account", "physics", "cluster=slurm",
        "description=it's physics", "organization=physics",
    ] in adds  # fmt: skip
    assert ["-i", "add", "account", "hep", "cluster=slurm", "description=hep",
            "organization=hep", "parent=physics"] in adds  # fmt: skip
    assert ["-i", "add", "user", "alice", "account=physics", "cluster=slurm"] in adds
    assert ["-i", "add", "user", "alice", "account=hep", "cluster=slurm"] in adds
    sets = [c for c in calls if "modify" in c]
    assert ["-i", "modify", "qos", "where", "name=short", "set", "MaxWall=1:00:00"] in sets
    assert [
        "-i", "modify", "user", "where", "name=alice", "cluster=slurm", "set",
        "DefaultAccount=physics", "QOS=normal,short",
    ] in sets  # fmt: skip


def test_the_accounts_hook_run_again_adds_nothing(tmp_path: Path) -> None:
    calls = run_apply(tmp_path, apply_script(tmp_path), existing=True)
    assert not [c for c in calls if "add" in c]
    assert [c for c in calls if "modify" in c]


def test_no_accounts_no_hook() -> None:
    objs = render("slurm", "accounting.enabled=true", "accounting.mariadb.enabled=true")
    assert not [o for o in objs if o["metadata"]["name"] == "slurm-accounts"]


# ---------------------------------------------------------------- users, login, homes


def test_users_and_groups_become_extrausers_files_every_slurm_pod_reads(tmp_path: Path) -> None:
    values = {
        "users": [ALICE, BOB],
        "groups": [{"name": "physics", "gid": 4000, "members": ["alice", "bob"]}],
        "compute": {"nodesets": [{"name": "batch"}]},
    }
    objs = render_values("slurm", values, tmp_path)
    data = one(objs, "ConfigMap", "slurm-users")["data"]
    assert data["passwd"].splitlines() == [
        "alice:x:2001:2001::/home/alice:/bin/bash",
        "bob:x:2002:3000:Bob B:/home/bob:/bin/sh",
    ]
    assert data["group"].splitlines() == ["alice:x:2001:", "physics:x:4000:alice,bob"]
    assert [line.split(":")[:2] for line in data["shadow"].splitlines()] == [
        ["alice", "*"],
        ["bob", "*"],
    ]
    ctld = pod_spec(one(objs, "StatefulSet", "slurm-controller"))
    nodeset = one(objs, "NodeSet", "slurm-compute-batch")["spec"]["template"]["spec"]
    for spec, name in ((ctld, "slurmctld"), (nodeset, "slurmd")):
        assert mounts(container(spec, name))["/var/lib/extrausers"] == "users"
        assert volumes(spec)["users"]["configMap"]["name"] == "slurm-users"
    # Without users nothing is mounted.
    assert "users" not in volumes(pod_spec(one(render("slurm"), "StatefulSet", "slurm-controller")))


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ({"name": "root", "uid": 2000}, '"root" is a user of the image'),
        ({"name": "eve", "uid": 12}, "minimum"),
        ({"name": "Eve:x", "uid": 2000}, "/users/0/name"),
    ],
)
def test_bad_users_are_refused_naming_the_field(tmp_path: Path, user: JSON, message: str) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump({"users": [user]}))
    out = helm("template", "x", str(CHARTS / "slurm"), "-f", str(path), check=False)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr


def test_a_user_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump({"users": [ALICE, {**BOB, "name": "alice"}]}))
    out = helm("template", "x", str(CHARTS / "slurm"), "-f", str(path), check=False)
    assert 'users[1].name: "alice" is used twice' in out.stderr


def test_login_pods_run_sackd_and_sshd_with_kept_host_keys_and_users_keys(tmp_path: Path) -> None:
    values = {
        "login": {"enabled": True, "service": {"type": "NodePort", "nodePort": 30022}},
        "users": [ALICE, BOB],
        "homes": {"existingClaim": "homes"},
        "compute": {"nodesets": [{"name": "batch"}]},
    }
    objs = render_values("slurm", values, tmp_path)
    login = one(objs, "Deployment", "slurm-login")
    spec = pod_spec(login)
    assert spec["automountServiceAccountToken"] is False
    sackd, sshd = container(spec, "sackd"), container(spec, "sshd")
    assert (
        "/usr/sbin/sackd -D --conf-server slurm-controller.slurm.svc.cluster.local:6817"
        in (sackd["args"][-1])
    )
    assert sshd["args"] == ["/usr/sbin/sshd", "-D", "-e", "-f", "/etc/slinky-ssh/sshd_config"]
    # The client commands in the sshd container use sackd's socket and configuration.
    assert mounts(sackd)["/run/slurm"] == mounts(sshd)["/run/slurm"] == "run-slurm"
    assert mounts(sshd)["/home"] == "homes"
    assert mounts(sshd)["/var/lib/extrausers"] == "users"
    assert volumes(spec)["homes"]["persistentVolumeClaim"]["claimName"] == "homes"
    assert volumes(spec)["ssh-host-keys"]["secret"]["secretName"] == "slurm-ssh-host-keys"

    # The host key: made once by the keys hook (ssh-keygen in the login image), never rendered.
    assert not [o for o in kinds(objs, "Secret") if o["metadata"]["name"] == "slurm-ssh-host-keys"]
    job, made, _ = keys_hook(objs)
    path = "/keys/ssh_host_ecdsa_key"
    assert made["slurm-ssh-host-keys/ssh_host_ecdsa_key"] == Key(
        "slurm-ssh-host-keys", "ssh_host_ecdsa_key", "file", path
    )
    keygen = container(pod_spec(job), "ssh-keygen")
    assert keygen["image"] == "localhost/slinky/slurm:26.05"
    assert f"ssh-keygen -q -t ecdsa -b 256 -m PEM -N '' -C '' -f {path}" in keygen["command"][2]
    assert mounts(keygen) == {"/keys": "keys"} == mounts(container(pod_spec(job), "keys"))
    assert volumes(pod_spec(job))["keys"]["emptyDir"] == {"medium": "Memory"}
    conf = one(objs, "ConfigMap", "slurm-ssh")["data"]["sshd_config"].splitlines()
    for line in (
        "HostKey /etc/ssh/host-keys/ssh_host_ecdsa_key",
        "PermitRootLogin no",
        "PasswordAuthentication no",
        "AuthorizedKeysCommand /usr/bin/cat /etc/ssh/authorized-keys/%u",
        "AuthorizedKeysCommandUser nobody",
        "AllowTcpForwarding no",
    ):
        assert line in conf
    keys = one(objs, "Secret", "slurm-authorized-keys")["stringData"]
    assert keys == {"alice": "ssh-ed25519 AAAAC3 alice@x\n"}

    svc = one(objs, "Service", "slurm-login")["spec"]
    assert svc["type"] == "NodePort"
    assert svc["ports"][0] == {"name": "ssh", "port": 22, "targetPort": "ssh", "nodePort": 30022}

    nodeset = one(objs, "NodeSet", "slurm-compute-batch")["spec"]["template"]["spec"]
    assert mounts(container(nodeset, "slurmd"))["/home"] == "homes"
    # srun on the login pod and slurmd forwarding a step reach NodeSet pods by node name.
    # Every slurmd pod resolves in the release's one slurmd Service (by its Slurm node name).
    search = ["slurm-slurmd.slurm.svc.cluster.local"]
    assert spec["dnsConfig"] == nodeset["dnsConfig"] == {"searches": search}
    # Users' jobs and logins cannot act as the pod against the Kubernetes API.
    assert nodeset["automountServiceAccountToken"] is False
    ctld = pod_spec(one(objs, "StatefulSet", "slurm-controller"))
    assert "/home" not in mounts(container(ctld, "slurmctld"))


def test_login_service_is_cluster_ip_by_default() -> None:
    objs = render("slurm", "login.enabled=true")
    assert one(objs, "Service", "slurm-login")["spec"]["type"] == "ClusterIP"
    assert "nodePort" not in one(objs, "Service", "slurm-login")["spec"]["ports"][0]


def test_an_unknown_login_service_type_is_refused() -> None:
    assert "/login/service/type" in failure("login.enabled=true", "login.service.type=Ingress")


def test_ssh_to_compute_pods_runs_sshd_beside_slurmd_with_adoption_into_jobs(
    tmp_path: Path,
) -> None:
    values = {
        "compute": {"ssh": {"enabled": True}, "nodesets": [{"name": "batch"}]},
        "users": [ALICE],
    }
    objs = render_values("slurm", values, tmp_path)
    assert "PrologFlags=Contain" in slurm_conf(objs)
    spec = one(objs, "NodeSet", "slurm-compute-batch")["spec"]["template"]["spec"]
    slurmd = container(spec, "slurmd")
    assert {"name": "SLURMD_SSHD", "value": "1"} in slurmd["env"]
    assert slurmd["ports"] == [{"name": "ssh", "containerPort": 22}]
    got = mounts(slurmd)
    assert got["/etc/slinky-ssh"] == "ssh-config"
    assert got["/mnt/ssh-host-keys"] == "ssh-host-keys"
    assert got["/etc/ssh/authorized-keys"] == "authorized-keys"
    # Without login pods the host key, sshd_config and the users' keys are there all the same.
    assert "slurm-ssh-host-keys/ssh_host_ecdsa_key" in keys_hook(objs)[1]
    one(objs, "ConfigMap", "slurm-ssh")
    assert one(objs, "Secret", "slurm-authorized-keys")["stringData"]["alice"]
    assert "slurm-login" not in [d["metadata"]["name"] for d in kinds(objs, "Deployment")]
    # Off by default: no sshd, no extern step.
    plain = render("slurm")
    assert "PrologFlags=Contain" not in slurm_conf(plain)
    assert "slurm-ssh-host-keys/ssh_host_ecdsa_key" not in keys_hook(plain)[1]


def test_the_entrypoint_puts_pam_slurm_adopt_in_sshds_account_stack() -> None:
    entrypoint = (CHARTS.parent / "images/slurm/slurm-entrypoint").read_text()
    assert "account required pam_slurm_adopt.so action_adopt_failure=deny" in entrypoint
    assert "@include common-account" in entrypoint


# ---------------------------------------------------------------- users from a directory

SSSD: JSON = {
    "enabled": True,
    "uri": "ldap://ldap.site",
    "baseDn": "dc=site,dc=org",
    "bindDn": "cn=reader,dc=site,dc=org",
    "bindPasswordSecretRef": {"name": "ldap-reader"},
}


def test_sssd_runs_as_a_sidecar_wherever_users_are_resolved(tmp_path: Path) -> None:
    values = {
        "sssd": SSSD,
        "login": {"enabled": True, "authorizedKeys": {"dana": ["ssh-ed25519 AAAA dana@x"]}},
        "users": [ALICE],
        "compute": {"nodesets": [{"name": "batch"}]},
    }
    objs = render_values("slurm", values, tmp_path)
    conf = one(objs, "ConfigMap", "slurm-sssd")["data"]["sssd.conf"].splitlines()
    for line in (
        "ldap_uri = ldap://ldap.site",
        "ldap_search_base = dc=site,dc=org",
        "ldap_default_bind_dn = cn=reader,dc=site,dc=org",
        "ldap_id_use_start_tls = true",
        "ldap_tls_reqcert = demand",
    ):
        assert line in conf
    # The password is not in the ConfigMap: the sidecar adds it from the Secret.
    assert not [line for line in conf if "authtok" in line]
    pods = {
        "slurmctld": pod_spec(one(objs, "StatefulSet", "slurm-controller")),
        "sshd": pod_spec(one(objs, "Deployment", "slurm-login")),
        "slurmd": one(objs, "NodeSet", "slurm-compute-batch")["spec"]["template"]["spec"],
    }
    for main, spec in pods.items():
        sidecar = next(c for c in spec["initContainers"] if c["name"] == "sssd")
        assert sidecar["restartPolicy"] == "Always"
        assert sidecar["env"][0]["valueFrom"]["secretKeyRef"] == {
            "name": "ldap-reader",
            "key": "password",
        }
        assert mounts(sidecar)["/var/lib/sss/pipes"] == "sssd-pipes"
        assert mounts(container(spec, main))["/var/lib/sss/pipes"] == "sssd-pipes"
        assert volumes(spec)["sssd-pipes"] == {"name": "sssd-pipes", "emptyDir": {}}
    # Keys of directory users and of declared users, side by side.
    keys = one(objs, "Secret", "slurm-authorized-keys")["stringData"]
    assert keys == {"alice": "ssh-ed25519 AAAAC3 alice@x\n", "dana": "ssh-ed25519 AAAA dana@x\n"}
    assert "sssd" not in [
        c["name"]
        for c in pod_spec(one(render("slurm"), "StatefulSet", "slurm-controller"))["initContainers"]
    ]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["sssd.enabled=true", "sssd.baseDn=dc=x"], "sssd.uri is required"),
        (["sssd.enabled=true", "sssd.uri=ldap://x"], "sssd.baseDn is required"),
        (
            ["sssd.enabled=true", "sssd.uri=ldap://x", "sssd.baseDn=dc=x", "sssd.bindDn=cn=r"],
            "sssd.bindPasswordSecretRef.name is required",
        ),
        (["sssd.uri=http://x"], "/sssd/uri"),
    ],
)
def test_incomplete_sssd_values_are_refused_naming_the_key(sets: list[str], message: str) -> None:
    assert message in failure(*sets)


def test_shared_sockets_are_read_only_where_users_run(tmp_path: Path) -> None:
    values = {
        "sssd": SSSD,
        "login": {"enabled": True},
        "compute": {"ssh": {"enabled": True}, "nodesets": [{"name": "batch"}]},
    }
    objs = render_values("slurm", values, tmp_path)
    login = pod_spec(one(objs, "Deployment", "slurm-login"))
    nodeset = one(objs, "NodeSet", "slurm-compute-batch")["spec"]["template"]["spec"]
    ro = {
        (m["mountPath"], m.get("readOnly", False))
        for c in (container(login, "sshd"), container(nodeset, "slurmd"))
        for m in c["volumeMounts"]
        if m["mountPath"] in ("/run/slurm", "/var/lib/sss/pipes")
    }
    assert ro == {("/run/slurm", True), ("/var/lib/sss/pipes", True)}
    sidecar = container(login, "sssd")
    assert "chmod 0755 /var/lib/sss/pipes" in sidecar["command"][4]
    conf = one(objs, "ConfigMap", "slurm-sssd")["data"]["sssd.conf"]
    assert "min_id = 1000" in conf.splitlines()
    # A new sssd configuration restarts the login pod, not the NodeSet pods.
    login_obj = one(objs, "Deployment", "slurm-login")
    assert "checksum/sssd" in login_obj["spec"]["template"]["metadata"]["annotations"]
    nodeset_meta = one(objs, "NodeSet", "slurm-compute-batch")["spec"]["template"]["metadata"]
    assert "checksum/sssd" not in nodeset_meta.get("annotations", {})


def test_users_with_slurm_users_uid_range_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump({"users": [{"name": "eve", "uid": 64030}]}))
    out = helm("template", "x", str(CHARTS / "slurm"), "-f", str(path), check=False)
    assert "/users/0/uid" in out.stderr, out.stderr


def test_hybrid_mode_renders_what_nodeset_pods_mount(tmp_path: Path) -> None:
    values = {
        "external": {"enabled": True, "controllerHost": "ctld", "restapiUrl": "http://r:6820"},
        "slurmKey": {"existingSecret": "k"},
        "jwtKey": {"existingSecret": "j"},
        "users": [ALICE],
        "sssd": SSSD,
        "compute": {"ssh": {"enabled": True}, "nodesets": [{"name": "batch"}]},
    }
    objs = render_values("slurm", values, tmp_path)
    spec = one(objs, "NodeSet", "slurm-compute-batch")["spec"]["template"]["spec"]
    names = {o["metadata"]["name"] for o in objs if o["kind"] in ("ConfigMap", "Secret")}
    names |= {k.secret for k in keys_hook(objs)[1].values()}  # made by the keys hook
    for v in spec["volumes"]:
        ref = (v.get("configMap") or {}).get("name") or (v.get("secret") or {}).get("secretName")
        if ref and ref not in ("k", "j") and not (v.get("secret") or {}).get("optional"):
            assert ref in names, (v, names)


def test_ssh_to_compute_pods_needs_cgroup_isolation() -> None:
    err = failure("compute.ssh.enabled=true", "slurmConfig.jobIsolation=none")
    assert "compute.ssh.enabled needs slurmConfig.jobIsolation cgroup" in err


def test_a_user_named_like_a_yaml_boolean_keeps_its_key_file_name(tmp_path: Path) -> None:
    values = {"login": {"enabled": True, "authorizedKeys": {"on": ["ssh-ed25519 AAAA on@x"]}}}
    objs = render_values("slurm", values, tmp_path)
    assert one(objs, "Secret", "slurm-authorized-keys")["stringData"] == {
        "on": "ssh-ed25519 AAAA on@x\n"
    }
