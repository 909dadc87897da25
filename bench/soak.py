"""Chaos soak: run batch jobs and bridge pods for a while on a test bed of its own while
crashing, restarting, scaling, rolling and draining everything around them; then wait for
the work to finish and judge it from Slurm's and Kubernetes' own records.

    python -m bench.soak --duration 30m --seed 1 [--intensity 1] [--keep] [--json]
    make soak SOAK_DURATION=30m SOAK_SEED=1

The test bed (`make dev`'s, plus a second NodeSet: bench/soak_bed.py) lives in
~/.cache/slinky/testbeds/soak (`--dir`), is started fresh and brought down at the end
(`--keep` leaves it up). The chaos table is in bench/soak_chaos.py, the work in
bench/soak_work.py, the invariants in bench/soak_invariants.py, what "recovered" and "stuck"
mean in bench/soak_health.py, the verdicts in bench/soak_report.py. The same seed gives the
same plan of actions (`--plan` prints it and exits).

Progress goes to stderr and `<dir>/soak/events.log`; the report to stdout (`--json`: as
JSON) and `<dir>/soak/report.json`. Exit status 1 when a job was killed by us, an invariant
broke, a bridge pod did not succeed or something stayed stuck; 2 when the soak itself
failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench import (
    soak_accounting,
    soak_bed,
    soak_chaos,
    soak_health,
    soak_metrics,
    soak_report,
    soak_work,
)
from bench.soak_bed import BRIDGE_NAMESPACE, Ports
from bench.soak_invariants import InvariantWatch
from bench.soak_state import Soak
from bench.soak_watch import observe_loop, observe_once, saved_state_loop
from slinky.kube import rest
from slinky.slurm.client import SlurmClient
from slinky.slurm.tokens import MintedToken
from slinky_testbed import procs
from slinky_testbed.bed import Testbed

EVENTS = rest.Resource("", "v1", "events", "Event")
STUCK_WAIT_S = 300.0


def duration(text: str) -> float:
    """Seconds from "90", "150s", "30m", "1h30m"."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 30m, 1h)")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=duration, default=duration("30m"), help="chaos time")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--intensity", type=float, default=1.0, help="chaos and work rate factor")
    p.add_argument("--dir", type=Path, default=soak_bed.DEFAULT_DIR, help="test bed directory")
    p.add_argument("--keep", action="store_true", help="leave the test bed up at the end")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--max-job-seconds", type=int, default=60, help="longest sleep of a job/pod")
    p.add_argument(
        "--settle", type=duration, default=duration("10m"), help="most time for work to end"
    )
    p.add_argument(
        "--actions",
        type=lambda s: tuple(a for a in s.split(",") if a),
        default=soak_chaos.DEFAULT_ACTIONS,
        help="comma-separated chaos actions (default: all but kill-slurmd): "
        + ",".join(c.name for c in soak_chaos.CHAOS),
    )
    p.add_argument("--plan", action="store_true", help="print the chaos plan and exit")
    args = p.parse_args(argv)
    unknown = set(args.actions) - set(soak_chaos.BY_NAME)
    if unknown:
        p.error(f"unknown chaos actions {sorted(unknown)}")
    return args


PLACEHOLDERS_WAIT_S = 120.0


async def work_left(soak: Soak) -> list[str]:
    """Work still under way: jobs not ended (nor held by Slurm), pods not finished (or not
    yet deleted)."""
    out = [
        f"job {j.job_id} {j.final_state or 'not listed yet'}"
        for j in soak.all_jobs()
        if not j.placeholder and not j.finished and not j.held
    ]
    return out + [
        f"pod {p.name} {p.phase or 'not listed yet'}" for p in soak.pods.values() if not p.settled
    ]


async def placeholders_left(soak: Soak) -> list[str]:
    """Placeholder jobs still live (once the pods are done, the bridge cancels them all)."""
    return [
        f"placeholder job {j.job_id} {j.final_state}"
        for j in soak.all_jobs()
        if j.placeholder and not j.finished
    ]


async def pod_events(soak: Soak) -> dict[str, list[str]]:
    """Warning events of the managed namespace, by pod name."""
    out: dict[str, list[str]] = {}
    with contextlib.suppress(*soak_health.UNREACHABLE):
        for e in (await soak.kube.list(EVENTS, BRIDGE_NAMESPACE))["items"]:
            if e.get("type") == "Warning":
                name = (e.get("involvedObject") or {}).get("name", "")
                out.setdefault(name, []).append(f"{e.get('reason')}: {e.get('message')}"[:300])
    return out


async def settle(soak: Soak, invariants: InvariantWatch, work_for: float) -> list[str]:
    """After the chaos: put things back (soak_chaos.restore), wait for the work to end (at
    most `work_for` seconds), for the bridge to cancel its last placeholder jobs, and for
    everything to look right (soak_health); then judge the invariants one last time. Returns
    what stayed wrong."""
    t0 = time.time()
    await soak_chaos.restore(soak)
    left = await soak_chaos.wait_until_fine(soak, lambda: work_left(soak), work_for)
    took = f"{time.time() - t0:.0f}s"
    soak.log(f"work settled after {took}" if not left else f"work NOT settled: {left[:10]}")
    await soak_chaos.wait_until_fine(soak, lambda: placeholders_left(soak), PLACEHOLDERS_WAIT_S)
    stuck = await soak_chaos.wait_until_fine(
        soak, lambda: soak_health.all_problems(soak), STUCK_WAIT_S
    )
    for _ in range(10):
        if await observe_once(soak, invariants, final=True):
            break
        await asyncio.sleep(3)
    return stuck + [f"work not settled: {x}" for x in left]


def hung_stacks(bed: Testbed, stuck: list[str]) -> dict[str, list[str]]:
    """Where the operator or the bridge hangs, when its /healthz still failed at the end:
    its stacks, asked of the live process (CI shows the report, not the log files)."""
    out: dict[str, list[str]] = {}
    pids = bed.load().pids
    for name in ("operator", "bridge"):
        if f"{name} /healthz fails" not in stuck or name not in pids:
            continue
        proc = procs.Proc(*pids[name])
        if not proc.alive():
            out[name] = ["(the process is not running)"]
            continue
        said = procs.ask_stacks(proc.signal, bed.logs / f"{name}.log")
        out[name] = said.splitlines()[-150:] or ["(nothing written within 5s of SIGQUIT)"]
    return out


async def soak_run(args: argparse.Namespace, bed: Testbed, echo: Callable[[str], None]) -> int:
    ports = Ports()
    out = bed.dir / "soak"
    t0 = time.monotonic()
    await asyncio.to_thread(soak_bed.up, bed, log=echo)
    await asyncio.to_thread(soak_bed.install, bed, ports)
    echo(f"test bed up and installed in {time.monotonic() - t0:.0f}s")
    kube = rest.Kube.from_kubeconfig(bed.kubeconfig)
    slurm = SlurmClient(bed.slurm_rest_url, MintedToken.from_file(bed.jwt_key_path, user="root"))
    soak = Soak(bed, kube, slurm, ports, out, echo)
    invariants = InvariantWatch(soak.slurmctld_kills)
    requests = soak_metrics.Requests()

    async def before_stop(name: str) -> None:
        if name in soak_metrics.COUNTERS:
            await soak_metrics.scrape(soak, requests, name)

    soak.before_stop = before_stop
    planned = soak_chaos.plan(args.seed, args.duration, args.intensity, args.actions)
    (out / "plan.txt").write_text("".join(f"{p.at_s:8.1f}s {p.name}\n" for p in planned))
    soak.log(f"seed {args.seed}: {len(planned)} chaos actions planned over {args.duration:.0f}s")
    await soak_metrics.scrape_all(soak, requests, baseline=True)
    background = [
        asyncio.create_task(soak_chaos.supervise(soak)),
        asyncio.create_task(observe_loop(soak, invariants)),
        asyncio.create_task(saved_state_loop(soak)),
        asyncio.create_task(soak_metrics.scrape_loop(soak, requests)),
    ]
    streams = [
        asyncio.create_task(soak.guarded(name, work))
        for name, work in (
            (
                "batch jobs",
                soak_work.batch_stream(soak, args.seed, args.intensity, args.max_job_seconds),
            ),
            ("compute waves", soak_work.compute_waves(soak, args.seed, args.max_job_seconds)),
            (
                "bridge pods",
                soak_work.bridge_stream(soak, args.seed, args.intensity, args.max_job_seconds),
            ),
        )
    ]
    try:
        chaos = asyncio.create_task(soak.guarded("chaos", soak_chaos.run_plan(soak, planned)))
        await asyncio.sleep(args.duration)
        soak.stopping.set()
        await asyncio.gather(*streams)
        soak.log("no more work submitted; waiting for the last chaos action to recover")
        await chaos
        ran_s = time.time() - soak.started_at
        stuck = await settle(soak, invariants, args.settle)
        accounting = await soak_accounting.catch_up(soak) if bed.load().accounting else None
        hangs = await asyncio.to_thread(hung_stacks, bed, stuck)
        await soak_metrics.scrape_all(soak, requests)
        settle_s = time.time() - soak.started_at - ran_s
        events = await pod_events(soak)
    finally:
        for task in [*background, *streams]:
            task.cancel()
        await asyncio.gather(*background, *streams, return_exceptions=True)
        await kube.close()
        await slurm.close()
    report = soak_report.build(
        soak,
        seed=args.seed,
        duration_s=args.duration,
        intensity=args.intensity,
        ran_s=ran_s,
        settle_s=settle_s,
        invariants=invariants,
        requests=requests,
        stuck=stuck,
        hangs=hangs,
        events=events,
        accounting=accounting,
    )
    (out / "report.json").write_text(json.dumps(report.to_json(), indent=2))
    print(json.dumps(report.to_json(), indent=2) if args.json else soak_report.render(report))
    return soak_report.exit_code(report)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.plan:
        for p in soak_chaos.plan(args.seed, args.duration, args.intensity, args.actions):
            print(f"{p.at_s:8.1f}s {p.name}")
        return
    bed = Testbed(args.dir)

    def echo(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    (bed.dir / "soak").mkdir(parents=True, exist_ok=True)
    (bed.dir / "soak" / "events.log").write_text("")
    code = 2
    try:
        code = asyncio.run(soak_run(args, bed, echo))
    finally:
        if args.keep:
            echo(f"test bed left up: `.venv/bin/slinky testbed --dir {bed.dir} down` stops it")
        elif bed.status_lines(only_running=True):
            bed.down(log=echo)
    sys.exit(code)


if __name__ == "__main__":
    main()
