"""A Slurm site as the charts install it on the test bed, in pieces `make dev`
(slinky_testbed.dev_site) and tests/e2e/test_site.py share: the directory (OpenLDAP, with the
user `dana`), the values of the slurm and slurm-bridge charts, hostPath volumes and claims,
SSH keys. Pure functions of their arguments (manifests and values as dicts), except keygen."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from slinky_testbed import ldap, nodes

JSON = dict[str, Any]

# The directory's user (slapd, read by SSSD on every Slurm pod), and its group.
DANA = ldap.User("dana", 5001, groups=("ldapusers",))
DIRECTORY = ldap.Directory(users=(DANA,), groups={"ldapusers": 6000})
# dana's Slurm account (accounting.enforce: a user needs an association to submit).
ACCOUNT = "physics"
# What slurmd tells Slurm of each pod (the test bed's nodes are the host: any size is a lie).
NODE_CONFIG = "CPUs=2 RealMemory=1000"
# EXTERNAL nodes the bridge registers join its partition through slurm.conf (docs/bridge.md).
BRIDGE_PARTITION_CONF = (
    "NodeSet=slurm-bridge Feature=slurm-bridge\n"
    "PartitionName=slurm-bridge Nodes=slurm-bridge MaxTime=UNLIMITED State=UP\n"
)


def image(name: str) -> JSON:
    """The chart's image keys for an image `make images` built."""
    repository, tag = nodes.image_ref(name).rsplit(":", 1)
    return {"repository": repository, "tag": tag}


def keygen(path: Path) -> str:
    """An ed25519 key pair at `path` (private, mode 0600) and `path`.pub, made once: an
    existing pair is kept. Its public key."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
            check=True,
        )
    path.chmod(0o600)
    return Path(f"{path}.pub").read_text().strip()


def hostpath_pv(name: str, path: Path, mode: str, size: str) -> JSON:
    """A PV on a host directory (every real node of the test bed shares the host's file
    system, so ReadWriteMany holds), of its own StorageClass `name`."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "storageClassName": name,
            "capacity": {"storage": size},
            "accessModes": [mode],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
        },
    }


def homes_claim(name: str, namespace: str, storage_class: str) -> JSON:
    """The users' homes (the chart's homes.existingClaim): ReadWriteMany."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "storageClassName": storage_class,
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def slurm_values(
    *,
    namespace: str,
    operator_namespace: str,
    operator_service_account: str,
    storage_class: str,
    db_storage_class: str,
    homes_claim: str,
    directory_keys: dict[str, str],
    nodesets: list[JSON],
) -> JSON:
    """The slurm chart's values of a site: slurmctld's state and MariaDB on the given
    StorageClasses, accounting enforced (account `physics`, dana in it), login pods with
    sshd, the directory's users through SSSD (`directory_keys`: their SSH public keys),
    homes on a claim, SSH to compute pods, job isolation as the chart's default (cgroup),
    and `nodesets` (each entry as the chart takes it)."""
    return {
        "image": {**image("slurm"), "pullPolicy": "IfNotPresent"},
        "operator": {
            "namespace": operator_namespace,
            "serviceAccountName": operator_service_account,
        },
        "controller": {
            "persistence": {
                "storageClassName": storage_class,
                "size": "1Gi",
                "whenDeleted": "Delete",
            },
            "terminationGracePeriodSeconds": 10,
        },
        "cleanup": {"image": image("slinky")},
        "accounting": {
            "enabled": True,
            "mariadb": {
                "enabled": True,
                "persistence": {"storageClassName": db_storage_class, "size": "1Gi"},
            },
            "enforce": "associations,limits,qos",
            "accounts": [{"name": ACCOUNT, "description": "physics group"}],
            "users": [{"name": DANA.name, "account": ACCOUNT}],
        },
        "login": {
            "enabled": True,
            "authorizedKeys": {user: [key] for user, key in directory_keys.items()},
        },
        "sssd": ldap.sssd_values(namespace),
        "homes": {"existingClaim": homes_claim},
        "compute": {
            "ssh": {"enabled": True},
            "nodesetDefaults": {"nodeConfig": NODE_CONFIG, "terminationGracePeriodSeconds": 30},
            "nodesets": nodesets,
        },
    }


def bridge_values(
    *,
    scheduler_name: str,
    restapi_url: str,
    jwt_key_secret: str,
    managed_namespaces: list[str],
    taint_nodes: bool,
) -> JSON:
    """The slurm-bridge chart's values: its scheduler name, the slurm release's slurmrestd
    and JWT key Secret, the namespaces it manages, partition slurm-bridge. `taint_nodes`
    False where Slurm's nodes for the bridge are slurmd pods on nodes that carry other pods
    (tainting them would evict those)."""
    return {
        "image": image("slinky"),
        "sharedConfig": {
            "schedulerName": scheduler_name,
            "slurmRestApi": restapi_url,
            "managedNamespaces": managed_namespaces,
            "partition": "slurm-bridge",
            "managedNodeTaint": {"enabled": taint_nodes},
            "slurmPollInterval": "500ms",
        },
        "slurmAuth": {"jwtKeySecretRef": {"name": jwt_key_secret}},
    }


def tenancy_policy(namespace: str, uid: int, account: str) -> JSON:
    """The bridge's policy (sharedConfig.policy): pods of `namespace` run in Slurm as `uid`
    (and its own group), charged to `account`."""
    return {
        "namespaces": {
            namespace: {
                "users": [str(uid)],
                "groups": [str(uid)],
                "accounts": [account],
                "defaultAccount": account,
            }
        }
    }
