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
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jwt
import yaml

from slinky_testbed import paths, pki, procs, slurmconf

# minReplicas: 0 on a HorizontalPodAutoscaler (issue 13)
FEATURE_GATES = "HPAScaleToZero=true"
KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
ADMIN_USER = "slinky-admin"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KUBELET_LABEL = "testbed.slinky.slurm.net/kubelet"
TOKEN_LIFETIME_S = 7 * 24 * 3600


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
    process_nodes: list[str] = field(default_factory=list)
    kwok_nodes: list[str] = field(default_factory=list)


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

    # ---------------------------------------------------------------- state

    def load(self) -> State:
        if not self.state_file.exists():
            return State()
        data = json.loads(self.state_file.read_text())
        return State(**data)

    def save(self, state: State) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2))
        tmp.replace(self.state_file)

    def tracked_processes(self, state: State) -> list[tuple[str, procs.Proc]]:
        out = []
        for name, (pid, started) in ((n, tuple(v)) for n, v in state.pids.items()):
            out.append((name, procs.Proc(pid, started)))
        for pidfile in sorted((self.dir / "kubelet" / "pids").glob("*")):
            with contextlib.suppress(ValueError, OSError):
                pid, started = (int(x) for x in pidfile.read_text().split())
                out.append((f"pod:{pidfile.name}", procs.Proc(pid, started)))
        return out

    # ---------------------------------------------------------------- env

    @property
    def slurm_rest_url(self) -> str:
        return f"http://127.0.0.1:{self.load().ports['slurmrestd']}"

    @property
    def slurmctld_addr(self) -> str:
        return f"127.0.0.1:{self.load().ports['slurmctld']}"

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
            "SLURMCTLD_ADDR": f"127.0.0.1:{state.ports['slurmctld']}",
            "SLINKY_TESTBED_DIR": str(self.dir),
            "SLINKY_SLURM_ROOT": str(self.root),
            "SLINKY_ETCD_URL": f"http://127.0.0.1:{state.ports['etcd']}",
            "SLINKY_SERVICE_ADDRESS": self.service_address,
        }

    # ---------------------------------------------------------------- up

    def up(
        self, *, process_nodes: int = 3, kwok_nodes: int = 0, log: Callable[[str], None]
    ) -> None:
        """Start every component and wait until each is ready (or raise with its log)."""
        if self.status_lines(only_running=True):
            raise TestbedError(
                f"test bed {self.dir} is already up; run `slinky testbed down` first"
            )
        self._check_binaries()
        t0 = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.logs.exists():
            shutil.rmtree(self.logs)
        self.logs.mkdir()
        shutil.rmtree(self.dir / "kubelet", ignore_errors=True)
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
            "kwok",
            "slurmctld",
            "slurmd",
            "slurmrestd",
        ]
        state = State(ports=dict(zip(names, procs.free_ports(len(names)), strict=True)))
        state.admin_token = secrets.token_hex(16)
        state.etcd_dir = (
            f"/dev/shm/slinky-etcd-{hashlib.sha1(str(self.dir).encode()).hexdigest()[:10]}"
        )
        state.process_nodes = [f"proc-{i}" for i in range(process_nodes)]
        state.kwok_nodes = [f"kwok-{i}" for i in range(kwok_nodes)]
        self.save(state)
        self._write_kubeconfig(state)
        slurmconf.write_slurm_config(
            self.root, ctld_port=state.ports["slurmctld"], slurmd_port=state.ports["slurmd"]
        )
        state.slurm_token = self.mint_slurm_token()

        try:
            self._start_etcd(state)
            self._start_slurmctld(state)
            self._wait(
                "etcd", lambda: self._http_ok(f"http://127.0.0.1:{state.ports['etcd']}/health"), 30
            )
            self._start_apiserver(state)
            self._wait("slurmctld", self._slurmctld_up, 30)
            self._start_slurmrestd(state)
            self._wait("kube-apiserver", lambda: self._kube_ok(state, "/readyz"), 90)
            self._start_kcm_and_scheduler(state)
            self._start_kubelet(state)
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
            self._wait("nodes", lambda: self._nodes_ready(state), 60)
        except BaseException:
            self.save(state)
            self.down(log=lambda _m: None)
            raise
        self.save(state)
        log(f"test bed up in {time.monotonic() - t0:.1f}s ({self.dir})")

    def _check_binaries(self) -> None:
        missing = [
            b for b in (*KUBE_BINARIES, "etcd", "kwok") if not (paths.bin_dir() / b).exists()
        ]
        if missing or not paths.slurm_root_tarball().exists():
            raise TestbedError(
                f"missing test bed binaries {missing or ['slurm root']}: run `slinky testbed build`"
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
        self, state: State, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None
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
            dead = [
                n
                for n, p in self.tracked_processes(state)
                if not n.startswith("pod:") and not p.alive()
            ]
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
            "nodes": "kubelet",
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
        self._spawn(
            state,
            "apiserver",
            [
                str(paths.bin_dir() / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{state.ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={state.ports['apiserver']}",
                "--endpoint-reconciler-type=none",
                f"--tls-cert-file={k / 'apiserver.crt'}",
                f"--tls-private-key-file={k / 'apiserver.key'}",
                f"--client-ca-file={k / 'ca.crt'}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=Node,RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={k / 'sa.pub'}",
                f"--service-account-signing-key-file={k / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                "--disable-admission-plugins=ServiceAccount",
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
                "--v=1",
            ],
        )
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

    def _start_kubelet(self, state: State) -> None:
        argv = [
            sys.executable,
            "-m",
            "slinky_testbed.kubelet",
            f"--kubeconfig={self.kubeconfig}",
            f"--root={self.root}",
            f"--state-dir={self.dir / 'kubelet'}",
        ]
        argv += [f"--node={n}" for n in state.process_nodes]
        env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._spawn(state, "kubelet", argv, env=env)

    def _start_kwok(self, state: State) -> None:
        if not state.kwok_nodes:
            return
        from slinky_testbed import kubeapi

        api = kubeapi.Admin(self.kubeconfig)
        for name in state.kwok_nodes:
            api.apply_kwok_node(name)
        self._spawn(
            state,
            "kwok",
            [
                str(paths.bin_dir() / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={paths.kwok_stages_file()}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                f"--server-address=127.0.0.1:{state.ports['kwok']}",
                "--node-lease-duration-seconds=40",
            ],
        )

    def _start_slurmctld(self, state: State) -> None:
        self._spawn(state, "slurmctld", ["chroot", str(self.root), "slurmctld", "-D", "-i"])

    def _start_slurmrestd(self, state: State) -> None:
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
                f"127.0.0.1:{state.ports['slurmrestd']}",
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
        }
        start, ready = starters[name]
        start(state)
        self._wait(name, ready, timeout)

    def restart_component(self, name: str) -> None:
        self.stop_component(name)
        self.start_component(name)

    # ---------------------------------------------------------------- readiness probes

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        return ctx

    def _http_ok(self, url: str) -> bool:
        ctx = ssl._create_unverified_context() if url.startswith("https") else None
        with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
            return bool(r.status == 200)

    def _kube_ok(self, state: State, path: str) -> bool:
        req = urllib.request.Request(
            f"https://127.0.0.1:{state.ports['apiserver']}{path}",
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

        want = set(state.process_nodes) | set(state.kwok_nodes)
        return want <= kubeapi.Admin(self.kubeconfig).ready_nodes()

    # ---------------------------------------------------------------- kubeconfig

    def _write_kubeconfig(self, state: State) -> None:
        import base64

        ca = base64.b64encode((self.pki / "ca.crt").read_bytes()).decode()
        config: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "slinky-testbed",
            "clusters": [
                {
                    "name": "slinky-testbed",
                    "cluster": {
                        "server": f"https://127.0.0.1:{state.ports['apiserver']}",
                        "certificate-authority-data": ca,
                    },
                }
            ],
            "users": [{"name": ADMIN_USER, "user": {"token": state.admin_token}}],
            "contexts": [
                {
                    "name": "slinky-testbed",
                    "context": {"cluster": "slinky-testbed", "user": ADMIN_USER},
                }
            ],
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))
        os.chmod(self.kubeconfig, 0o600)

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

    # ---------------------------------------------------------------- down / status

    def down(self, *, log: Callable[[str], None]) -> None:
        """Stop exactly the processes this test bed started, then unmount and free tmpfs."""
        state = self.load()
        tracked = self.tracked_processes(state)
        # The kubelet first, so that it stops its pods' processes itself.
        order = sorted(tracked, key=lambda t: (t[0] != "kubelet", t[0].startswith("pod:")))
        left = procs.stop_all([p for _, p in order[:1]], grace=10) if order else []
        left += procs.stop_all([p for _, p in order[1:]], grace=10)
        if left:
            raise TestbedError(f"processes still running after SIGKILL: {[p.pid for p in left]}")
        self._unmount_root()
        if state.etcd_dir:
            shutil.rmtree(state.etcd_dir, ignore_errors=True)
        state.pids = {}
        state.ports = {}
        self.save(state)
        shutil.rmtree(self.dir / "kubelet", ignore_errors=True)
        self._remove_service_address()
        log(f"test bed down ({self.dir})")

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
        ]
