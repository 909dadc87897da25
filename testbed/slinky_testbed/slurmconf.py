"""slurm.conf for the test bed: configless, JWT as alternative auth, no static nodes."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

SLURM_USER = "root"
REST_USER = "restd"
JWT_KEY_PATH = "/etc/slurm/jwt_hs256.key"


def slurm_conf(
    *, ctld_port: int, slurmd_port: int, ctld_addr: str | None = None, max_nodes: int = 4096
) -> str:
    """The slurm.conf text. Dynamic nodes (`slurmd -Z`) join the `all` partition.

    `ctld_addr` is where configless slurmds in pods reach slurmctld; the name stays
    `localhost` so that slurmctld still knows it is the controller named there."""
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
        "",
    ]
    return "\n".join(lines)


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
    root: Path, *, ctld_port: int, slurmd_port: int, ctld_addr: str | None = None
) -> None:
    """Write slurm.conf, cgroup.conf, topology.yaml and fresh keys into the Slurm root; reset
    daemon state."""
    etc = root / "etc" / "slurm"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "slurm.conf").write_text(
        slurm_conf(ctld_port=ctld_port, slurmd_port=slurmd_port, ctld_addr=ctld_addr)
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


def _empty(path: Path) -> None:
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            _empty(child)
            child.rmdir()
        else:
            child.unlink()
