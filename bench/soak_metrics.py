"""Requests per minute, per component, from the components' own counters.

- slurmrestd: `slurm_rest_requests_total` on the operator's and the bridge's /metrics;
- apiserver: `rest_client_requests_total` on the same (our clients' own count), and the
  apiserver's `apiserver_request_total` summed over everything (kubelets, controllers, kwok,
  the soak itself) for scale.

A counter restarts with its process, and the chaos restarts them all: each component is
scraped every few seconds (and just before the soak kills it), and a changed
`process_start_time_seconds` means a new process whose counters count from zero. What a
process counted between its last scrape and a kill -9 is lost (a few seconds' worth)."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from bench.soak_health import UNREACHABLE
from bench.soak_state import Soak

SCRAPE_S = 10.0
# A component sending more than this many requests per minute to one server for a minute or
# longer is in a loop (the steady state is a few per minute, a busy soak a few hundred).
STORM_PER_MINUTE = 1200.0
STORM_MIN_S = 60.0
COUNTERS = {
    "operator": ("slurm_rest_requests_total", "rest_client_requests_total"),
    "bridge": ("slurm_rest_requests_total", "rest_client_requests_total"),
    "apiserver": ("apiserver_request_total",),
}
Series = tuple[str, tuple[tuple[str, str], ...]]  # sample name, sorted labels


@dataclass
class Component:
    started: float | None = None  # process_start_time_seconds of the process last scraped
    last: dict[Series, float] = field(default_factory=dict)
    total: dict[Series, float] = field(default_factory=dict)
    restarts_seen: int = 0


@dataclass
class Requests:
    """Counts since the first scrape (the baseline, once the soak's set-up is done)."""

    components: dict[str, Component] = field(
        default_factory=lambda: {name: Component() for name in COUNTERS}
    )
    since: float = 0.0
    until: float = 0.0
    # (component, counter) -> (scrape time, requests per minute since the previous scrape,
    # the busiest endpoint of that span)
    rates: dict[tuple[str, str], list[tuple[float, float, str]]] = field(default_factory=dict)
    scraped_at: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, text: str, *, baseline: bool) -> None:
        comp = self.components[name]
        values: dict[Series, float] = {}
        started = None
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "process_start_time_seconds":
                    started = sample.value
                elif sample.name in COUNTERS[name]:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    values[key] = values.get(key, 0.0) + sample.value
        new_process = comp.started is not None and started != comp.started
        comp.restarts_seen += int(new_process)
        now = time.time()
        span = now - self.scraped_at.get(name, now)
        self.scraped_at[name] = now
        added: dict[str, float] = {}
        busiest: dict[str, tuple[float, str]] = {}
        for key, value in values.items():
            before = 0.0 if new_process else comp.last.get(key, 0.0 if comp.started else value)
            if not baseline:
                delta = max(0.0, value - before)
                comp.total[key] = comp.total.get(key, 0.0) + delta
                added[key[0]] = added.get(key[0], 0.0) + delta
                labels = dict(key[1])
                where = (
                    f"{labels.get('method', labels.get('verb', ''))} {labels.get('endpoint', '')}"
                )
                if delta > busiest.get(key[0], (0.0, ""))[0]:
                    busiest[key[0]] = (delta, where.strip())
        if span > 0 and not new_process:
            for counter, delta in added.items():
                self.rates.setdefault((name, counter), []).append(
                    (now, delta / span * 60, busiest.get(counter, (0.0, ""))[1])
                )
        comp.started, comp.last = started, values

    def per_minute(self, name: str, sample: str, **match: str) -> float:
        minutes = max(1e-9, (self.until - self.since) / 60)
        total = sum(
            v
            for (s, labels), v in self.components[name].total.items()
            if s == sample and all(dict(labels).get(k) == want for k, want in match.items())
        )
        return total / minutes

    def top(self, name: str, sample: str, label_keys: tuple[str, ...], n: int = 5) -> list[str]:
        """The `n` largest series of `sample` grouped by `label_keys`, per minute."""
        minutes = max(1e-9, (self.until - self.since) / 60)
        grouped: dict[str, float] = {}
        for (s, labels), v in self.components[name].total.items():
            if s == sample:
                key = " ".join(dict(labels).get(k, "") for k in label_keys)
                grouped[key] = grouped.get(key, 0.0) + v
        ranked = sorted(grouped.items(), key=lambda kv: -kv[1])[:n]
        return [f"{k} {v / minutes:.1f}" for k, v in ranked]

    def storms(self) -> list[tuple[float, str]]:
        """Spans of STORM_MIN_S or more in which a component sent more than
        STORM_PER_MINUTE requests per minute to one server: (start, what)."""
        out = []
        for (name, sample), series in self.rates.items():
            run: list[tuple[float, float, str]] = []
            for point in [*series, (float("inf"), 0.0, "")]:
                if point[1] > STORM_PER_MINUTE:
                    run.append(point)
                    continue
                if run and run[-1][0] - run[0][0] + SCRAPE_S >= STORM_MIN_S:
                    peak = max(run, key=lambda p: p[1])
                    lasted = run[-1][0] - run[0][0] + SCRAPE_S
                    out.append(
                        (
                            run[0][0] - SCRAPE_S,
                            f"{name} {sample}: over {STORM_PER_MINUTE:.0f}/min for "
                            f"{lasted:.0f}s, peak {peak[1]:.0f}/min (mostly {peak[2]})",
                        )
                    )
                run = []
        return out


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


async def scrape(soak: Soak, requests: Requests, name: str, *, baseline: bool = False) -> None:
    """Scrape one component now (a component that is down is skipped)."""
    try:
        if name == "apiserver":
            text = (await soak.kube.send("GET", "/metrics", accept="text/plain")).text
        else:
            port = soak.ports.operator_metrics if name == "operator" else soak.ports.bridge_metrics
            text = await asyncio.to_thread(fetch, f"http://127.0.0.1:{port}/metrics")
    except (*UNREACHABLE, ValueError):
        return
    requests.add(name, text, baseline=baseline)
    requests.until = time.time()


async def scrape_all(soak: Soak, requests: Requests, *, baseline: bool = False) -> None:
    for name in COUNTERS:
        await scrape(soak, requests, name, baseline=baseline)
    if baseline:
        requests.since = requests.until = time.time()


async def scrape_loop(soak: Soak, requests: Requests) -> None:
    async def one_round() -> None:
        await scrape_all(soak, requests)

    await soak.rounds("scrape", one_round, SCRAPE_S)
