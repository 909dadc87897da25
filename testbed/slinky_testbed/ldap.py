"""A real OpenLDAP directory for the test bed: slapd from the Slurm image (Debian's slapd), in a
pod behind a Service, holding a few POSIX users and groups. Tests and `make dev` apply
`manifests()`; the slurm chart's SSSD sidecar reads it (`sssd_values()`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

BASE_DN = "dc=slinky,dc=test"
ADMIN_DN = f"cn=admin,{BASE_DN}"
NAME = "ldap"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Directory:
    users: tuple[User, ...]
    # Extra groups: name -> gid (each user also has a group of its own, gid = uid).
    groups: dict[str, int] = field(default_factory=dict)


def ldif(directory: Directory) -> str:
    """The directory's entries: the base, people and groups (rfc2307 posixGroup)."""
    entries = [
        f"dn: {BASE_DN}\nobjectClass: top\nobjectClass: dcObject\nobjectClass: organization\n"
        "o: slinky\ndc: slinky\n",
        f"dn: ou=people,{BASE_DN}\nobjectClass: organizationalUnit\nou: people\n",
        f"dn: ou=groups,{BASE_DN}\nobjectClass: organizationalUnit\nou: groups\n",
    ]
    for u in directory.users:
        entries.append(
            f"dn: uid={u.name},ou=people,{BASE_DN}\n"
            "objectClass: inetOrgPerson\nobjectClass: posixAccount\n"
            f"uid: {u.name}\ncn: {u.name}\nsn: {u.name}\n"
            f"uidNumber: {u.uid}\ngidNumber: {u.uid}\n"
            f"homeDirectory: /home/{u.name}\nloginShell: /bin/bash\n"
        )
        entries.append(
            f"dn: cn={u.name},ou=groups,{BASE_DN}\nobjectClass: posixGroup\n"
            f"cn: {u.name}\ngidNumber: {u.uid}\n"
        )
    for group, gid in sorted(directory.groups.items()):
        members = "".join(f"memberUid: {u.name}\n" for u in directory.users if group in u.groups)
        entries.append(
            f"dn: cn={group},ou=groups,{BASE_DN}\nobjectClass: posixGroup\n"
            f"cn: {group}\ngidNumber: {gid}\n{members}"
        )
    return "\n".join(entries)


SLAPD_CONF = f"""include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/nis.schema
include /etc/ldap/schema/inetorgperson.schema
pidfile /run/slapd/slapd.pid
modulepath /usr/lib/ldap
moduleload back_mdb
database mdb
maxsize 67108864
suffix "{BASE_DN}"
rootdn "{ADMIN_DN}"
rootpw @ROOTPW@
directory /var/lib/ldap
# Only a bound client reads (the admin is the root DN, past every rule).
access to * by * none
"""

START = """set -eu
mkdir -p /var/lib/ldap /run/slapd
sed "s|@ROOTPW@|$ROOTPW|" /mnt/ldap/slapd.conf > /run/slapd/slapd.conf
slapadd -q -f /run/slapd/slapd.conf -l /mnt/ldap/init.ldif
exec slapd -d 0 -h ldap:/// -f /run/slapd/slapd.conf
"""


def manifests(namespace: str, image: str, directory: Directory, password: str) -> list[JSON]:
    """A Secret with the admin's password, the configuration, one slapd pod and its
    Service `ldap`, in `namespace`. The directory is loaded anew at every start."""
    labels = {"app.kubernetes.io/name": NAME}
    meta = {"name": NAME, "namespace": namespace, "labels": labels}
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "stringData": {"password": password},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta,
            "data": {"slapd.conf": SLAPD_CONF, "init.ldif": ldif(directory)},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {"selector": labels, "ports": [{"name": "ldap", "port": 389}]},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "automountServiceAccountToken": False,
                        "containers": [
                            {
                                "name": "slapd",
                                "image": image,
                                "imagePullPolicy": "IfNotPresent",
                                "args": ["sh", "-c", START],
                                "env": [
                                    {
                                        "name": "ROOTPW",
                                        "valueFrom": {
                                            "secretKeyRef": {"name": NAME, "key": "password"}
                                        },
                                    }
                                ],
                                "ports": [{"name": "ldap", "containerPort": 389}],
                                "readinessProbe": {
                                    "tcpSocket": {"port": "ldap"},
                                    "periodSeconds": 1,
                                },
                                "volumeMounts": [{"name": "config", "mountPath": "/mnt/ldap"}],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": NAME}}],
                    },
                },
            },
        },
    ]


def sssd_values(namespace: str, cluster_domain: str = "cluster.local") -> JSON:
    """The slurm chart's `sssd` values for this directory (plain LDAP inside the test bed:
    no StartTLS, no certificate)."""
    return {
        "enabled": True,
        "uri": f"ldap://{NAME}.{namespace}.svc.{cluster_domain}",
        "baseDn": BASE_DN,
        "bindDn": ADMIN_DN,
        "bindPasswordSecretRef": {"name": NAME, "key": "password"},
        "startTls": False,
        "tlsReqCert": "never",
    }
