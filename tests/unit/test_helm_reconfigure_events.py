"""The slurm chart's reconfigure container records each outcome as an Event on the slurmctld
pod (issue 48, bad input): the account it may do that with (create Events, nothing more),
its token mounted in that container alone, and files/post-event.py run against a small
local HTTP server standing in for the API server (its logic only: the test bed's e2e
test_helm posts to the real one)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_helm_charts import CHARTS, HELM, one, render

JSON = dict[str, Any]
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

pytestmark = pytest.mark.skipif(
    not HELM.exists(), reason=f"{HELM} not built (`make testbed-build` builds it)"
)


def pod_spec(objs: list[JSON]) -> JSON:
    spec: JSON = one(objs, "StatefulSet", "slurm-controller")["spec"]["template"]["spec"]
    return spec


def test_the_slurmctld_pod_has_an_account_that_may_only_create_events() -> None:
    objs = render("slurm")
    sa = one(objs, "ServiceAccount", "slurm-controller")
    assert sa["metadata"]["namespace"] == "slurm"
    assert sa["automountServiceAccountToken"] is False
    role = one(objs, "Role", "slurm-controller-events")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    binding = one(objs, "RoleBinding", "slurm-controller-events")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "slurm-controller-events",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "slurm-controller", "namespace": "slurm"}
    ]
    spec = pod_spec(objs)
    assert spec["serviceAccountName"] == "slurm-controller"
    # The prefix names them all (fullnameOverride).
    other = render("slurm", "fullnameOverride=hpc")
    assert one(other, "RoleBinding", "hpc-controller-events")["subjects"][0]["name"] == (
        "hpc-controller"
    )
    # No slurmctld here, no account for it.
    external = render(
        "slurm",
        "external.enabled=true,external.controllerHost=c,external.restapiUrl=http://c:6820",
        "slurmKey.existingSecret=k,jwtKey.existingSecret=j",
    )
    names = [o["metadata"]["name"] for o in external]
    assert "slurm-controller" not in names and "slurm-controller-events" not in names


def test_the_token_is_mounted_in_the_reconfigure_container_only() -> None:
    spec = pod_spec(render("slurm", "sssd.enabled=true", "sssd.uri=ldaps://l", "sssd.baseDn=dc=x"))
    assert spec["automountServiceAccountToken"] is False
    (api,) = [v for v in spec["volumes"] if v["name"] == "kube-api"]
    sources = api["projected"]["sources"]
    assert sources[0] == {"serviceAccountToken": {"path": "token", "expirationSeconds": 600}}
    # optional: a cluster without that ConfigMap loses the Events, not slurmctld's start.
    assert sources[1] == {
        "configMap": {
            "name": "kube-root-ca.crt",
            "items": [{"key": "ca.crt", "path": "ca.crt"}],
            "optional": True,
        }
    }
    assert sources[2]["downwardAPI"]["items"] == [
        {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
    ]
    containers = spec["containers"] + spec.get("initContainers", [])
    assert len(containers) > 3  # slurmctld, reconfigure, config, sssd
    with_token = {
        c["name"]
        for c in containers
        for m in c.get("volumeMounts", [])
        if m["name"] == "kube-api" or m["mountPath"].startswith("/var/run/secrets")
    }
    assert with_token == {"reconfigure"}
    (reconfigure,) = [c for c in containers if c["name"] == "reconfigure"]
    assert {"name": "kube-api", "mountPath": SA_DIR, "readOnly": True} in reconfigure[
        "volumeMounts"
    ]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in reconfigure["env"]}
    assert env == {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_UID": "metadata.uid",
    }
    # The poster comes from the chart's ConfigMap, mounted where the script runs it.
    assert {
        "name": "reconfigure-scripts",
        "mountPath": "/opt/slurm-reconfigure",
        "readOnly": True,
    } in reconfigure["volumeMounts"]
    assert "python3 /opt/slurm-reconfigure/post-event.py" in reconfigure["command"][-1]


# ---------------------------------------------------------------- post-event.py


@dataclass
class FakeApi:
    """Answers each POST with `status` (and a Status naming why, as the API server does)."""

    status: int = 201
    posts: list[tuple[str, dict[str, str], JSON]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def api() -> Iterator[FakeApi]:
    fake = FakeApi()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fake.posts.append((self.path, dict(self.headers), body))
            reply = body
            if fake.status >= 400:
                reply = {"kind": "Status", "message": 'events is forbidden: User "x" cannot'}
            data = json.dumps(reply).encode()
            self.send_response(fake.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


def post_event(
    tmp_path: Path, url: str, *args: str, token: bool = True
) -> subprocess.CompletedProcess[str]:
    """The chart's post-event.py (as its ConfigMap holds it) run as the container runs it
    (`token`: with a token in its ServiceAccount directory)."""
    tmp_path.mkdir(exist_ok=True)
    script = tmp_path / "post-event.py"
    script.write_text(
        one(render("slurm"), "ConfigMap", "slurm-controller-reconfigure")["data"]["post-event.py"]
    )
    sa = tmp_path / "sa"
    sa.mkdir(exist_ok=True)
    if token:
        (sa / "token").write_text("the-token\n")
    env = dict(
        os.environ,
        KUBE_API_URL=url,
        KUBE_SA_DIR=str(sa),
        POD_NAME="slurm-controller-0",
        POD_NAMESPACE="hpc",
        POD_UID="1234-abcd",
    )
    return subprocess.run(
        [sys.executable, str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_chart_ships_files_post_event_py() -> None:
    shipped = one(render("slurm"), "ConfigMap", "slurm-controller-reconfigure")["data"]
    assert shipped["post-event.py"] == (CHARTS / "slurm/files/post-event.py").read_text()


def test_post_event_sends_an_event_on_the_pod_with_slurms_message(
    api: FakeApi, tmp_path: Path
) -> None:
    slurm = "scontrol: error: _parse_next_key: Parsing error at unrecognized key: BogusKey"
    message = f"changed (+added -removed): slurm.conf: refused by Slurm's parser: {slurm}"
    out = post_event(tmp_path, api.url, "Warning", "ConfigRefused", message)
    assert out.returncode == 0 and out.stdout == "" and out.stderr == "", out
    ((path, headers, event),) = api.posts
    assert path == "/api/v1/namespaces/hpc/events"
    assert headers["Authorization"] == "Bearer the-token"
    assert headers["Content-Type"] == "application/json"
    assert event["kind"] == "Event" and event["apiVersion"] == "v1"
    assert event["metadata"]["namespace"] == "hpc"
    assert event["metadata"]["name"].startswith("slurm-controller-0.")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "slurm-controller-0",
        "namespace": "hpc",
        "uid": "1234-abcd",
    }
    assert (event["type"], event["reason"], event["message"]) == (
        "Warning",
        "ConfigRefused",
        message,
    )
    assert event["source"] == {"component": "slurm-reconfigure"}
    assert event["reportingComponent"] == "slurm-reconfigure"
    assert event["reportingInstance"] == "slurm-controller-0"
    assert event["count"] == 1 and event["firstTimestamp"] == event["lastTimestamp"]
    assert event["firstTimestamp"].endswith("Z") and event["eventTime"].endswith("Z")
    # Each Event its own name; a long message is cut to what an Event holds.
    post_event(tmp_path, api.url, "Normal", "Reconfigured", "x" * 5000)
    second = api.posts[1][2]
    assert second["metadata"]["name"] != event["metadata"]["name"]
    assert len(second["message"]) == 1000 and second["message"].endswith("...")


def test_post_event_says_once_when_it_cannot_post_and_exits_0(api: FakeApi, tmp_path: Path) -> None:
    api.status = 403
    out = post_event(tmp_path, api.url, "Warning", "ConfigRefused", "refused")
    assert out.returncode == 0, out
    assert out.stdout.count("\n") == 1, out
    assert "could not record Event ConfigRefused" in out.stdout
    assert "403" in out.stdout and "events is forbidden" in out.stdout
    # Nothing listening.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    out = post_event(tmp_path, closed, "Normal", "Reconfigured", "applied")
    assert out.returncode == 0 and out.stdout.count("\n") == 1, out
    assert "could not record Event Reconfigured" in out.stdout and out.stderr == ""
    # No token mounted (a site removed the volume): nothing sent, said once.
    out = post_event(
        tmp_path / "no-token", api.url, "Normal", "Reconfigured", "applied", token=False
    )
    assert out.returncode == 0 and out.stdout.count("\n") == 1, out
    assert "could not record Event Reconfigured" in out.stdout and "token" in out.stdout
    assert len(api.posts) == 1  # the 403 one only
