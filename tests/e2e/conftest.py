"""Fixtures: one real test bed per session, a namespace per test, clients for both sides."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Generator, Iterator

import pytest

from slinky.kube import rest
from slinky_testbed.bed import Testbed
from slinky_testbed.slurmrest import SlurmRest
from slinky_testbed.waiting import wait_for
from tests.e2e.bridge_fixtures import bridge, bridge_env
from tests.e2e.group_controllers import group_controllers
from tests.e2e.nodeset_fixtures import env
from tests.e2e.operator_fixtures import crds, operator, operator_session
from tests.e2e.workers import worker_bed_dir

SERVICE_ACCOUNTS = rest.Resource("", "v1", "serviceaccounts", "ServiceAccount")

E2E_REAL_NODES = 2
E2E_KWOK_NODES = 2


def _all_running(bed: Testbed) -> bool:
    state = bed.load()
    names = {"etcd", "apiserver", "kcm", "scheduler", "slurmctld", "slurmrestd"}
    names |= {f"{d}-{n}" for n in state.real_nodes for d in ("kubelet", "containerd")}
    running = {line.split()[0] for line in bed.status_lines(only_running=True)}
    return bool(state.ports) and len(state.real_nodes) == E2E_REAL_NODES and names <= running


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """The session's test bed. With SLINKY_TESTBED_REUSE=1 a running one is reused and left
    running; otherwise it is started here and stopped at the end."""
    bed = Testbed(worker_bed_dir("SLINKY_E2E_TESTBED_DIR", "e2e"))
    reuse = os.environ.get("SLINKY_TESTBED_REUSE") == "1"
    if reuse and _all_running(bed):
        yield bed
        return
    if bed.status_lines(only_running=True):
        bed.down(log=print)
    bed.up(real_nodes=E2E_REAL_NODES, kwok_nodes=E2E_KWOK_NODES, log=print)
    try:
        yield bed
    finally:
        if not reuse:
            bed.down(log=print)


@pytest.fixture(scope="session")
async def kube(testbed: Testbed) -> AsyncIterator[rest.Kube]:
    client = rest.Kube.from_kubeconfig(testbed.kubeconfig)
    yield client
    await client.close()


@pytest.fixture(scope="session")
async def slurm(testbed: Testbed) -> AsyncIterator[SlurmRest]:
    client = SlurmRest(testbed.slurm_rest_url, testbed.mint_slurm_token())
    yield client
    await client.close()


@pytest.fixture
async def namespace(kube: rest.Kube, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    digest = uuid.uuid4().hex[:6]  # unique even when a previous run's namespace still terminates
    name = f"t-{request.node.name[:40].lower().replace('_', '-').strip('-')}-{digest}"
    name = "".join(ch for ch in name if ch.isalnum() or ch == "-")
    await kube.create(
        rest.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    # ServiceAccount admission refuses pods until the controller manager made `default`
    # (slower right after a test restarted the apiserver: its informers reconnect first).
    await wait_for(
        lambda: kube.get(SERVICE_ACCOUNTS, "default", name),
        timeout=90,
        what=f"ServiceAccount default in {name}",
        ignore=(rest.ApiError,),
    )
    yield name
    await kube.delete(rest.NAMESPACES, name)


__all__ = [
    "bridge",
    "bridge_env",
    "crds",
    "env",
    "group_controllers",
    "operator",
    "operator_session",
    "wait_for",
]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that used a bridge or operator process of ours carries that process's
    log's end in its report (CI shows the report, not the log file): the last lines that
    name the test's namespace (the process is shared by tests running beside it), then the
    last lines of all."""
    report = yield
    if report.failed:
        funcargs = getattr(item, "funcargs", {})
        namespace = funcargs.get("namespace")
        for name in ("bridge", "bridge_env", "operator", "operator_session"):
            owner = funcargs.get(name)
            proc = getattr(owner, "bridge", owner)  # BridgeEnv holds the process
            if proc is not None and hasattr(proc, "log_tail"):
                if isinstance(namespace, str):
                    report.sections.append(
                        (
                            f"{name} log, lines naming {namespace} (last 80)",
                            proc.log_tail(80, namespace),
                        )
                    )
                report.sections.append((f"{name} log (last 30 lines)", proc.log_tail(30)))
                break
    return report
