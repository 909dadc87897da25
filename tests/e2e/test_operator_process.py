"""The operator as a process: flags as Kubernetes users write them, and leadership that
never lets two replicas act at once."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import httpx2
import pytest
import yaml

from slinky.kube import rest
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for
from tests.e2e.bridge_fixtures import issue_serving_cert, make_ca
from tests.e2e.operator_fixtures import (
    RBAC_RES,
    REPO,
    OperatorProcess,
    apply_file,
    operator_kubeconfig,
    start_operator,
    wait_ready,
)

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("flag", ["--leader-elect=false", "--leader-elect=true", "--leader-elect"])
async def test_the_operator_runs_with_leader_elect_written_as_go_flags(
    flag: str, kube: rest.Kube, testbed: Testbed, crds: None, tmp_path: Path
) -> None:
    kubeconfig = await operator_kubeconfig(kube, testbed, tmp_path / "kubeconfig")
    op = start_operator(
        kubeconfig,
        tmp_path / "op.log",
        flag,
        "--namespace=e2e-flags-nothing-here",  # acts in no namespace the other tests use
        f"--leader-election-id=e2e-flags-{uuid.uuid4().hex[:6]}",
    )
    try:
        await wait_ready(op)

        async def controllers_started() -> bool:
            text = op.log_path.read_text(errors="replace")
            return "controller nodeset: started" in text and "controller cluster: started" in text

        await wait_for(controllers_started, timeout=60, what="controllers running")
        if flag != "--leader-elect=false":
            assert "acquired the lease" in op.log_path.read_text()
        else:
            assert "acquire" not in op.log_path.read_text()
    finally:
        code = op.stop()
    assert code == 0, op.log_tail()


@pytest.mark.parametrize(
    ("flag", "named"),
    [
        ("--leader-election-lease-duration=banana", "--leader-election-lease-duration"),
        ("--slurm-idle-poll-interval=10", "--slurm-idle-poll-interval"),
        ("--leader-elect=maybe", "--leader-elect"),
    ],
)
def test_garbage_flag_values_exit_2_naming_the_flag(flag: str, named: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "slinky.operator.main", flag],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert named in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


class Blackhole:
    """A TCP forwarder to the apiserver that can be cut: from then on it accepts and reads
    but never answers, like a network partition (requests hang, nothing is refused)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.cut = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.port = 0
        self.connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        # Same address as the apiserver, so its serving certificate still matches.
        self.server = await asyncio.start_server(self._serve, self.target[0], 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                if self.cut.is_set():
                    await asyncio.Event().wait()
                writer.write(data)
                await writer.drain()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:  # cancelled at stop(): a cut connection hangs until then
            self.connections.add(task)
            task.add_done_callback(self.connections.discard)
        if self.cut.is_set():
            await asyncio.Event().wait()
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    async def stop(self) -> None:
        if self.server:
            self.server.close()
        for task in list(self.connections):
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)


def first_time(log: Path, text: str) -> dt.datetime | None:
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if text in rec.get("msg", ""):
                return dt.datetime.fromisoformat(rec["ts"].rstrip("Z"))
    return None


async def test_a_leader_cut_off_from_the_apiserver_stops_before_the_next_one_acts(
    kube: rest.Kube, testbed: Testbed, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = await operator_kubeconfig(kube, testbed, tmp_path / "direct")
    cfg = yaml.safe_load(kubeconfig.read_text())
    server = cfg["clusters"][0]["cluster"]["server"]
    host, _, port = server.removeprefix("https://").rpartition(":")
    proxy = Blackhole(host, int(port))
    await proxy.start()
    cfg["clusters"][0]["cluster"]["server"] = f"https://{host}:{proxy.port}"
    via_proxy = tmp_path / "via-proxy"
    via_proxy.write_text(yaml.safe_dump(cfg))
    lease = f"e2e-lease-{uuid.uuid4().hex[:6]}"
    common = (f"--namespace={namespace}", f"--leader-election-id={lease}", "--log-format=json")
    a = start_operator(via_proxy, tmp_path / "a.log", *common)
    b: OperatorProcess | None = None
    try:
        await wait_ready(a)
        await wait_for(lambda: _logged(a, "acquired the lease"), timeout=30, what="replica A leads")
        b = start_operator(kubeconfig, tmp_path / "b.log", *common)
        await wait_ready(b)  # ready without the Lease: a Deployment can roll
        assert first_time(b.log_path, "acquired the lease") is None, "B acted while A leads"
        proxy.cut.set()
        await wait_for(
            lambda: _logged(b, "acquired the lease"), timeout=60, what="replica B takes over"
        )
        b_acquired = first_time(b.log_path, "acquired the lease")
        a_stopped = first_time(a.log_path, "controllers stopped")
        assert a_stopped is not None, "A never stopped its controllers:\n" + a.log_tail()
        assert b_acquired is not None and a_stopped < b_acquired, (a_stopped, b_acquired)

        async def a_exited() -> bool:
            return a.proc.poll() is not None

        await wait_for(a_exited, timeout=30, what="A exits so a restart starts clean")
        assert a.proc.returncode == 1
    finally:
        if a.proc.poll() is None:
            a.kill()
        if b is not None and b.proc.poll() is None:
            b.stop()
        await proxy.stop()


async def _logged(op: OperatorProcess, text: str) -> bool:
    return first_time(op.log_path, text) is not None


async def test_secure_metrics_answer_only_a_token_allowed_to_get_them(
    kube: rest.Kube, testbed: Testbed, crds: None, namespace: str, tmp_path: Path
) -> None:
    """--metrics-secure=true: /metrics over HTTPS, to a bearer token the apiserver
    authenticates and whose user may get /metrics (config/rbac/metrics_reader_role.yaml,
    bound here to ServiceAccount prometheus); the probes stay plain HTTP."""
    make_ca(tmp_path / "ca")
    issue_serving_cert(tmp_path / "ca", tmp_path / "certs")
    await apply_file(kube, REPO / "config" / "rbac" / "metrics_reader_role.yaml")
    tokens: dict[str, str] = {}
    for sa in ("prometheus", "someone"):
        await kube.create(RBAC_RES["ServiceAccount"], {"metadata": {"name": sa}}, namespace)
        tr = await kube.request(
            "POST",
            RBAC_RES["ServiceAccount"].path(namespace, sa, "token"),
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )
        tokens[sa] = tr["status"]["token"]
    binding = f"e2e-metrics-reader-{namespace}"[:63]
    await kube.create(
        RBAC_RES["ClusterRoleBinding"],
        {
            "metadata": {"name": binding},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "slinky-metrics-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": namespace}],
        },
    )
    kubeconfig = await operator_kubeconfig(kube, testbed, tmp_path / "kubeconfig")
    op = start_operator(
        kubeconfig,
        tmp_path / "op.log",
        "--metrics-secure=true",
        f"--metrics-cert-path={tmp_path / 'certs'}",
        "--namespace=e2e-metrics-nothing-here",
        f"--leader-election-id=e2e-metrics-{uuid.uuid4().hex[:6]}",
    )
    try:
        await wait_ready(op)  # the probes: plain HTTP
        url = op.metrics_url.replace("http://", "https://") + "/metrics"
        ca = str(tmp_path / "ca" / "ca.crt")

        async def scrape(token: str | None) -> httpx2.Response:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with httpx2.AsyncClient(verify=ca, timeout=10) as http:
                return await http.get(url, headers=headers)

        assert (await scrape(None)).status_code == 401
        assert (await scrape("not-a-token")).status_code == 401

        async def allowed() -> httpx2.Response | None:  # the binding may take a moment
            got = await scrape(tokens["prometheus"])
            return got if got.status_code == 200 else None

        got = await wait_for(allowed, timeout=30, what="prometheus reads /metrics")
        assert "controller_runtime_reconcile_total" in got.text
        refused = await scrape(tokens["someone"])
        assert refused.status_code == 403, refused.text
        assert "may not get /metrics" in refused.text
        with pytest.raises(httpx2.HTTPError):  # no plain HTTP on that port
            async with httpx2.AsyncClient(timeout=5) as http:
                await http.get(op.metrics_url + "/metrics")
    finally:
        code = op.stop()
        with contextlib.suppress(rest.ApiError):
            await kube.delete(RBAC_RES["ClusterRoleBinding"], binding)
    assert code == 0, op.log_tail()


DUMMY_KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
    "users": [{"name": "u", "user": {"token": "x"}}],
    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "c",
}


def start_on_a_held_port(
    tmp_path: Path, module: str, flag: str, *extra: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Start `module` with `flag` on a port this test holds (listening); what it said, and
    the flag's value."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(DUMMY_KUBECONFIG))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        value = f"127.0.0.1:{held.getsockname()[1]}"
        proc = subprocess.run(
            [
                sys.executable, "-m", module, f"--kubeconfig={kubeconfig}",
                "--metrics-bind-address=0", "--health-probe-bind-address=0", "--leader-elect=false",
                *extra, f"{flag}={value}",
            ],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    return proc, value


@pytest.mark.parametrize(
    "flag", ["--metrics-bind-address", "--health-probe-bind-address", "--metrics-api-bind-address"]
)
def test_the_operator_on_a_busy_port_says_the_flag_and_port_in_one_line(
    flag: str, tmp_path: Path
) -> None:
    extra: list[str] = []
    if flag == "--metrics-api-bind-address":
        ca_crt = make_ca(tmp_path / "ca")
        issue_serving_cert(tmp_path / "ca", tmp_path / "certs")
        extra = [
            f"--metrics-api-cert-file={tmp_path / 'certs' / 'tls.crt'}",
            f"--metrics-api-key-file={tmp_path / 'certs' / 'tls.key'}",
            f"--metrics-api-client-ca-file={ca_crt}",
        ]
    proc, value = start_on_a_held_port(tmp_path, "slinky.operator.main", flag, *extra)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "address already in use" in ln]
    assert len(lines) == 1 and f"{flag} {value}: address already in use" in lines[0], proc.stderr


@pytest.mark.parametrize("flag", ["--metrics-bind-address", "--webhook-bind-address"])
def test_the_bridge_on_a_busy_port_says_the_flag_and_port_in_one_line(
    flag: str, tmp_path: Path
) -> None:
    (tmp_path / "jwt.key").write_bytes(b"k" * 32)
    config = {
        "clusterId": "t",  # nothing asks the (absent) apiserver for it
        "managedNamespaces": ["a"],
        "slurmRestApi": "http://127.0.0.1:1",
        "slurmAuth": {"jwtKeyFile": str(tmp_path / "jwt.key"), "user": "root"},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    make_ca(tmp_path / "ca")
    issue_serving_cert(tmp_path / "ca", tmp_path / "certs")
    proc, value = start_on_a_held_port(
        tmp_path,
        "slinky.bridge.main",
        flag,
        f"--config={tmp_path / 'config.yaml'}",
        "--components=admission" if flag == "--webhook-bind-address" else "--components=scheduler",
        f"--webhook-cert-path={tmp_path / 'certs'}",
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "address already in use" in ln]
    assert len(lines) == 1 and f"{flag} {value}: address already in use" in lines[0], proc.stderr
