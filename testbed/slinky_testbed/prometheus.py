"""A real Prometheus for a test bed: started as one of the bed's processes (stopped by
`down`), scraping given targets every 2 s and evaluating given rule files every 2 s, with
helpers to run instant queries and to wait until a query returns series.

The binary is Debian sid's Prometheus 3.5 (`hack/build-prometheus.sh`, run by `slinky
testbed build`). Its files live in `<dir>/<name>/` (name `prometheus` unless given):
`prometheus.yml` and the TSDB in `data/`, emptied at each start. It listens
on a free loopback port, recorded in `state.json` under its name (`slinky testbed status`).
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import yaml

from slinky_testbed import paths, procs
from slinky_testbed.bed import Testbed, TestbedError
from slinky_testbed.waiting import WaitTimeout, wait_for

INTERVAL = "2s"
# Where slurmctld serves its OpenMetrics (MetricsType=metrics/openmetrics), on its own port
# (SlurmctldPort); plain `/metrics` only lists these.
SLURMCTLD_METRICS_PATHS = (
    "/metrics/jobs",
    "/metrics/nodes",
    "/metrics/partitions",
    "/metrics/scheduler",
    "/metrics/jobs-users-accts",
)


@dataclass(frozen=True)
class ScrapeJob:
    """One scrape job: `targets` are `host:port`; each target is scraped at every path in
    `paths`. With more than one path, each series carries a `metrics_path` label (else the
    `up` series of one target's paths would be the same series)."""

    name: str
    targets: Sequence[str]
    paths: Sequence[str] = ("/metrics",)
    scheme: str = "http"
    labels: Mapping[str, str] = field(default_factory=dict)
    bearer_token_file: Path | None = None
    ca_file: Path | None = None
    insecure_skip_verify: bool = False


def slurmctld_job(addr: str, *, name: str = "slurmctld") -> ScrapeJob:
    """slurmctld's own metrics at `addr` (`host:port` of slurmctld, e.g. the bed's
    `slurmctld_addr`), every endpoint of the openmetrics plugin."""
    return ScrapeJob(name=name, targets=[addr], paths=SLURMCTLD_METRICS_PATHS)


def render_config(
    jobs: Sequence[ScrapeJob],
    rule_files: Sequence[Path] = (),
    *,
    interval: str = INTERVAL,
) -> dict[str, Any]:
    """prometheus.yml as data. Scrape timeout = interval (Prometheus refuses a longer one)."""
    names = [j.name for j in jobs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"scrape job names must be unique: {dupes}")
    scrape_configs = []
    for job in jobs:
        if not job.targets or not job.paths:
            raise ValueError(f"scrape job {job.name}: no targets or no paths")
        cfg: dict[str, Any] = {"job_name": job.name, "scheme": job.scheme}
        if len(job.paths) == 1:
            cfg["metrics_path"] = job.paths[0]
            cfg["static_configs"] = [_static(job.targets, job.labels)]
        else:
            # `__metrics_path__` set per static config overrides the job's metrics_path.
            cfg["static_configs"] = [
                _static(job.targets, {**job.labels, "__metrics_path__": p, "metrics_path": p})
                for p in job.paths
            ]
        tls: dict[str, Any] = {}
        if job.ca_file is not None:
            tls["ca_file"] = str(job.ca_file)
        if job.insecure_skip_verify:
            tls["insecure_skip_verify"] = True
        if tls:
            cfg["tls_config"] = tls
        if job.bearer_token_file is not None:
            cfg["authorization"] = {"credentials_file": str(job.bearer_token_file)}
        scrape_configs.append(cfg)
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        },
        "rule_files": [str(Path(f).resolve()) for f in rule_files],
        "scrape_configs": scrape_configs,
    }


def _static(targets: Sequence[str], labels: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"targets": list(targets)}
    if labels:
        out["labels"] = dict(labels)
    return out


@dataclass(frozen=True)
class Sample:
    """One series of an instant query's result: its labels (with `__name__`) and value."""

    labels: dict[str, str]
    value: float

    @property
    def name(self) -> str:
        return self.labels.get("__name__", "")


class PrometheusError(RuntimeError):
    """Prometheus answered with an error (e.g. a bad expression)."""


def parse_query_result(body: Mapping[str, Any]) -> list[Sample]:
    """The samples of an `/api/v1/query` answer (vector, scalar; a matrix's last points)."""
    if body.get("status") != "success":
        raise PrometheusError(f"{body.get('errorType')}: {body.get('error')}")
    data = body["data"]
    kind, result = data["resultType"], data["result"]
    if kind == "vector":
        return [Sample(dict(r["metric"]), float(r["value"][1])) for r in result]
    if kind == "scalar":
        return [Sample({}, float(result[1]))]
    if kind == "matrix":
        return [Sample(dict(r["metric"]), float(r["values"][-1][1])) for r in result if r["values"]]
    raise PrometheusError(f"unexpected result type {kind!r}")


@dataclass(frozen=True)
class Target:
    """An active scrape target as `/api/v1/targets` reports it."""

    job: str
    url: str
    health: str  # "up", "down" or "unknown" (not scraped yet)
    last_error: str


def parse_targets(body: Mapping[str, Any]) -> list[Target]:
    if body.get("status") != "success":
        raise PrometheusError(f"{body.get('errorType')}: {body.get('error')}")
    return [
        Target(
            job=t["labels"].get("job", ""),
            url=t["scrapeUrl"],
            health=t["health"],
            last_error=t.get("lastError", ""),
        )
        for t in body["data"]["activeTargets"]
    ]


class Prometheus:
    """A Prometheus of one test bed, by its recorded port."""

    def __init__(self, bed: Testbed, port: int, *, name: str = "prometheus") -> None:
        self.bed = bed
        self.port = port
        self.name = name
        self.url = f"http://127.0.0.1:{port}"

    # ------------------------------------------------------------ start / attach

    @classmethod
    def start(
        cls,
        bed: Testbed,
        jobs: Sequence[ScrapeJob],
        rule_files: Sequence[Path] = (),
        *,
        name: str = "prometheus",
        timeout: float = 60,
    ) -> Prometheus:
        """Write the config, check it with promtool, start Prometheus as a process of the
        bed (`logs/<name>.log`, stopped by `down`) and wait until it is ready."""
        binary = paths.bin_dir() / "prometheus"
        if not binary.exists():
            raise TestbedError(f"no {binary}: run `slinky testbed build`")
        if cls.running(bed, name):
            raise TestbedError(f"{name} already runs for {bed.dir}; stop it or use attach()")
        home = cls.home(bed, name)
        home.mkdir(parents=True, exist_ok=True)
        config = home / "prometheus.yml"
        config.write_text(yaml.safe_dump(render_config(jobs, rule_files), sort_keys=False))
        check = subprocess.run(
            [str(paths.bin_dir() / "promtool"), "check", "config", str(config)],
            capture_output=True,
            text=True,
            check=False,
        )
        if check.returncode != 0:
            raise TestbedError(f"promtool check config {config}:\n{check.stdout}{check.stderr}")
        data = home / "data"
        shutil.rmtree(data, ignore_errors=True)
        (port,) = procs.free_ports(1)
        bed.spawn_extra(
            name,
            [
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                "--storage.tsdb.retention.time=1d",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
            ],
        )
        state = bed.load()
        state.ports[name] = port
        bed.save(state)
        prom = cls(bed, port, name=name)
        prom._wait_ready(timeout)
        return prom

    @classmethod
    def attach(cls, bed: Testbed, *, name: str = "prometheus") -> Prometheus:
        """The one `start` started for this bed, still running."""
        port = bed.load().ports.get(name)
        if port is None or not cls.running(bed, name):
            raise TestbedError(f"no {name} runs for {bed.dir}")
        return cls(bed, port, name=name)

    @staticmethod
    def home(bed: Testbed, name: str = "prometheus") -> Path:
        return bed.dir / name

    @staticmethod
    def running(bed: Testbed, name: str = "prometheus") -> bool:
        pid = bed.load().pids.get(name)
        return pid is not None and procs.Proc(pid[0], pid[1]).alive()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if not self.running(self.bed, self.name):
                raise TestbedError(f"{self.name} exited\n" + self._log_tail())
            time.sleep(0.1)
        raise TestbedError(f"{self.name} not ready after {timeout:.0f}s\n" + self._log_tail())

    def _log_tail(self, lines: int = 30) -> str:
        path = self.bed.logs / f"{self.name}.log"
        tail = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
        return f"--- last lines of {path}:\n" + "\n".join(tail)

    # ------------------------------------------------------------ reconfigure

    async def reload(self, jobs: Sequence[ScrapeJob], rule_files: Sequence[Path] = ()) -> None:
        """Replace the scrape jobs and rule files of the running Prometheus."""
        config = self.home(self.bed, self.name) / "prometheus.yml"
        config.write_text(yaml.safe_dump(render_config(jobs, rule_files), sort_keys=False))
        async with httpx2.AsyncClient(base_url=self.url, timeout=10) as http:
            resp = await http.post("/-/reload")
        if resp.status_code != 200:
            raise PrometheusError(f"reload: HTTP {resp.status_code}: {resp.text.strip()}")

    # ------------------------------------------------------------ queries

    async def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        async with httpx2.AsyncClient(base_url=self.url, timeout=10) as http:
            resp = await http.get(path, params=dict(params or {}))
        try:
            return resp.json()
        except ValueError as e:
            raise PrometheusError(f"GET {path}: HTTP {resp.status_code}: {resp.text[:200]}") from e

    async def query(self, expr: str) -> list[Sample]:
        """An instant query now; a bad expression raises PrometheusError."""
        return parse_query_result(await self._get("/api/v1/query", {"query": expr}))

    async def wait_for_series(
        self, expr: str, *, timeout: float = 30, min_series: int = 1
    ) -> list[Sample]:
        """Poll `expr` until it returns at least `min_series` series; return them. A bad
        expression fails at once; no answer in time raises WaitTimeout with the last one."""

        seen: list[Sample] = []

        async def enough() -> list[Sample]:
            seen[:] = await self.query(expr)
            return list(seen) if len(seen) >= min_series else []

        try:
            return await wait_for(
                enough,
                timeout=timeout,
                what=f"{min_series}+ series of {expr!r} from {self.name}",
                interval=0.5,
                ignore=(httpx2.HTTPError,),
            )
        except WaitTimeout as e:
            raise WaitTimeout(f"{e}; series last returned: {len(seen)}") from None

    async def targets(self) -> list[Target]:
        return parse_targets(await self._get("/api/v1/targets", {"state": "active"}))

    async def wait_targets_up(self, *, timeout: float = 30, job: str | None = None) -> list[Target]:
        """Wait until every active target (of `job`, if given) has been scraped and is up."""

        seen: list[Target] = []

        async def all_up() -> list[Target]:
            seen[:] = [t for t in await self.targets() if job is None or t.job == job]
            return list(seen) if seen and all(t.health == "up" for t in seen) else []

        try:
            return await wait_for(
                all_up,
                timeout=timeout,
                what=f"targets of {job or 'every job'} up in {self.name}",
                interval=0.5,
                ignore=(httpx2.HTTPError,),
            )
        except WaitTimeout as e:
            down = [f"{t.url}: {t.health} {t.last_error}".strip() for t in seen if t.health != "up"]
            raise WaitTimeout(f"{e}; not up: {down or 'no targets'}") from None


def parse_target(spec: str) -> tuple[str, str, str]:
    """`job=host:port[/path]` (the form `--target` takes) → (job, host:port, path)."""
    job, sep, rest = spec.partition("=")
    if not sep or not job or not rest:
        raise ValueError(f"--target {spec!r}: want job=host:port[/path]")
    addr, slash, path = rest.partition("/")
    return job, addr, "/" + path if slash else "/metrics"


def targets_to_jobs(specs: Sequence[str]) -> list[ScrapeJob]:
    """`--target` values → scrape jobs, one per job name (one path each)."""
    jobs: dict[str, tuple[str, list[str]]] = {}
    for spec in specs:
        job, addr, path = parse_target(spec)
        have_path, addrs = jobs.setdefault(job, (path, []))
        if have_path != path:
            raise ValueError(f"--target {spec!r}: job {job} already scrapes {have_path}")
        addrs.append(addr)
    return [ScrapeJob(job, addrs, paths=(path,)) for job, (path, addrs) in jobs.items()]


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m slinky_testbed.prometheus --dir DIR start|query|stop` for use by hand."""
    import argparse
    import asyncio
    import json

    p = argparse.ArgumentParser(prog="python -m slinky_testbed.prometheus")
    p.add_argument("--dir", type=Path, default=None, help="the test bed's directory")
    p.add_argument("--name", default="prometheus", help="several may run per bed")
    cmds = p.add_subparsers(dest="cmd", required=True)
    start = cmds.add_parser("start", help="scrape slurmctld (and --target ...), print the URL")
    start.add_argument(
        "--target",
        action="append",
        default=[],
        help="another scrape target, job=host:port[/path] (repeatable)",
    )
    start.add_argument("--rules", action="append", default=[], type=Path, help="a rule file")
    query = cmds.add_parser("query", help="an instant query; one JSON line per series")
    query.add_argument("expr")
    cmds.add_parser("stop", help="stop it (down stops it too)")
    args = p.parse_args(argv)
    bed = Testbed(args.dir)
    try:
        if args.cmd == "start":
            extra = targets_to_jobs(args.target)
            prom = Prometheus.start(
                bed, [slurmctld_job(bed.slurmctld_addr), *extra], args.rules, name=args.name
            )
            print(prom.url)
        elif args.cmd == "query":
            prom = Prometheus.attach(bed, name=args.name)
            for s in asyncio.run(prom.query(args.expr)):
                print(json.dumps({"labels": s.labels, "value": s.value}))
        elif args.cmd == "stop" and Prometheus.running(bed, args.name):
            bed.remove_extra(args.name)
    except (TestbedError, PrometheusError, ValueError) as e:
        raise SystemExit(f"prometheus: {e}") from None


if __name__ == "__main__":
    main()
