"""slurm.conf for the test bed: configless, JWT as alternative auth, no static nodes."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

SLURM_USER = "root"
REST_USER = "restd"
JWT_KEY_PATH = "/etc/slurm/jwt_hs256.key"


def slurm_conf(
    *,
    ctld_port: int,
    slurmd_port: int,
    ctld_addr: str | None = None,
    max_nodes: int = 4096,
    dbd_port: int | None = None,
) -> str:
    """The slurm.conf text. Dynamic nodes (`slurmd -Z`) join the `all` partition.

    `ctld_addr` is where configless slurmds in pods reach slurmctld; the name stays
    `localhost` so that slurmctld still knows it is the controller named there. With
    `dbd_port`, jobs are accounted in the slurmdbd serving there (`slurmdbd_conf`)."""
    host = f"localhost({ctld_addr})" if ctld_addr else "localhost"
    lines = [
        "ClusterName=slinky",
        f"SlurmctldHost={host}",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        f"SlurmUser={SLURM_USER}",
        "AuthType=auth/slurm",
        "CredType=cred/slurm",
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={JWT_KEY_PATH}",
        "SlurmctldParameters=enable_configless",
        "StateSaveLocation=/var/spool/slurmctld",
        "SlurmdSpoolDir=/var/spool/slurmd/%n",
        "SlurmctldPidFile=/run/slurmctld/slurmctld.pid",
        "SlurmdPidFile=/run/slurm/slurmd-%n.pid",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres",
        "ReturnToService=2",
        f"MaxNodeCount={max_nodes}",
        "TreeWidth=65533",
        "SchedulerParameters=batch_sched_delay=0",
        "SlurmdTimeout=300",
        "MailProg=/bin/true",
        # GPUs, and the count-only GRES the e2e tests give pods as an extended resource.
        "GresTypes=gpu,widget",
        "MinJobAge=300",
        # slurmctld's own OpenMetrics over HTTP on SlurmctldPort (/metrics/jobs, /nodes,
        # /partitions, /scheduler, /jobs-users-accts); open to anyone without PrivateData.
        "MetricsType=metrics/openmetrics",
        # Partitions the operator makes over REST survive slurmctld restarts and
        # reconfigures (without it, slurmctld forgets them and fails every job in them).
        "ReconfigFlags=KeepPartInfo",
        "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        # slurm-bridge: EXTERNAL nodes registered with feature slurm-bridge join this
        # partition through the NodeSet (REST cannot create NodeSets).
        "NodeSet=slurm-bridge Feature=slurm-bridge",
        "PartitionName=slurm-bridge Nodes=slurm-bridge MaxTime=INFINITE State=UP",
    ]
    if dbd_port is not None:
        # No AccountingStorageEnforce: a job needs no association (every job runs as root,
        # whose association slurmctld's first registration makes with the cluster).
        lines += [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=localhost",
            f"AccountingStoragePort={dbd_port}",
        ]
    return "\n".join([*lines, ""])


# Every job is placed as on one flat network, except in partitions that name the tree
# `racks` (Topology=racks), where the operator places nodes by Kubernetes node labels under
# the switch `root` (a switch must have a child to get new ones, hence `spare`).
TOPOLOGY_YAML = """\
- topology: flat
  cluster_default: true
  flat: true
- topology: racks
  tree:
    switches:
      - switch: root
        children: spare
      - switch: spare
"""


# slurmctld looks up the host name of each client address that sends it a job (slurmrestd
# names no alloc_node). The machine's resolver answered 55 such lookups, then let the next
# time out (5 s) while holding that RPC: a burst of submissions stalled 5 s in 6. Nothing
# answers on 127.0.0.1:53, so a lookup fails at once (Slurm uses the address) and no query
# leaves the machine.
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


def write_slurm_config(
    root: Path,
    *,
    ctld_port: int,
    slurmd_port: int,
    ctld_addr: str | None = None,
    dbd_port: int | None = None,
) -> None:
    """Write slurm.conf, cgroup.conf, topology.yaml and fresh keys into the Slurm root; reset
    daemon state."""
    etc = root / "etc" / "slurm"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "slurm.conf").write_text(
        slurm_conf(
            ctld_port=ctld_port, slurmd_port=slurmd_port, ctld_addr=ctld_addr, dbd_port=dbd_port
        )
    )
    (etc / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
    (root / "etc" / "resolv.conf").write_text(RESOLV_CONF)
    (etc / "topology.yaml").write_text(TOPOLOGY_YAML)
    for name, size in (("slurm.key", 1024), ("jwt_hs256.key", 32)):
        path = etc / name
        if not path.exists():
            path.write_bytes(secrets.token_bytes(size))
        os.chmod(path, 0o600)
    for d in ("var/spool/slurmctld", "var/spool/slurmd", "run/slurm", "run/slurmctld"):
        path = root / d
        if path.exists() and d.startswith("var/spool"):
            _empty(path)
        path.mkdir(parents=True, exist_ok=True)


# ---------------------------------------------------------------- accounting (opt-in)

DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
DB_SOCKET = "/run/mysqld/mysqld.sock"
DB_DATADIR = "/var/lib/mysql"
DB_INIT_FILE = "/run/mysqld/init.sql"


def slurmdbd_conf(*, dbd_port: int, db_port: int, db_password: str) -> str:
    """slurmdbd.conf: slurmdbd on localhost, its database the bed's MariaDB over TCP with a
    password (as the slurm chart's), JWT accepted beside auth/slurm (slurmrestd's /slurmdb)."""
    return "\n".join(
        [
            "AuthType=auth/slurm",
            "AuthAltTypes=auth/jwt",
            f"AuthAltParameters=jwt_key={JWT_KEY_PATH}",
            "DbdHost=localhost",
            f"DbdPort={dbd_port}",
            f"SlurmUser={SLURM_USER}",
            "PidFile=/run/slurmdbd/slurmdbd.pid",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={db_port}",
            f"StorageLoc={DB_NAME}",
            f"StorageUser={DB_USER}",
            f"StoragePass={db_password}",
            "",
        ]
    )


def mariadbd_args(*, db_port: int) -> list[str]:
    """mariadbd's options (after the root's /etc/mysql defaults): TCP on loopback only, the
    settings slurmdbd asks for (it refuses to run with snapshot isolation, warns below a
    lock wait of 900 s); commits are written to the OS at once, flushed to disk each second
    (a kill -9 of mariadbd loses nothing; only a host crash could)."""
    return [
        "--user=mysql",
        f"--datadir={DB_DATADIR}",
        f"--socket={DB_SOCKET}",
        "--pid-file=/run/mysqld/mysqld.pid",
        f"--port={db_port}",
        "--bind-address=127.0.0.1",
        "--skip-name-resolve",
        f"--init-file={DB_INIT_FILE}",
        "--innodb-snapshot-isolation=OFF",
        "--innodb-lock-wait-timeout=900",
        "--innodb-flush-log-at-trx-commit=2",
    ]


def mariadb_init_sql(db_password: str) -> str:
    """Run by mariadbd at every start (--init-file): the database and slurmdbd's user."""
    return (
        f"CREATE DATABASE IF NOT EXISTS `{DB_NAME}`;\n"
        f"CREATE USER IF NOT EXISTS '{DB_USER}'@'%' IDENTIFIED BY '{db_password}';\n"
        f"ALTER USER '{DB_USER}'@'%' IDENTIFIED BY '{db_password}';\n"
        f"GRANT ALL ON `{DB_NAME}`.* TO '{DB_USER}'@'%';\n"
    )


def _empty(path: Path) -> None:
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            _empty(child)
            child.rmdir()
        else:
            child.unlink()
