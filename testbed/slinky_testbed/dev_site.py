"""`make dev`: on a running test bed, the site a user installs, from the charts in helm/: the
CRDs, slurm-operator (its external metrics API on), the `slurm` chart (slurmctld, slurmrestd,
slurmdbd on the chart's MariaDB, login pods with sshd, users from the test bed's OpenLDAP
through SSSD, shared homes, job isolation on) and slurm-bridge. NodeSet `batch` is
autoscaled 0-4 by the chart's HPA; the bridge manages namespace `slurm-bridge` on the last
real node and the kwok nodes (EXTERNAL Slurm nodes).

Idempotent: `helm upgrade --install` of a release runs only when its chart or values changed
since the last `make dev` (or the release is not deployed), so a rerun changes nothing a
person or the HPA made. `python -m slinky_testbed.dev_site --dir D env` prints what `make
dev-env` adds to `slinky testbed env`: the site's addresses and the SSH login."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import secrets
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import jwt
import yaml

from slinky_testbed import dev, dev_bridge, ldap, paths
from slinky_testbed import site as s
from slinky_testbed.bed import Testbed

JSON = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
CHARTS = REPO / "helm"
NAMESPACE = "slurm"  # the slurm release and its namespace
OPERATOR_NAMESPACE = "slinky-system"
OPERATOR_RELEASE = "slurm-operator"
BRIDGE_RELEASE = "slurm-bridge"
CRDS_RELEASE = "slurm-operator-crds"
NODESET = f"{NAMESPACE}-compute-batch"  # the chart's name of NodeSet `batch`
USER = s.DANA.name
# hostPath volumes (each its own StorageClass), under <bed>/site/.
VOLUMES = {"statesave": "ReadWriteOnce", "mariadb": "ReadWriteOnce", "homes": "ReadWriteMany"}
FIELD_MANAGER = dev.FIELD_MANAGER


def work_dir(bed: Testbed) -> Path:
    return bed.dir / "site"


def pv_name(volume: str) -> str:
    return f"slurm-dev-{volume}"


def nodesets() -> list[JSON]:
    """`batch`, from 0 to 4 pods by its pending jobs (back to 0 30 s after the queue
    empties), the default partition. The bridge's Slurm nodes are EXTERNAL ones it
    registers, no NodeSet."""
    return [
        {
            "name": "batch",
            "partition": {"config": {"Default": "YES"}},
            "autoscaling": {
                "enabled": True,
                "minReplicas": 0,
                "maxReplicas": 4,
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 30}},
            },
        }
    ]


def slurm_values(public_key: str) -> JSON:
    values = s.slurm_values(
        namespace=NAMESPACE,
        operator_namespace=OPERATOR_NAMESPACE,
        operator_service_account=OPERATOR_RELEASE,
        storage_class=pv_name("statesave"),
        db_storage_class=pv_name("mariadb"),
        homes_claim="homes",
        directory_keys={USER: public_key},
        nodesets=nodesets(),
    )
    # No partition of every node: a job without -p would go to the bridge's EXTERNAL nodes
    # too, where no slurmd runs it.
    values["slurmConfig"] = {
        "allPartition": {"enabled": False},
        "extraSlurmConf": s.BRIDGE_PARTITION_CONF,
    }
    return values


def bridge_values() -> JSON:
    """The bridge's pods run in Slurm as dana, charged to her account (its tenancy policy):
    with accounting enforced, a placeholder job needs a user with an association."""
    values = s.bridge_values(
        scheduler_name=dev_bridge.SCHEDULER_NAME,
        restapi_url=f"http://{NAMESPACE}-restapi.{NAMESPACE}:6820",
        jwt_key_secret=f"{NAMESPACE}-jwt-key",
        managed_namespaces=[dev_bridge.MANAGED_NAMESPACE],
        taint_nodes=True,
    )
    values["sharedConfig"]["policy"] = s.tenancy_policy(
        dev_bridge.MANAGED_NAMESPACE, s.DANA.uid, s.ACCOUNT
    )
    return values


def operator_values() -> JSON:
    return {"operator": {"image": s.image("slinky")}}


def release_digest(chart: Path, values: JSON) -> str:
    """What a release was installed from: every file of the chart, and the values."""
    h = hashlib.sha256(json.dumps(values, sort_keys=True).encode())
    for f in sorted(p for p in chart.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(chart)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


class Site:
    """kubectl and helm on the test bed, and the state `make dev` keeps in <bed>/site."""

    def __init__(self, bed: Testbed) -> None:
        self.bed = bed
        self.work = work_dir(bed)
        self.kubectl = dev_bridge.kubectl_for(bed)

    def apply(self, objects: list[JSON]) -> None:
        """Server-side apply without force, one object at a time (dev.apply_sample): a field
        someone changed since keeps their value, and a line says so."""
        for obj in objects:
            dev.apply_sample(self.bed, obj)

    def helm(self, *args: str) -> str:
        out = subprocess.run(
            [str(paths.bin_dir() / "helm"), f"--kubeconfig={self.bed.kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise SystemExit(f"helm {' '.join(args)} failed:\n{out.stderr}")
        return out.stdout

    def deployed(self, release: str, namespace: str) -> bool:
        out = self.helm("list", "-n", namespace, "--filter", f"^{release}$", "-o", "json")
        return any(r.get("status") == "deployed" for r in json.loads(out or "[]"))

    def release(self, release: str, chart: str, namespace: str, values: JSON, *extra: str) -> bool:
        """`helm upgrade --install` unless the release is deployed from this chart and these
        values already (True: it ran)."""
        digest = release_digest(CHARTS / chart, values)
        stamp = self.work / f"{release}.digest"
        if self.deployed(release, namespace) and stamp.exists() and stamp.read_text() == digest:
            return False
        path = self.work / f"{release}-values.yaml"
        path.write_text(yaml.safe_dump(values, sort_keys=False))
        print(f"helm upgrade --install {release} helm/{chart} -n {namespace}", flush=True)
        self.helm(
            "upgrade", "--install", release, str(CHARTS / chart), "-n", namespace,
            "--create-namespace", "-f", str(path), "--wait", *extra,
        )  # fmt: skip
        stamp.write_text(digest)
        return True

    def fresh_volumes(self) -> None:
        """The data of `make dev`'s volumes belong to one cluster (a test bed's etcd lives in
        memory: each `up` makes a new one, told by kube-system's uid). Under a new cluster
        the data of the earlier one go (its MariaDB's password, made by that cluster's keys
        hook, would refuse the new slurmdbd); under the same cluster nothing is touched."""
        uid = self.kubectl("get", "namespace", "kube-system", "-o", "jsonpath={.metadata.uid}")
        stamp = self.work / "cluster-uid"
        if stamp.exists() and stamp.read_text() == uid.strip():
            return
        for volume in VOLUMES:
            shutil.rmtree(self.work / volume, ignore_errors=True)
        stamp.write_text(uid.strip())

    def volumes(self) -> None:
        self.apply(
            [s.hostpath_pv(pv_name(v), self.work / v, mode, "1Gi") for v, mode in VOLUMES.items()]
            + [s.homes_claim("homes", NAMESPACE, pv_name("homes"))]
        )

    def directory(self) -> None:
        """The test bed's OpenLDAP, holding dana (its admin password made once)."""
        pw_file = self.work / "ldap-password"
        if not pw_file.exists():
            pw_file.write_text(secrets.token_hex(12))
            pw_file.chmod(0o600)
        image = "{repository}:{tag}".format(**s.image("slurm"))
        self.apply(ldap.manifests(NAMESPACE, image, s.DIRECTORY, pw_file.read_text()))

    def pod(self, component: str, namespace: str = NAMESPACE, release: str = NAMESPACE) -> JSON:
        """A Running pod of the component, not being deleted."""
        selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component={component}"
        got = json.loads(self.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json"))
        for p in got["items"]:
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp"):
                return dict(p)
        raise SystemExit(f"no Running {component} pod of release {release} in {namespace}")

    def pod_ip(self, component: str) -> str:
        return str(self.pod(component)["status"]["podIP"])

    @property
    def key(self) -> Path:
        return self.work / f"id_{USER}"

    def ssh_config(self) -> Path:
        """~/.ssh/config-style file naming the login pod (Host `login`): its address now,
        dana, the ready key, known hosts of its own."""
        path = self.work / "ssh_config"
        path.write_text(
            f"Host login\n  HostName {self.pod_ip('login')}\n  User {USER}\n"
            f"  IdentityFile {self.key}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.work / 'known_hosts'}\n"
            "  StrictHostKeyChecking accept-new\n  BatchMode yes\n  LogLevel ERROR\n"
        )
        return path

    def ssh(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ssh", "-F", str(self.ssh_config()), "-o", "ConnectTimeout=5", "login", command],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def first_login(self, timeout: float = 120) -> None:
        """dana logs in over SSH once (pam_mkhomedir makes her home): sshd answers and the
        key works, or `make dev` fails naming what ssh said."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = self.ssh("true")
            except SystemExit as e:  # no login pod Running yet
                got = subprocess.CompletedProcess([], 255, "", str(e))
            if got.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"ssh {USER}@login failed ({got.returncode}): {got.stderr}")
            time.sleep(1)

    def slurm_commands(self) -> None:
        """The script the test bed's Slurm commands (`slinky testbed env` PATH) run through:
        kubectl exec into the login pod's sshd container, runuser to dana, in her home."""
        kubectl = shlex.join(
            [str(paths.bin_dir() / "kubectl"), f"--kubeconfig={self.bed.kubeconfig}"]
        )
        inner = 'cd "$HOME" 2>/dev/null || cd /; exec "$@"'
        script = (
            "#!/bin/sh\n"
            f"# Slurm's commands as {USER} (from the directory) in the login pod of `make dev`.\n"
            f"exec {kubectl} -n {NAMESPACE} exec -i deploy/{NAMESPACE}-login -c sshd -- "
            f'runuser -u {USER} -- sh -c {shlex.quote(inner)} sh "$@"\n'
        )
        path = self.bed.dir / "slurm-commands"
        path.write_text(script)
        path.chmod(0o755)

    def env(self) -> dict[str, str]:
        """What `make dev-env` exports on top of the test bed's: the site's slurmrestd and
        slurmctld (pod addresses, which the host reaches), a token for them, the SSH file."""
        secret = self.kubectl(
            "get", "secret", "-n", NAMESPACE, f"{NAMESPACE}-jwt-key",
            "-o", "jsonpath={.data.jwt_hs256\\.key}",
        )  # fmt: skip
        now = int(time.time())
        token = jwt.encode(
            {"sun": "slurm", "iat": now, "exp": now + 3600}, base64.b64decode(secret), "HS256"
        )
        return {
            "SLURM_REST_URL": f"http://{self.pod_ip('restapi')}:6820",
            "SLURM_JWT": token,
            "SLURMCTLD_ADDR": f"{self.pod_ip('controller')}:6817",
            "SLINKY_SSH_CONFIG": str(self.ssh_config()),
        }


def install(bed: Testbed) -> None:
    running = [n for n, up in (("operator", dev.operator_running), ("bridge", dev_bridge.running))
               if up(bed)]  # fmt: skip
    if running:
        raise SystemExit(
            f"test bed {bed.dir} runs {' and '.join(running)} as processes (slinky_testbed.dev, "
            "the earlier `make dev`): `make dev-down` first, then `make dev` installs the charts"
        )
    site = Site(bed)
    site.work.mkdir(exist_ok=True)
    site.fresh_volumes()
    dev_bridge.reserve_node(bed)  # before any pod exists: nothing but the bridge's lands there
    namespaces = (OPERATOR_NAMESPACE, NAMESPACE, dev_bridge.MANAGED_NAMESPACE)
    site.apply(
        [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces]
    )
    site.volumes()
    site.directory()
    public_key = s.keygen(site.key)
    site.release(CRDS_RELEASE, "slurm-operator-crds", OPERATOR_NAMESPACE, {}, "--take-ownership")
    site.release(
        OPERATOR_RELEASE, "slurm-operator", OPERATOR_NAMESPACE, operator_values(),
        "--timeout", "4m",
    )  # fmt: skip
    site.release(NAMESPACE, "slurm", NAMESPACE, slurm_values(public_key), "--timeout", "10m")
    # The scheduler-plugins PodGroup CRD, so a gang can be tried (see the README), before the
    # bridge starts watching.
    site.kubectl(
        "apply", "--server-side", f"--field-manager={FIELD_MANAGER}",
        "-f", str(dev_bridge.PODGROUP_CRD),
    )  # fmt: skip
    site.release(BRIDGE_RELEASE, "slurm-bridge", NAMESPACE, bridge_values(), "--timeout", "4m")
    for node in dev_bridge.bridge_nodes(site.kubectl):
        dev_bridge.give_internal_ip(site.kubectl, node)
        site.kubectl("label", "--overwrite", "node", node, f"{dev_bridge.EXTERNAL_NODE_LABEL}=true")
    site.slurm_commands()
    site.first_login()
    print(f"""
Slinky dev site is up ({bed.dir}), installed from helm/:
  {OPERATOR_NAMESPACE}: slurm-operator (its external metrics API on) and the CRDs
  {NAMESPACE}: slurmctld, slurmrestd, slurmdbd + MariaDB, login (sshd), OpenLDAP (user {USER}),
    NodeSet {NODESET} (partition batch, HPA 0-4), slurm-bridge (partition slurm-bridge,
    managing namespace {dev_bridge.MANAGED_NAMESPACE})

  eval "$(make -s dev-env)"   # KUBECONFIG; kubectl, helm; sinfo, sbatch, squeue, sacct, ...
                              # run in the login pod as {USER}; the ssh command
  ssh -F {site.work / "ssh_config"} login

Stop everything with `make dev-down`.""")


def print_env(bed: Testbed) -> None:
    site = Site(bed)
    if not (bed.dir / "slurm-commands").exists():
        return  # a test bed without `make dev`'s site: the test bed's env alone
    for k, v in site.env().items():
        print(f"export {k}={shlex.quote(v)}")
    addr = site.pod_ip("login")
    print(
        f'# ssh into the login pod as {USER} (LDAP):  ssh -F "$SLINKY_SSH_CONFIG" login\n'
        f"#   that is: ssh -i {site.key} -o UserKnownHostsFile={site.work / 'known_hosts'}"
        f" {USER}@{addr}"
    )


def main() -> None:
    p = argparse.ArgumentParser(prog="slinky-dev-site")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("what", nargs="?", choices=("install", "env"), default="install")
    args = p.parse_args()
    bed = Testbed(args.dir)
    if args.what == "env":
        print_env(bed)
    else:
        install(bed)


if __name__ == "__main__":
    main()
