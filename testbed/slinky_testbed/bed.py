"""Start, inspect and stop one test bed.

A test bed lives in a state directory: the Slurm root file system (extracted once from the
cached tarball and reused), certificates, logs, a kubeconfig and `state.json`, which records
the ports chosen at start and the PID + start time of every process we launched. `down` stops
exactly those processes, never anything found by name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shlex
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jwt
import yaml

from slinky_testbed import guests, nodes, paths, pki, procs, slurmconf

# Slurm's user and admin commands a shell on the test bed gets (see `Testbed.commands`).
SLURM_COMMANDS = (
    "sinfo",
    "squeue",
    "sbatch",
    "srun",
    "salloc",
    "scancel",
    "scontrol",
    "sacct",
    "sprio",
    "sdiag",
    "sshare",
    "sstat",
)

# minReplicas: 0 on a HorizontalPodAutoscaler (issue 13); Kubernetes' own workload-aware
# scheduling objects, scheduling.k8s.io/v1alpha2 PodGroup/Workload (issue 14: slurm-bridge
# gangs), with the alpha API version they are served in.
FEATURE_GATES = "HPAScaleToZero=true,GenericWorkload=true"
RUNTIME_CONFIG = "scheduling.k8s.io/v1alpha2=true"
KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
ADMIN_USER = "slinky-admin"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KUBELET_LABEL = "testbed.slinky.slurm.net/kubelet"
KUBELET_SOCKET_WAIT_S = 30.0
KUBELET_RACE_RETRIES = 3
# The apiserver's user towards kubelets (logs, exec, port-forward).
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"
TOKEN_LIFETIME_S = 7 * 24 * 3600
# What one test bed writes at most (measured: ~2.6 GiB with two real nodes and their imported
# images, ~0.7 GiB without), with room for logs. Below it the kubelets' disk-pressure eviction
# turns away every pod and the tests fail as timeouts that name nothing (CI stop 53).
BED_DISK_GIB_REAL_NODES = 4.0
BED_DISK_GIB = 1.0


def disk_problem(where: Path, *, real_nodes: int, free: int | None = None) -> str | None:
    """Why a test bed under `where` cannot start for lack of disk, or None.

    Names the free space, what a bed needs, and the other beds beside it (largest first) a
    person may remove."""
    needed = BED_DISK_GIB_REAL_NODES if real_nodes else BED_DISK_GIB
    if free is None:
        free = shutil.disk_usage(where).free
    if free >= needed * 2**30:
        return None
    others = sorted(
        (p for p in where.iterdir() if (p / "state.json").exists()),
        key=lambda p: -_size(p),
    )
    hint = (
        " Test beds there: "
        + ", ".join(f"{p.name} ({_size(p) / 2**30:.1f} GiB)" for p in others[:8])
        + "; remove one you no longer use with `slinky testbed --dir DIR down && rm -rf DIR`."
        if others
        else ""
    )
    return (
        f"only {free / 2**30:.1f} GiB free under {where}; a test bed needs {needed:.0f} GiB "
        f"(with less, the kubelets evict or refuse every pod for disk pressure).{hint}"
    )


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


class TestbedError(RuntimeError):
    """The test bed cannot be built, started or used; the message says what to do."""


@dataclass
class State:
    """What `up` chose and started; persisted as state.json."""

    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, list[int]] = field(default_factory=dict)
    admin_token: str = ""
    slurm_token: str = ""
    etcd_dir: str = ""
    kwok_nodes: list[str] = field(default_factory=list)
    # Real nodes (kubelet + containerd): names, and the second octet of their 10.X.0.0/16.
    real_nodes: list[str] = field(default_factory=list)
    node_octet: int = 0
    # Seconds from starting the first containerd to every node Ready (for reports).
    nodes_ready_s: float = 0.0
    images_import_s: float = 0.0
    # cgroup v2 nodes, each a QEMU guest (slinky_testbed.guests), and each guest's memory.
    v2_nodes: list[str] = field(default_factory=list)
    v2_memory_mib: int = guests.DEFAULT_MEMORY_MIB
    # Job accounting (`up(accounting=True)`): MariaDB and slurmdbd in the Slurm root.
    accounting: bool = False
    db_password: str = ""


class Testbed:
    """One test bed instance, identified by its state directory."""

    __test__ = False  # not a pytest test class

    def __init__(self, state_dir: Path | None = None) -> None:
        self.dir = (state_dir or paths.default_state_dir()).resolve()
        self.root = self.dir / "root"
        self.pki = self.dir / "pki"
        self.logs = self.dir / "logs"
        self.kubeconfig = self.dir / "kubeconfig"
        self.state_file = self.dir / "state.json"
        self.nodes_dir = self.dir / "nodes"
        self._nodes_t0 = 0.0

    # ---------------------------------------------------------------- state

    def load(self) -> State:
        if not self.state_file.exists():
            return State()
        data = json.loads(self.state_file.read_text())
        known = State.__dataclass_fields__
        return State(**{k: v for k, v in data.items() if k in known})

    def names(self, state: State | None = None) -> nodes.Names:
        """Host-wide names (network namespace, veth, cgroups) of this test bed's real nodes."""
        return nodes.Names.for_dir(self.dir, (state or self.load()).node_octet)

    @property
    def api_host(self) -> str:
        """Where the apiserver (and slurmctld) serve: the host side of the pod network when
        real nodes run, else loopback."""
        state = self.load()
        return self.names(state).host_ip if state.real_nodes else "127.0.0.1"

    def save(self, state: State) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2))
        tmp.replace(self.state_file)

    def tracked_processes(self, state: State) -> list[tuple[str, procs.Proc]]:
        out = []
        for name, (pid, started) in ((n, tuple(v)) for n, v in state.pids.items()):
            out.append((name, procs.Proc(pid, started)))
        return out

    # ---------------------------------------------------------------- env

    @property
    def slurm_rest_url(self) -> str:
        return f"http://127.0.0.1:{self.load().ports['slurmrestd']}"

    @property
    def slurm_rest_url_for_pods(self) -> str:
        """slurmrestd as pods on real nodes reach it (and this host too)."""
        return f"http://{self.api_host}:{self.load().ports['slurmrestd']}"

    @property
    def slurmctld_addr(self) -> str:
        """host:port of slurmctld that both this host and pods on real nodes reach."""
        return f"{self.api_host}:{self.load().ports['slurmctld']}"

    @property
    def jwt_key_path(self) -> Path:
        return self.root / slurmconf.JWT_KEY_PATH.lstrip("/")

    def mint_slurm_token(self, *, user: str = "root", lifetime_s: int = TOKEN_LIFETIME_S) -> str:
        """An HS256 JWT for `user`, signed with the test bed's Slurm JWT key."""
        now = int(time.time())
        key = self.jwt_key_path.read_bytes()
        return jwt.encode({"sun": user, "iat": now, "exp": now + lifetime_s}, key, "HS256")

    def env(self) -> dict[str, str]:
        """Variables a shell or a test needs to use this test bed."""
        state = self.load()
        if not state.ports:
            raise TestbedError(f"test bed {self.dir} is not up: run `slinky testbed up`")
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "SLURM_REST_URL": f"http://127.0.0.1:{state.ports['slurmrestd']}",
            "SLURM_JWT": state.slurm_token,
            "SLURM_JWT_KEY": str(self.jwt_key_path),
            "SLURMCTLD_ADDR": self.slurmctld_addr,
            "SLINKY_TESTBED_DIR": str(self.dir),
            "SLINKY_SLURM_ROOT": str(self.root),
            "SLINKY_ETCD_URL": f"http://127.0.0.1:{state.ports['etcd']}",
            "SLINKY_SERVICE_ADDRESS": self.service_address,
        }

    def commands(self) -> Path:
        """A directory of commands for a shell on this test bed (`slinky testbed env` puts it
        first on PATH): kubectl and helm (on the test bed's kubeconfig, from the environment)
        and Slurm's user commands, each run inside the Slurm root as `slurm` runs them, or
        through the executable `slurm-commands` of the state directory when there is one
        (`make dev` writes it: they run in its login pod, slinky_testbed.dev_site)."""
        bin_dir = self.dir / "bin"
        bin_dir.mkdir(exist_ok=True)
        tools = {name: paths.bin_dir() / name for name in ("kubectl", "helm")}
        scripts = {name: f'exec {shlex.quote(str(path))} "$@"' for name, path in tools.items()}
        root = shlex.quote(str(self.root))
        via = self.dir / "slurm-commands"
        for name in SLURM_COMMANDS:
            scripts[name] = (
                f'exec {shlex.quote(str(via))} {name} "$@"'
                if via.exists()
                else "exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "
                f'chroot {root} {name} "$@"'
            )
        for name, line in scripts.items():
            path = bin_dir / name
            text = f"#!/bin/sh\n{line}\n"
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                path.chmod(0o755)
        return bin_dir

    # ---------------------------------------------------------------- up

    def up(
        self,
        *,
        real_nodes: int = 0,
        kwok_nodes: int = 0,
        accounting: bool = False,
        v2_nodes: int = 0,
        v2_memory_mib: int = guests.DEFAULT_MEMORY_MIB,
        log: Callable[[str], None],
    ) -> None:
        """Start every component and wait until each is ready (or raise with its log).

        With `v2_nodes`, that many cgroup v2 nodes run in QEMU guests beside the real ones
        (which they need: their network is the real nodes' namespace), `v2_memory_mib` each.

        With `accounting`, MariaDB and slurmdbd run in the Slurm root too (`mariadb` and
        `slurmdbd`, started before slurmctld as the slurm chart orders them) and slurm.conf
        accounts jobs there."""
        if self.status_lines(only_running=True):
            raise TestbedError(
                f"test bed {self.dir} is already up; run `slinky testbed down` first"
            )
        if v2_nodes and not real_nodes:
            raise TestbedError(
                f"{v2_nodes} v2 nodes asked for with no real node: v2 nodes join the real "
                "nodes' network namespace; give at least one real node (--nodes 1)"
            )
        self._check_binaries(real_nodes=real_nodes, v2_nodes=v2_nodes)
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        if problem := disk_problem(self.dir.parent, real_nodes=real_nodes):
            raise TestbedError(problem)
        # Whatever a killed run of this test bed left on the host goes first.
        nodes.cleanup(self.names(), self.nodes_dir, log=lambda _m: None)
        t0 = time.monotonic()
        if v2_nodes:
            guests.ensure_images_disk(log)
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.logs.exists():
            shutil.rmtree(self.logs)
        (self.dir / "restarts.log").unlink(missing_ok=True)
        self.logs.mkdir()
        self._ensure_root(log)
        self._mount_root()
        pki.ensure_pki(self.pki)
        pki.ensure_front_proxy_pki(self.pki)
        self._ensure_service_address()

        names = [
            "etcd",
            "etcd-peer",
            "apiserver",
            "kcm",
            "scheduler",
            "slurmctld",
            "slurmd",
            "slurmrestd",
        ]
        if accounting:
            self._check_accounting_binaries()
            names += ["mariadb", "slurmdbd"]
        state = State(ports=dict(zip(names, procs.free_ports(len(names)), strict=True)))
        state.accounting = accounting
        state.db_password = secrets.token_hex(16) if accounting else ""
        state.admin_token = secrets.token_hex(16)
        state.etcd_dir = (
            f"/dev/shm/slinky-etcd-{hashlib.sha1(str(self.dir).encode()).hexdigest()[:10]}"
        )
        state.kwok_nodes = [f"kwok-{i}" for i in range(kwok_nodes)]
        state.real_nodes = [nodes.node_name(i) for i in range(real_nodes)]
        state.v2_nodes = [guests.guest_name(j) for j in range(v2_nodes)]
        state.v2_memory_mib = v2_memory_mib
        try:
            # Test beds starting side by side (pytest-xdist workers) take turns from picking a
            # free subnet until it is in use, so two never pick the same one.
            with contextlib.ExitStack() as net_claim:
                if real_nodes:
                    net_claim.enter_context(nodes.network_lock())
                    state.node_octet = nodes.pick_octet(self.names(state))
                self.save(state)
                self._write_kubeconfig(state)
                slurmconf.write_slurm_config(
                    self.root,
                    ctld_port=state.ports["slurmctld"],
                    slurmd_port=state.ports["slurmd"],
                    ctld_addr=self.names(state).host_ip if real_nodes else None,
                    dbd_port=state.ports["slurmdbd"] if accounting else None,
                )
                state.slurm_token = self.mint_slurm_token()
                if real_nodes:
                    nodes.setup_network(self.names(state), real_nodes)
                    guests.setup_network(self.names(state), v2_nodes)
            self._start_etcd(state)
            if accounting:
                self._init_mariadb(state)
                self._start_mariadb(state)
                self._wait("mariadb", lambda: self._mariadb_ok(state), 60)
                self._start_slurmdbd(state)
                self._wait("slurmdbd", self.slurmdbd_answers, 30)
            self._start_slurmctld(state)
            self._wait(
                "etcd", lambda: self._http_ok(f"http://127.0.0.1:{state.ports['etcd']}/health"), 30
            )
            self._start_apiserver(state)
            self._wait("slurmctld", self._slurmctld_up, 30)
            self._start_slurmrestd(state)
            self._wait("kube-apiserver", lambda: self._kube_ok(state, "/readyz"), 90)
            self._start_kcm_and_scheduler(state)
            if real_nodes:
                self._start_real_nodes(state, log)
            if v2_nodes:
                self._start_guests(state)
            self._start_kwok(state)
            self._wait("slurmrestd", lambda: self._slurmrestd_ok(state), 30)
            self._wait(
                "kube-controller-manager",
                lambda: self._http_ok(f"https://127.0.0.1:{state.ports['kcm']}/healthz"),
                60,
            )
            self._wait(
                "kube-scheduler",
                lambda: self._http_ok(f"https://127.0.0.1:{state.ports['scheduler']}/healthz"),
                60,
            )
            try:
                self._wait_nodes_ready(state, guests.READY_TIMEOUT_S if v2_nodes else 120)
            except TestbedError as e:
                if not v2_nodes:
                    raise
                reports = (guests.failure_report(n, self.logs) for n in state.v2_nodes)
                raise TestbedError(f"{e}\n" + "\n".join(reports)) from e
            if real_nodes:
                state.nodes_ready_s = time.monotonic() - self._nodes_t0
        except BaseException:
            self.save(state)
            self.down(log=lambda _m: None)
            raise
        self.save(state)
        log(f"test bed up in {time.monotonic() - t0:.1f}s ({self.dir})")

    def _check_binaries(self, *, real_nodes: int, v2_nodes: int = 0) -> None:
        missing = [
            b for b in (*KUBE_BINARIES, "etcd", "kwok") if not (paths.bin_dir() / b).exists()
        ]
        if real_nodes:
            missing += nodes.check_binaries()
        if v2_nodes:
            missing += guests.check_built()
        if missing or not paths.slurm_root_tarball().exists():
            raise TestbedError(
                f"missing test bed binaries {missing or ['slurm root']}: run `slinky testbed build`"
            )

    def _check_accounting_binaries(self) -> None:
        wanted = ("usr/sbin/mariadbd", "usr/bin/mariadb-install-db", "usr/sbin/slurmdbd")
        if missing := [b for b in wanted if not (self.root / b).exists()]:
            raise TestbedError(
                f"the Slurm root {self.root} lacks {missing}: rebuild it (`slinky testbed build`)"
            )

    def _ensure_root(self, log: Callable[[str], None]) -> None:
        tarball = paths.slurm_root_tarball()
        stamp = f"{tarball.stat().st_size}:{tarball.stat().st_mtime_ns}"
        stamp_file = self.dir / "root.stamp"
        if self.root.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
            return
        log("extracting the Slurm root file system")
        self._unmount_root()
        if self.root.exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.root)], check=True)
        self.root.mkdir(parents=True)
        subprocess.run(["tar", "-C", str(self.root), "--zstd", "-xf", str(tarball)], check=True)
        os.chmod(self.root, 0o755)  # daemons drop to unprivileged users inside it
        shutil.copy("/etc/hosts", self.root / "etc" / "hosts")
        stamp_file.write_text(stamp)

    def _mount_root(self) -> None:
        mounts = Path("/proc/mounts").read_text()
        for sub, args in (
            ("proc", ["-t", "proc", "proc"]),
            ("dev", ["--bind", "/dev"]),
            ("sys", ["--bind", "/sys"]),
        ):
            target = self.root / sub
            if f" {target} " not in mounts:
                subprocess.run(["mount", *args, str(target)], check=True)

    def _unmount_root(self) -> None:
        mounts = Path("/proc/mounts").read_text()
        for sub in ("sys", "dev", "proc"):
            target = self.root / sub
            if f" {target} " in mounts:
                subprocess.run(["umount", "-l", str(target)], check=False)

    def _spawn(
        self,
        state: State,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
    ) -> None:
        logf = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        child_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
        child_env.update(env or {})
        p = subprocess.Popen(
            list(argv),
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env,
            start_new_session=True,
            cwd=self.dir,
        )
        logf.close()
        proc = procs.Proc.of(p.pid)
        state.pids[name] = [proc.pid, proc.started]
        self.save(state)

    def _wait(self, name: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = self.load()
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if ready():
                    return
            dead = [n for n, p in self.tracked_processes(state) if not p.alive()]
            if dead:
                raise TestbedError(
                    f"{dead[0]} exited while waiting for {name}\n" + self._log_tail(dead[0])
                )
            time.sleep(0.1)
        raise TestbedError(f"{name} not ready after {timeout:.0f}s\n" + self._log_tail(name))

    def _log_tail(self, name: str, lines: int = 40) -> str:
        candidates = {
            "kube-apiserver": "apiserver",
            "kube-controller-manager": "kcm",
            "kube-scheduler": "scheduler",
            "nodes": "kubelet-node-0",
        }
        path = self.logs / f"{candidates.get(name, name)}.log"
        if not path.exists():
            return f"(no log at {path})"
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- last {len(tail)} lines of {path}:\n" + "\n".join(tail)

    # ---------------------------------------------------------------- components

    def _start_etcd(self, state: State) -> None:
        shutil.rmtree(state.etcd_dir, ignore_errors=True)
        c, p = state.ports["etcd"], state.ports["etcd-peer"]
        self._spawn(
            state,
            "etcd",
            [
                str(paths.bin_dir() / "etcd"),
                "--name=testbed",
                f"--data-dir={state.etcd_dir}",
                f"--listen-client-urls=http://127.0.0.1:{c}",
                f"--advertise-client-urls=http://127.0.0.1:{c}",
                f"--listen-peer-urls=http://127.0.0.1:{p}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
                f"--initial-cluster=testbed=http://127.0.0.1:{p}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )

    def _start_apiserver(self, state: State) -> None:
        tokens = self.pki / "tokens.csv"
        tokens.write_text(f'{state.admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        k = self.pki
        host = self.names(state).host_ip if state.real_nodes else "127.0.0.1"
        if state.real_nodes:
            # Pods reach the apiserver on the host side of their network: it serves (only)
            # there, and advertises it so the `kubernetes` Service gets that endpoint.
            crt, key = pki.serving_cert(k, f"apiserver-{host}", [*pki.APISERVER_NAMES, host])
            kubelet_crt, kubelet_key = pki.client_cert(
                k, "apiserver-kubelet-client", user=KUBELET_CLIENT_USER, group="testbed"
            )
            node_args = [
                "--endpoint-reconciler-type=lease",
                f"--kubelet-client-certificate={kubelet_crt}",
                f"--kubelet-client-key={kubelet_key}",
                # The default tries the node's hostname first: a DNS query to the outside.
                "--kubelet-preferred-address-types=InternalIP",
            ]
        else:
            crt, key = k / "apiserver.crt", k / "apiserver.key"
            node_args = ["--endpoint-reconciler-type=none"]
        self._spawn(
            state,
            "apiserver",
            [
                str(paths.bin_dir() / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{state.ports['etcd']}",
                f"--bind-address={host}",
                f"--advertise-address={host}",
                f"--secure-port={state.ports['apiserver']}",
                *node_args,
                f"--tls-cert-file={crt}",
                f"--tls-private-key-file={key}",
                f"--client-ca-file={k / 'ca.crt'}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=Node,RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={k / 'sa.pub'}",
                f"--service-account-signing-key-file={k / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                "--enable-admission-plugins=NodeRestriction",
                "--enable-priority-and-fairness=false",
                "--max-requests-inflight=0",
                "--max-mutating-requests-inflight=0",
                "--watch-cache=true",
                "--profiling=false",
                "--v=1",
                *self._aggregator_flags(),
            ],
        )

    def _start_kcm_and_scheduler(self, state: State) -> None:
        self._start_kcm(state)
        self._start_scheduler(state)

    def _start_kcm(self, state: State) -> None:
        k = self.pki
        self._spawn(
            state,
            "kcm",
            [
                str(paths.bin_dir() / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={state.ports['kcm']}",
                f"--root-ca-file={k / 'ca.crt'}",
                f"--service-account-private-key-file={k / 'sa.key'}",
                "--controllers=*,-bootstrapsigner,-tokencleaner,-csrsigning,-csrapproving,-csrcleaner,"
                "-nodeipam,-service-lb-controller,-cloud-node-lifecycle-controller",
                "--concurrent-gc-syncs=20",
                "--horizontal-pod-autoscaler-sync-period=2s",
                f"--feature-gates={FEATURE_GATES}",
                "--node-monitor-grace-period=60s",
                # A Node object made by a test without a kubelet never posts a status: it
                # would turn NotReady (NodeStatusNeverUpdated) after the default minute, and
                # NotReady drains Slurm nodes. Nodes that did post one keep the minute above.
                "--node-startup-grace-period=24h",
                "--v=1",
            ],
        )

    def _start_scheduler(self, state: State) -> None:
        self._spawn(
            state,
            "scheduler",
            [
                str(paths.bin_dir() / "kube-scheduler"),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={state.ports['scheduler']}",
                "--v=1",
            ],
        )

    def _start_kwok(self, state: State) -> None:
        if not state.kwok_nodes:
            return
        from slinky_testbed import kubeapi

        api = kubeapi.Admin(self.kubeconfig)
        for name in state.kwok_nodes:
            api.apply_kwok_node(name)
        # No --server-address: nothing reads kwok's metrics or health server, and a port
        # picked at the bed's start could be taken by the time kwok binds it (a CI run:
        # "listen tcp 127.0.0.1:47889: bind: address already in use", kwok exited).
        self._spawn(
            state,
            "kwok",
            [
                str(paths.bin_dir() / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={paths.kwok_stages_file()}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--node-lease-duration-seconds=40",
            ],
        )

    def _start_real_nodes(self, state: State, log: Callable[[str], None]) -> None:
        """Per node a containerd (images imported) and a kubelet with its own client
        certificate; then kube-proxy and CoreDNS once. All inside the test bed's network
        namespace and cgroups."""
        from slinky_testbed import kubeapi

        names = self.names(state)
        api = kubeapi.Admin(self.kubeconfig)

        def cluster_objects() -> bool:
            for manifest in [_kubelet_api_binding(), *_dns_service(names.ns_ip)]:
                api.create(manifest)  # kube-system may take a moment to appear
            return True

        self._wait("kube-dns Service", cluster_objects, 30)
        nodes.make_cgroup(names.cgroup_system)
        env = {"PATH": f"{paths.bin_dir()}:/usr/sbin:/usr/bin:/sbin:/bin"}
        self._nodes_t0 = time.monotonic()
        sockets = []
        for i, name in enumerate(state.real_nodes):
            d = self.nodes_dir / name
            (d / "cni").mkdir(parents=True)
            (d / "containerd").mkdir()
            root = self.dir / "containerd-roots" / name
            root.mkdir(parents=True, exist_ok=True)
            (d / "containerd.toml").write_text(
                nodes.containerd_config(d, root, nodes.cni_bin_dir())
            )
            (d / "cni" / "10-testbed.conflist").write_text(nodes.cni_config(names, i, d))
            nodes.make_cgroup(names.cgroup_node(i))
            self._spawn(
                state,
                f"containerd-{name}",
                nodes.node_daemon(
                    names,
                    str(paths.bin_dir() / "containerd"),
                    "--config",
                    str(d / "containerd.toml"),
                ),
                env=env,
            )
            sockets.append(d / "containerd" / "containerd.sock")
        for name, sock in zip(state.real_nodes, sockets, strict=True):
            self._wait(f"containerd-{name}", sock.exists, 60)
        archives = nodes.image_archives()
        t0 = time.monotonic()

        def import_into(name: str, sock: Path) -> bool:
            stamp = self.dir / "containerd-roots" / f"{name}.imported"
            return nodes.import_images(sock, archives, stamp)

        with ThreadPoolExecutor(max_workers=len(sockets)) as pool:
            imported = sum(pool.map(import_into, state.real_nodes, sockets))
        state.images_import_s = time.monotonic() - t0
        if imported:
            log(f"imported {len(archives)} images into {imported} nodes")
        for i, name in enumerate(state.real_nodes):
            self._start_kubelet(state, i, name)
        proxy = self.nodes_dir / "kube-proxy.yaml"
        proxy.write_text(nodes.kube_proxy_config(names, self.kubeconfig, state.real_nodes[0]))
        self._spawn(
            state,
            "kube-proxy",
            nodes.node_daemon(names, str(paths.bin_dir() / "kube-proxy"), f"--config={proxy}"),
            env=env,
        )
        corefile = self.nodes_dir / "Corefile"
        corefile.write_text(nodes.corefile(names, self.kubeconfig))
        self._spawn(
            state,
            "coredns",
            nodes.node_daemon(names, str(paths.bin_dir() / "coredns"), "-conf", str(corefile)),
            env=env,
        )

    def _start_guests(self, state: State) -> None:
        """The cgroup v2 nodes: one QEMU guest each, in the real nodes' namespace and cgroup."""
        guests.start(
            names=self.names(state),
            guests=state.v2_nodes,
            nodes_dir=self.nodes_dir,
            logs=self.logs,
            pki_dir=self.pki,
            server=f"https://{self.names(state).host_ip}:{state.ports['apiserver']}",
            spawn=lambda name, argv: self._spawn(state, name, argv),
            memory_mib=state.v2_memory_mib,
        )

    def _start_kubelet(self, state: State, i: int, name: str) -> None:
        """One node's kubelet. Every kubelet binds the one host-wide device plugin socket
        (`/var/lib/kubelet/device-plugins/kubelet.sock`, not under `--root-dir`): two that
        start at the same moment race for it and the loser exits. So starts take turns across
        all test beds of the host, each until its kubelet has bound the socket."""
        d = self.nodes_dir / name
        names = self.names(state)
        crt, key = pki.client_cert(
            self.pki, f"kubelet-{name}", user=f"system:node:{name}", group="system:nodes"
        )
        kubeconfig = d / "kubeconfig"
        self._write_kubeconfig(state, path=kubeconfig, cert=(crt, key))
        (d / "kubelet.yaml").write_text(
            nodes.kubelet_config(names, i, d, self.pki / "ca.crt", dns_ip=names.ns_ip)
        )
        argv = nodes.node_daemon(
            names,
            str(paths.bin_dir() / "kubelet"),
            f"--config={d / 'kubelet.yaml'}",
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={name}",
            f"--node-ip={names.node_ip(i)}",
            f"--root-dir={d / 'kubelet'}",
            f"--cert-dir={d / 'kubelet-pki'}",
            f"--node-labels={KUBELET_LABEL}={nodes.REAL_NODE_LABEL_VALUE}",
            "--v=1",
        )
        env = {"PATH": f"{paths.bin_dir()}:/usr/sbin:/usr/bin:/sbin:/bin"}
        with nodes.kubelet_start_lock():
            before = nodes.device_plugin_socket_mtime()
            self._spawn(state, f"kubelet-{name}", argv, env=env)
            pid, started = state.pids[f"kubelet-{name}"]
            proc = procs.Proc(pid, started)
            deadline = time.monotonic() + KUBELET_SOCKET_WAIT_S
            while time.monotonic() < deadline and proc.alive():
                if nodes.device_plugin_socket_mtime() != before:
                    break
                time.sleep(0.1)

    def _wait_nodes_ready(self, state: State, timeout: float) -> None:
        """All nodes Ready; a kubelet that still lost the device plugin socket race (a test
        bed of an older version beside this one) is started again, a few times at most."""
        for attempt in range(KUBELET_RACE_RETRIES + 1):
            try:
                self._wait("nodes", lambda: self._nodes_ready(state), timeout)
                return
            except TestbedError as e:
                lost = [
                    (i, n)
                    for i, n in enumerate(state.real_nodes)
                    if not self._alive(state, f"kubelet-{n}")
                    and nodes.DEVICE_PLUGIN_RACE in self._log_tail(f"kubelet-{n}", lines=15)
                ]
                if not lost or attempt == KUBELET_RACE_RETRIES:
                    raise e
                for i, n in lost:
                    self._start_kubelet(state, i, n)  # records the new PID in `state`

    def _alive(self, state: State, name: str) -> bool:
        return any(n == name and p.alive() for n, p in self.tracked_processes(state))

    def _stop_real_nodes(self, state: State, log: Callable[[str], None]) -> None:
        """Pods first, through the API, so that kubelets run preStop hooks and tear their
        sandboxes down; then kubelets, then containerd; then everything by name."""
        from slinky_testbed import kubeapi

        if state.real_nodes and "apiserver" in state.pids:
            if "scheduler" in state.pids:  # no new pod gets bound while we drain
                self.stop_component("scheduler")
            with contextlib.suppress(Exception):
                left = kubeapi.Admin(self.kubeconfig).delete_pods_on(
                    state.real_nodes + state.v2_nodes, timeout=90
                )
                if left:
                    log(f"pods still terminating after 90s, stopping their nodes: {left}")
        for prefix in ("kubelet-", "qemu-", "kube-proxy", "coredns", "containerd-"):
            group = [p for n, p in self.tracked_processes(state) if n.startswith(prefix)]
            procs.stop_all(group, grace=10)

    def _start_slurmctld(self, state: State) -> None:
        self._spawn(state, "slurmctld", ["chroot", str(self.root), "slurmctld", "-D", "-i"])

    # ---------------------------------------------------------------- accounting (opt-in)

    def _init_mariadb(self, state: State) -> None:
        """A new, empty MariaDB data directory in the Slurm root (the bed's accounting starts
        empty at every `up`), slurmdbd.conf and mariadbd's init file (database and user)."""
        for d in (slurmconf.DB_DATADIR, "/run/mysqld", "/run/slurmdbd"):
            path = self.root / d.lstrip("/")
            if path.exists():
                subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)
            path.mkdir(parents=True)
        etc = self.root / "etc" / "slurm"
        conf = etc / "slurmdbd.conf"
        conf.write_text(
            slurmconf.slurmdbd_conf(
                dbd_port=state.ports["slurmdbd"],
                db_port=state.ports["mariadb"],
                db_password=state.db_password,
            )
        )
        os.chmod(conf, 0o600)  # slurmdbd refuses a slurmdbd.conf others may read
        init = self.root / slurmconf.DB_INIT_FILE.lstrip("/")
        init.write_text(slurmconf.mariadb_init_sql(state.db_password))
        os.chmod(init, 0o600)
        for argv in (
            ["chown", "mysql:mysql", slurmconf.DB_DATADIR, "/run/mysqld", slurmconf.DB_INIT_FILE],
            [
                "mariadb-install-db",
                "--user=mysql",
                f"--datadir={slurmconf.DB_DATADIR}",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
        ):
            done = self.slurm(argv, capture=True, timeout=120)
            if done.returncode != 0:
                raise TestbedError(
                    f"{' '.join(argv)} failed in the Slurm root (exit {done.returncode}):\n"
                    + (done.stdout + done.stderr)[-2000:]
                )

    def _start_mariadb(self, state: State) -> None:
        self._spawn(
            state,
            "mariadb",
            [
                "chroot",
                str(self.root),
                "mariadbd",
                *slurmconf.mariadbd_args(db_port=state.ports["mariadb"]),
            ],
        )

    def _mariadb_ok(self, state: State) -> bool:
        """slurmdbd's user logs in over TCP with its password and sees its database."""
        done = subprocess.run(
            [
                "chroot",
                str(self.root),
                "mariadb",
                "--connect-timeout=2",
                "-h",
                "127.0.0.1",
                "-P",
                str(state.ports["mariadb"]),
                "-u",
                slurmconf.DB_USER,
                "-e",
                f"USE {slurmconf.DB_NAME}",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "MYSQL_PWD": state.db_password},
        )
        return done.returncode == 0

    def _start_slurmdbd(self, state: State) -> None:
        self._spawn(state, "slurmdbd", ["chroot", str(self.root), "slurmdbd", "-D"])

    def slurmdbd_answers(self) -> bool:
        """Whether slurmdbd answers `sacctmgr ping` UP: it runs and reaches its database
        (it says DOWN while MariaDB does not answer)."""
        out = self.slurm(["sacctmgr", "-n", "ping"], capture=True, timeout=10)
        return out.returncode == 0 and " UP" in out.stdout and "DOWN" not in out.stdout

    def _start_slurmrestd(self, state: State) -> None:
        listen = [f"127.0.0.1:{state.ports['slurmrestd']}"]
        if state.real_nodes:  # also where pods (e.g. an operator in a pod) reach it
            listen.append(f"{self.names(state).host_ip}:{state.ports['slurmrestd']}")
        self._spawn(
            state,
            "slurmrestd",
            [
                "chroot",
                str(self.root),
                "slurmrestd",
                "-u",
                slurmconf.REST_USER,
                "-g",
                slurmconf.REST_USER,
                "-a",
                "rest_auth/jwt",
                *listen,
            ],
            env={"SLURM_JWT": "daemon"},
        )

    # ---------------------------------------------------------------- single components

    def spawn_extra(
        self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None
    ) -> None:
        """Start another process that belongs to this test bed (e.g. the dev operator):
        logged to logs/<name>.log and stopped by `down` like the rest."""
        self._spawn(self.load(), name, argv, env=env)

    def remove_extra(self, name: str) -> None:
        """Stop a process `spawn_extra` started and forget it: one left in the state stopped
        would read as a crash to every later wait (`_wait`: "exited while waiting")."""
        state = self.load()
        entry = state.pids.pop(name, None)
        if entry is not None:
            left = procs.stop_all([procs.Proc(entry[0], entry[1])], grace=10)
            if left:
                raise TestbedError(f"{name} (pid {entry[0]}) did not stop")
        self.save(state)

    def stop_component(self, name: str) -> None:
        """Stop one component (e.g. `apiserver`, `slurmrestd`) to test recovery."""
        state = self.load()
        pid, started = state.pids[name]
        left = procs.stop_all([procs.Proc(pid, started)], grace=10)
        if left:
            raise TestbedError(f"{name} (pid {pid}) did not stop")

    def start_component(self, name: str, *, timeout: float = 90) -> None:
        """Start a stopped component again on its old port and wait until it is ready."""
        state = self.load()
        starters: dict[str, tuple[Callable[[State], None], Callable[[], bool]]] = {
            "apiserver": (self._start_apiserver, lambda: self._kube_ok(state, "/readyz")),
            "slurmrestd": (self._start_slurmrestd, lambda: self._slurmrestd_ok(state)),
            "slurmctld": (self._start_slurmctld, self._slurmctld_up),
            # Only on a bed started with accounting.
            "mariadb": (self._start_mariadb, lambda: self._mariadb_ok(state)),
            "slurmdbd": (self._start_slurmdbd, self.slurmdbd_answers),
            # Static pods a kubelet would start again (kube-scheduler exits by design when
            # it finds its cache corrupted, e.g. a Binding applied whose answer was lost).
            "kcm": (
                self._start_kcm,
                lambda: self._http_ok(f"https://127.0.0.1:{state.ports['kcm']}/healthz"),
            ),
            "scheduler": (
                self._start_scheduler,
                lambda: self._http_ok(f"https://127.0.0.1:{state.ports['scheduler']}/healthz"),
            ),
        }
        start, ready = starters[name]
        with (self.dir / "restarts.log").open("a") as f:
            f.write(f"{name} {time.time():.3f}\n")
        start(state)
        self._wait(name, ready, timeout)

    def restarted_at(self, name: str) -> list[float]:
        """Wall-clock times at which `start_component` started `name` again (tests judge what
        clients logged right after, e.g. a new apiserver's RBAC cache still filling)."""
        path = self.dir / "restarts.log"
        if not path.exists():
            return []
        return [
            float(t) for n, t in (ln.split() for ln in path.read_text().splitlines()) if n == name
        ]

    def restart_component(self, name: str) -> None:
        self.stop_component(name)
        self.start_component(name)

    # ---------------------------------------------------------------- crashes (chaos soak)

    def kill_component(self, name: str) -> None:
        """SIGKILL one recorded process (and its process group), as a crash would: no
        shutdown handler runs, no state is saved. Returns once it is gone; start it again
        with `start_component` (or, for processes of `spawn_extra`, as they were started)."""
        pid, started = self.load().pids[name]
        proc = procs.Proc(pid, started)
        proc.signal(signal.SIGKILL, group=True)
        deadline = time.monotonic() + 10
        while proc.alive():
            procs.reap()
            if time.monotonic() > deadline:
                raise TestbedError(f"{name} (pid {pid}) survives SIGKILL")
            time.sleep(0.05)
        with (self.dir / "restarts.log").open("a") as f:
            f.write(f"{name}-killed {time.time():.3f}\n")

    def restart_kubelet(self, node: str, *, timeout: float = 120) -> None:
        """Stop one real node's kubelet (SIGTERM, as a service restart does; its pods keep
        running under containerd) and start it again; returns once its healthz answers."""
        state = self.load()
        index = state.real_nodes.index(node)
        pid, started = state.pids[f"kubelet-{node}"]
        if procs.stop_all([procs.Proc(pid, started)], grace=10):
            raise TestbedError(f"kubelet-{node} (pid {pid}) did not stop")
        with (self.dir / "restarts.log").open("a") as f:
            f.write(f"kubelet-{node} {time.time():.3f}\n")
        self._start_kubelet(state, index, node)
        healthz = f"http://{self.names(state).node_ip(index)}:10248/healthz"
        self._wait(f"kubelet-{node}", lambda: self._http_ok(healthz), timeout)

    def lose_node(self, node: str) -> int:
        """SIGKILL everything of one real node at once, as a machine that died: its kubelet,
        containerd, containerd's shims and every process of its pods. Returns how many
        processes it killed. `replace_node` brings up a new machine of the same name."""
        state = self.load()
        index = state.real_nodes.index(node)
        pids = nodes.node_processes(self.names(state), index, self.nodes_dir / node)
        daemons = [
            procs.Proc(*state.pids[n])
            for n in (f"kubelet-{node}", f"containerd-{node}")
            if n in state.pids
        ]
        for proc in daemons:
            proc.signal(signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(p.alive() for p in daemons) or any(
            (st := procs.stat_fields(pid)) is not None and st[0] != "Z" for pid in pids
        ):
            procs.reap()
            if time.monotonic() > deadline:
                raise TestbedError(f"processes of {node} survive SIGKILL")
            time.sleep(0.05)
        state = self.load()
        for n in (f"kubelet-{node}", f"containerd-{node}"):
            state.pids.pop(n, None)  # dead for good: no later wait may take it for a crash
        self.save(state)
        with (self.dir / "restarts.log").open("a") as f:
            f.write(f"{node}-lost {time.time():.3f}\n")
        return len(pids) + len(daemons)

    def replace_node(self, node: str, *, timeout: float = 120) -> None:
        """A new machine in place of a lost one (`lose_node`): same name and address, empty
        kubelet and containerd state (the images stay), containerd and kubelet started as
        `up` starts them; returns once the kubelet's healthz answers (the Node registers
        itself again if it was deleted)."""
        state = self.load()
        index = state.real_nodes.index(node)
        names = self.names(state)
        d = self.nodes_dir / node
        nodes.wipe_node_state(d)
        env = {"PATH": f"{paths.bin_dir()}:/usr/sbin:/usr/bin:/sbin:/bin"}
        self._spawn(
            state,
            f"containerd-{node}",
            nodes.node_daemon(
                names, str(paths.bin_dir() / "containerd"), "--config", str(d / "containerd.toml")
            ),
            env=env,
        )
        # Not `_wait`: another process of the bed may be down meanwhile (the soak crashes
        # them), which is no failure of this node's.
        self._wait_alone(f"containerd-{node}", (d / "containerd" / "containerd.sock").exists, 60)
        with (self.dir / "restarts.log").open("a") as f:
            f.write(f"{node}-replaced {time.time():.3f}\n")
        self._start_kubelet(state, index, node)
        healthz = f"http://{names.node_ip(index)}:10248/healthz"
        self._wait_alone(f"kubelet-{node}", lambda: self._http_ok(healthz), timeout)

    def _wait_alone(self, name: str, ready: Callable[[], bool], timeout: float) -> None:
        """Wait for `name` to be ready; only its own exit ends the wait early."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if ready():
                    return
            if not self._alive(self.load(), name):
                raise TestbedError(f"{name} exited while starting\n" + self._log_tail(name))
            time.sleep(0.1)
        raise TestbedError(f"{name} not ready after {timeout:.0f}s\n" + self._log_tail(name))

    def kill_in_container(self, node: str, container_id: str, process: str) -> int:
        """SIGKILL the process named `process` (its comm) inside one container of a real
        node, found from the container's init PID as containerd reports it; returns the PID
        killed. Raises TestbedError when the container or the process is not there."""
        sock = self.nodes_dir / node / "containerd" / "containerd.sock"
        listed = subprocess.run(
            [str(paths.bin_dir() / "ctr"), "--address", str(sock), "-n", "k8s.io", "tasks", "ls"],
            capture_output=True,
            text=True,
            check=False,
        )
        init = next(
            (
                int(f[1])
                for f in (ln.split() for ln in listed.stdout.splitlines())
                if f[:1] == [container_id]
            ),
            None,
        )
        if init is None:
            raise TestbedError(f"container {container_id[:12]} has no task on {node}")
        todo, seen = [init], set()
        while todo:
            pid = todo.pop()
            seen.add(pid)
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == process:
                    os.kill(pid, signal.SIGKILL)
                    return pid
                for task in Path(f"/proc/{pid}/task").iterdir():
                    todo += [int(c) for c in (task / "children").read_text().split()]
            todo = [p for p in todo if p not in seen]
        raise TestbedError(f"no process {process!r} in container {container_id[:12]} on {node}")

    # ---------------------------------------------------------------- readiness probes

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        return ctx

    def _http_ok(self, url: str) -> bool:
        ctx = ssl._create_unverified_context() if url.startswith("https") else None
        with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
            return bool(r.status == 200)

    def _kube_ok(self, state: State, path: str) -> bool:
        host = self.names(state).host_ip if state.real_nodes else "127.0.0.1"
        req = urllib.request.Request(
            f"https://{host}:{state.ports['apiserver']}{path}",
            headers={"Authorization": f"Bearer {state.admin_token}"},
        )
        with urllib.request.urlopen(req, timeout=2, context=self._ssl()) as r:
            return bool(r.status == 200)

    def _slurmctld_up(self) -> bool:
        out = self.slurm(["scontrol", "ping"], capture=True, timeout=5)
        return "UP" in out.stdout

    def _slurmrestd_ok(self, state: State) -> bool:
        req = urllib.request.Request(
            f"http://127.0.0.1:{state.ports['slurmrestd']}/slurm/v0.0.44/ping",
            headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": state.slurm_token},
        )
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                return bool(r.status == 200)
        except urllib.error.HTTPError:
            return False

    def _nodes_ready(self, state: State) -> bool:
        from slinky_testbed import kubeapi

        want = set(state.kwok_nodes) | set(state.real_nodes) | set(state.v2_nodes)
        return want <= kubeapi.Admin(self.kubeconfig).ready_nodes()

    # ---------------------------------------------------------------- kubeconfig

    def _write_kubeconfig(
        self, state: State, *, path: Path | None = None, cert: tuple[Path, Path] | None = None
    ) -> None:
        """The admin kubeconfig, or (with `cert`) one authenticating by client certificate."""
        import base64

        ca = base64.b64encode((self.pki / "ca.crt").read_bytes()).decode()
        host = self.names(state).host_ip if state.real_nodes else "127.0.0.1"
        config: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "slinky-testbed",
            "clusters": [
                {
                    "name": "slinky-testbed",
                    "cluster": {
                        "server": f"https://{host}:{state.ports['apiserver']}",
                        "certificate-authority-data": ca,
                    },
                }
            ],
            "users": [
                {
                    "name": ADMIN_USER,
                    "user": (
                        {"client-certificate": str(cert[0]), "client-key": str(cert[1])}
                        if cert
                        else {"token": state.admin_token}
                    ),
                }
            ],
            "contexts": [
                {
                    "name": "slinky-testbed",
                    "context": {"cluster": "slinky-testbed", "user": ADMIN_USER},
                }
            ],
        }
        target = path or self.kubeconfig
        target.write_text(yaml.safe_dump(config))
        os.chmod(target, 0o600)

    # ---------------------------------------------------------------- slurm commands

    def slurm(
        self, argv: Sequence[str], *, capture: bool = False, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (sinfo, squeue, sbatch, scontrol, ...) inside the Slurm root."""
        return subprocess.run(
            ["chroot", str(self.root), *argv],
            capture_output=capture,
            text=True,
            timeout=timeout,
            check=False,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"},
        )

    def kubectl(
        self, argv: Sequence[str], *, timeout: float | None = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this test bed (as cluster admin), capturing its output."""
        return subprocess.run(
            [str(paths.bin_dir() / "kubectl"), f"--kubeconfig={self.kubeconfig}", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    # ---------------------------------------------------------------- down / status

    def down(self, *, log: Callable[[str], None]) -> None:
        """Stop exactly the processes this test bed started, then unmount and free tmpfs."""
        state = self.load()
        t0 = time.monotonic()
        self._stop_real_nodes(state, log)
        t_nodes = time.monotonic()
        tracked = self.tracked_processes(state)
        # etcd last: the apiserver removes its own endpoint from etcd while it shuts down, and
        # would wait out its grace period for an etcd that is already gone.
        left = procs.stop_all([p for n, p in tracked if n != "etcd"], grace=10)
        left += procs.stop_all([p for n, p in tracked if n == "etcd"], grace=10)
        if left:
            raise TestbedError(f"processes still running after SIGKILL: {[p.pid for p in left]}")
        t_rest = time.monotonic()
        nodes.cleanup(self.names(state), self.nodes_dir, log=lambda _m: None)
        self._unmount_root()
        if state.etcd_dir:
            shutil.rmtree(state.etcd_dir, ignore_errors=True)
        state.pids = {}
        state.ports = {}
        self.save(state)
        self._remove_service_address()
        t_end = time.monotonic()
        log(
            f"test bed down in {t_end - t0:.1f}s ({self.dir}): real nodes "
            f"{t_nodes - t0:.1f}s, other processes {t_rest - t_nodes:.1f}s, "
            f"cleanup {t_end - t_rest:.1f}s"
        )

    def status_lines(self, *, only_running: bool = False) -> list[str]:
        state = self.load()
        out = []
        for name, p in self.tracked_processes(state):
            alive = p.alive()
            if only_running and not alive:
                continue
            port = state.ports.get(name)
            out.append(
                f"{name:24} pid {p.pid:<8} {'running' if alive else 'exited':8}"
                + (f" port {port}" if port else "")
            )
        return out

    # ---------------------------------------------------------------- aggregated APIs (issue 13)
    # The apiserver proxies `external.metrics.k8s.io` to the operator: it authenticates with
    # the front-proxy client certificate, and with --enable-aggregator-routing it dials the
    # APIService's Service endpoints directly (no kube-proxy needed). Endpoints may not be
    # loopback or link-local addresses, so each test bed owns an empty bridge (this kernel has
    # no dummy links) with one 10.x address that a process outside the cluster (the
    # operator) binds.

    @property
    def service_interface(self) -> str:
        return "slkas" + hashlib.sha1(str(self.dir).encode()).hexdigest()[:6]

    @property
    def service_address(self) -> str:
        """An address on this machine that EndpointSlices accept and the apiserver dials."""
        digest = hashlib.sha1(str(self.dir).encode()).digest()
        return f"10.251.{digest[0]}.{1 + digest[1] % 254}"

    def _ensure_service_address(self) -> None:
        link = self.service_interface
        shown = subprocess.run(["ip", "link", "show", link], check=False, capture_output=True)
        if shown.returncode != 0:
            subprocess.run(["ip", "link", "add", link, "type", "bridge"], check=True)
        subprocess.run(
            ["ip", "addr", "replace", f"{self.service_address}/32", "dev", link], check=True
        )
        subprocess.run(["ip", "link", "set", link, "up"], check=True)

    def _remove_service_address(self) -> None:
        subprocess.run(
            ["ip", "link", "del", self.service_interface], check=False, capture_output=True
        )

    def _aggregator_flags(self) -> list[str]:
        k = self.pki
        return [
            f"--requestheader-client-ca-file={k / 'front-proxy-ca.crt'}",
            f"--requestheader-allowed-names={pki.FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={k / (pki.FRONT_PROXY_CLIENT + '.crt')}",
            f"--proxy-client-key-file={k / (pki.FRONT_PROXY_CLIENT + '.key')}",
            "--enable-aggregator-routing=true",
            f"--feature-gates={FEATURE_GATES}",
            f"--runtime-config={RUNTIME_CONFIG}",
        ]


def _kubelet_api_binding() -> dict[str, Any]:
    """Kubelets authorize API calls by asking the apiserver; this lets the apiserver itself
    (logs, exec, port-forward) through."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "testbed:kubelet-api-admin"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "system:kubelet-api-admin",
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KUBELET_CLIENT_USER}
        ],
    }


def _dns_service(dns_ip: str) -> list[dict[str, Any]]:
    """The `kube-dns` Service in front of CoreDNS, which runs as a test bed process on `dns_ip`
    (so its endpoints are given, not selected)."""
    ports = [("dns", "UDP"), ("dns-tcp", "TCP")]
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system"},
            "spec": {
                "clusterIP": nodes.DNS_SERVICE_IP,
                "ports": [{"name": n, "port": 53, "protocol": p} for n, p in ports],
            },
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kube-dns-testbed",
                "namespace": "kube-system",
                "labels": {"kubernetes.io/service-name": "kube-dns"},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [dns_ip], "conditions": {"ready": True}}],
            "ports": [{"name": n, "port": 53, "protocol": p} for n, p in ports],
        },
    ]
