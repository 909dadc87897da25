"""config/monitoring/: the alerting rules (checked and unit-tested by the cached promtool,
which `slinky testbed build` fetches) and the Grafana dashboards (they parse, every panel
queries something, every query is PromQL, and every metric they name is one that Slinky or
slurmctld exports)."""

from __future__ import annotations

import json
import re
import subprocess
import types
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import yaml

import slinky.bridge.main
import slinky.operator.main  # noqa: F401  (registers every metric of both processes)
from slinky.kube.informer import InformerObjects
from slinky.operator.autoscale.metrics import NODESET_METRICS, OBJECT_METRICS, PARTITION_METRICS
from slinky_testbed import paths

JSON = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "config/monitoring"
ALERTS = MONITORING / "alerts.yaml"
ALERTS_TEST = MONITORING / "alerts_test.yaml"
DASHBOARDS = sorted((MONITORING / "dashboards").glob("*.json"))
PROMTOOL = paths.bin_dir() / "promtool"
SLURMCTLD_METRICS = Path(__file__).parent / "data/slurmctld_metrics.txt"

needs_promtool = pytest.mark.skipif(
    not PROMTOOL.exists(), reason=f"{PROMTOOL} not fetched (`slinky testbed build` fetches it)"
)


def promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PROMTOOL), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def alert_rules() -> list[JSON]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def dashboards() -> list[JSON]:
    return [json.loads(p.read_text()) for p in DASHBOARDS]


def panels(board: JSON) -> list[JSON]:
    """Every panel, those inside collapsed rows too; rows themselves left out."""
    out = []
    for p in board.get("panels", []):
        if p.get("type") == "row":
            out += p.get("panels", [])
        else:
            out.append(p)
    return out


def dashboard_exprs() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, expr) of every query of every dashboard."""
    return [
        (board["uid"], panel["title"], target["expr"])
        for board in dashboards()
        for panel in panels(board)
        for target in panel.get("targets", [])
    ]


GRAFANA_INTERVALS = re.compile(r"\$\{?(__rate_interval|__interval|__range)\b\}?")
GRAFANA_VARIABLE = re.compile(r"\$\{\w+\}|\$\w+")


def as_promql(expr: str) -> str:
    """A dashboard query as Prometheus takes it: Grafana's interval variables as 5m, every
    template variable (all of them sit in regex matchers) as `.*`, i.e. "All"."""
    return GRAFANA_VARIABLE.sub(".*", GRAFANA_INTERVALS.sub("5m", expr))


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}|\[[^\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "inf", "nan", "atan2", "group_left", "group_right",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (not the functions, labels or keywords)."""
    text = _GROUPING.sub(" ", _MATCHERS.sub(" ", _STRINGS.sub(" ", as_promql(expr))))
    return {n for n in _NAME.findall(text) if n.lower() not in _KEYWORDS}


_SELECTOR = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\{[^}]*\})")


def selectors(expr: str) -> set[str]:
    """`name{matchers}` of an expression, and the names it reads without matchers."""
    with_matchers = {m.group(0) for m in _SELECTOR.finditer(expr)}
    named = {s.split("{", 1)[0] for s in with_matchers}
    return with_matchers | (metric_names(expr) - named)


def slurmctld_names() -> dict[str, str]:
    """Metric name -> path, of what slurmctld serves (data/slurmctld_metrics.txt)."""
    out: dict[str, str] = {}
    path = ""
    for line in SLURMCTLD_METRICS.read_text().splitlines():
        if line.startswith("/"):
            path = line
        elif line.startswith("  "):
            out[line.strip()] = path
    return out


def exported_names() -> set[str]:
    """Every series name the operator, the bridge, slurmctld and Prometheus itself (`up`)
    export."""
    names: set[str] = set()
    families = list(prometheus_client.REGISTRY.collect())
    families += list(InformerObjects(types.SimpleNamespace(informers=[])).collect())  # type: ignore[arg-type]
    for fam in families:
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_count", "_sum"),
            "summary": ("_count", "_sum"),
        }.get(fam.type, ("",))
        names |= {fam.name + s for s in suffixes}
    ours = {*PARTITION_METRICS, *NODESET_METRICS, *OBJECT_METRICS}
    return names | ours | set(slurmctld_names()) | {"up"}


# ---------------------------------------------------------------- alerts


def test_every_alert_waits_has_a_severity_and_says_what_to_do() -> None:
    for rule in alert_rules():
        name = rule["alert"]
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{name}: no `for:`"
        assert rule.get("labels", {}).get("severity") in ("warning", "critical"), name
        annotations = rule.get("annotations", {})
        assert annotations.get("summary"), f"{name}: no summary"
        assert len(annotations.get("description", "")) > 80, f"{name}: no description"


def test_every_alert_reads_only_metrics_that_are_exported() -> None:
    known = exported_names()
    for rule in alert_rules():
        unknown = metric_names(rule["expr"]) - known
        assert not unknown, f"{rule['alert']} reads {sorted(unknown)}, which nothing exports"


def test_every_alert_is_tested_firing_and_quiet() -> None:
    """Each alert has a promtool case where it fires and one where it stays quiet."""
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    cases = [case for t in tests for case in t["alert_rule_test"]]
    for rule in alert_rules():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c.get("exp_alerts") for c in mine), f"{rule['alert']}: no firing case"
        assert any(not c.get("exp_alerts") for c in mine), f"{rule['alert']}: no quiet case"


@needs_promtool
def test_alert_rules_pass_promtool_check() -> None:
    out = promtool("check", "rules", str(ALERTS))
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_alert_rules_pass_their_promtool_unit_tests() -> None:
    out = promtool("test", "rules", ALERTS_TEST.name, cwd=MONITORING)
    assert out.returncode == 0, out.stdout + out.stderr


# ---------------------------------------------------------------- dashboards


def test_there_are_the_three_dashboards() -> None:
    assert {p.name for p in DASHBOARDS} == {
        "slinky-cluster.json",
        "slinky-nodesets.json",
        "slinky-bridge.json",
    }


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_has_identity_a_datasource_variable_and_queries_in_every_panel(
    path: Path,
) -> None:
    board = json.loads(path.read_text())
    assert board.get("uid") == path.stem and board.get("title")
    assert board.get("schemaVersion", 0) >= 39
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert panels(board)
    for panel in panels(board):
        where = f"{path.name}: panel {panel.get('title')!r}"
        assert panel.get("title") and panel.get("description"), where
        assert panel.get("datasource") == {"type": "prometheus", "uid": "${datasource}"}, where
        targets = panel.get("targets") or []
        assert targets, f"{where} has no targets"
        for t in targets:
            assert str(t.get("expr", "")).strip(), f"{where}: a target without expr"
            assert t.get("datasource", panel["datasource"]) == panel["datasource"], where
        used = {m for t in targets for m in GRAFANA_VARIABLE.findall(t["expr"])}
        undefined = {u for u in used if u.strip("${}") not in variables and not u.startswith("$__")}
        assert not undefined, f"{where} uses undefined variables {undefined}"


def test_dashboard_uids_are_unique() -> None:
    uids = [b["uid"] for b in dashboards()]
    assert len(uids) == len(set(uids))


def test_dashboards_read_only_metrics_that_are_exported() -> None:
    known = exported_names()
    for uid, title, expr in dashboard_exprs():
        unknown = metric_names(expr) - known
        assert not unknown, f"{uid}: {title!r} reads {sorted(unknown)}, which nothing exports"


@needs_promtool
def test_every_dashboard_query_is_promql(tmp_path: Path) -> None:
    """promtool has no expression checker: each query becomes a recording rule."""
    exprs = dashboard_exprs()
    rules = [
        {"record": f"slinky_dashboard_query_{i}", "expr": as_promql(expr)}
        for i, (_, _, expr) in enumerate(exprs)
    ]
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    out = promtool("check", "rules", str(path))
    listing = "\n".join(
        f"slinky_dashboard_query_{i}: {uid} / {title}: {expr}"
        for i, (uid, title, expr) in enumerate(exprs)
    )
    assert out.returncode == 0, f"{out.stdout}{out.stderr}\n{listing}"


def test_metric_names_finds_names_not_functions_labels_or_keywords() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, endpoint) ("
        'rate(a_bucket{job=~"$job"}[$__rate_interval])))'
        " / on (server) group_left b_total unless c > bool 0"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


def test_selectors_lists_matchers_and_bare_names() -> None:
    expr = 'sum(rate(a_total{x="1"}[5m])) / b unless c{y=~"2|3"}'
    assert selectors(expr) == {'a_total{x="1"}', "b", 'c{y=~"2|3"}'}
