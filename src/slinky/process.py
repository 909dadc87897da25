"""What every long-running process of ours shares: the common flags, logging, signals, the
leader Lease, and a shutdown that waits for in-flight work within a grace period.

`slurm-operator` and `slurm-bridge` declare their own flags beside `add_common_flags` and
hand their work to `run`; everything else about being a Kubernetes controller process is
here, once. Flags are written as Go controllers write them (`--leader-elect=false`,
durations such as `15s`; see `slinky.kube.flags`).
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from slinky import __version__
from slinky.kube import flags, logs, rest, serving
from slinky.kube.leader import LeaderElector, LeadershipLost
from slinky.loopwatch import LoopWatch

log = logging.getLogger(__name__)

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

# Exit codes: 0 stopped cleanly, 1 leadership lost (a restart starts clean), 2 bad flags,
# config or start-up, 3 shutdown overran --graceful-shutdown-timeout.
LEADERSHIP_LOST = 1
CANNOT_START = 2
SHUTDOWN_STUCK = 3


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--version", action="version", version=f"{prog} {__version__}")
    return p


def add_common_flags(
    p: argparse.ArgumentParser, *, leader_elect_help: str, lease_id: str, lease_id_help: str
) -> None:
    """Flags every controller process takes, with kubebuilder's names where one exists."""
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default $KUBECONFIG, else in-cluster)",
    )
    flags.add_bool(p, "--leader-elect", default=True, help=leader_elect_help)
    p.add_argument("--leader-election-id", default=lease_id, help=lease_id_help)
    flags.add_duration(p, "--leader-election-lease-duration", default="15s")
    flags.add_duration(p, "--leader-election-renew-deadline", default="10s")
    flags.add_duration(p, "--leader-election-retry-period", default="2s")
    p.add_argument("--metrics-bind-address", default=":8080", help='"0" disables')
    serving.add_metrics_flags(p)
    p.add_argument("--health-probe-bind-address", default=":8081", help='"0" disables')
    flags.add_duration(
        p,
        "--graceful-shutdown-timeout",
        default="25s",
        help="how long SIGTERM waits for in-flight work before giving up",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", default="text", choices=["text", "json"])


def check_common_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    serving.check_metrics_flags(p, args)


def probe_server(args: argparse.Namespace, kube: rest.Kube) -> serving.ProbeServer:
    """/metrics, /healthz and /readyz as the flags ask (checks are added by the caller)."""
    tls, access = serving.metrics_protection(args, kube)
    server = serving.ProbeServer(metrics_tls=tls, metrics_access=access)
    server.add_health_check("ping", lambda: True)
    return server


def pod_namespace(flag: str | None) -> str:
    """The flag's namespace, else the pod's service-account namespace, else default."""
    if flag:
        return flag
    if SA_NAMESPACE_FILE.exists():
        return SA_NAMESPACE_FILE.read_text().strip()
    return "default"


def identity() -> str:
    """This replica's name on Leases and events: host name and a random suffix."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


async def lead(
    kube: rest.Kube,
    args: argparse.Namespace,
    *,
    name: str,
    namespace: str,
    identity: str,
    work: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
    stop: asyncio.Event,
) -> None:
    """Run `work` while this replica holds Lease `name` (at once with --leader-elect=false);
    it is cancelled when the Lease is lost."""
    if not args.leader_elect:
        await work(stop)
        return
    elector = LeaderElector(
        kube,
        name=name,
        namespace=namespace,
        identity=identity,
        lease_duration=float(args.leader_election_lease_duration),
        renew_deadline=float(args.leader_election_renew_deadline),
        retry_period=float(args.leader_election_retry_period),
    )
    await elector.run(work, stop)


def log_tasks(level: int, limit: int = 3) -> None:
    """Each task of the loop and where it waits (innermost `limit` frames)."""
    for task in asyncio.all_tasks():
        if task is asyncio.current_task():
            continue
        frames = task.get_stack(limit=limit)
        where = " <- ".join(f"{f.f_code.co_filename}:{f.f_lineno}" for f in frames)
        log.log(level, "  %s: %s", task.get_name(), where or "(no frame)")


def report_stuck(grace: float) -> None:
    """Shutdown overran its grace period: say what is still running."""
    log.error("shutdown did not finish within %.0fs; pending tasks:", grace)
    log_tasks(logging.ERROR)


def report_tasks() -> None:
    """SIGUSR1: where every task waits, in the log (the process goes on)."""
    log.warning("SIGUSR1: %d tasks:", len(asyncio.all_tasks()))
    log_tasks(logging.WARNING, limit=8)


async def until_stopped(work: asyncio.Task[None], stop: asyncio.Event, grace: float) -> int:
    """Wait for `work` to end or for `stop`; then give in-flight work `grace` seconds.
    The exit code (see above); what `work` died of is raised."""
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([work, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    done, _ = await asyncio.wait([work], timeout=grace)
    if not done:
        report_stuck(grace)
        work.cancel()
        return SHUTDOWN_STUCK
    try:
        work.result()
    except LeadershipLost:
        log.error("lost leadership; exiting so a restart starts clean")
        return LEADERSHIP_LOST
    return 0


def main(
    parse: Callable[[list[str] | None], argparse.Namespace],
    run: Callable[[argparse.Namespace, asyncio.Event], Awaitable[int]],
    argv: list[str] | None = None,
) -> None:
    """Parse flags, set up logging, make SIGTERM and SIGINT set the stop event, run, exit."""
    sys.exit(asyncio.run(amain(parse, run, argv)))


async def amain(
    parse: Callable[[list[str] | None], argparse.Namespace],
    run: Callable[[argparse.Namespace, asyncio.Event], Awaitable[int]],
    argv: list[str] | None = None,
) -> int:
    args = parse(argv)
    logs.setup(args.log_level, args.log_format)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # What a hung process is doing: SIGUSR1 logs each task's stack (the loop must be free);
    # SIGQUIT writes each thread's stack to stderr even when the loop is blocked, and goes on.
    loop.add_signal_handler(signal.SIGUSR1, report_tasks)
    faulthandler.register(signal.SIGQUIT, all_threads=True)
    # ... and a loop blocked for long says so by itself (see `loopwatch`).
    watch = LoopWatch(loop, formatter=logs.formatter(args.log_format))
    watch.start()
    try:
        return await run(args, stop)
    except OSError as e:
        # A port another process holds: one line naming the flag, not a traceback.
        said = serving.bind_failure(args, e)
        if said is None:
            raise
        log.error("cannot start: %s", said)
        return CANNOT_START
    finally:
        watch.stop()
