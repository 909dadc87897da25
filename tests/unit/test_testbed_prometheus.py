"""The test bed's Prometheus, without starting one: the config it writes (also checked by the
cached promtool, which `slinky testbed build` fetches), and how query and target answers are
read."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from slinky_testbed import paths
from slinky_testbed.prometheus import (
    SLURMCTLD_METRICS_PATHS,
    PrometheusError,
    Sample,
    ScrapeJob,
    parse_query_result,
    parse_targets,
    render_config,
    slurmctld_job,
    targets_to_jobs,
)

PROMTOOL = paths.bin_dir() / "promtool"


def test_every_interval_is_two_seconds_and_the_timeout_fits_in_it() -> None:
    cfg = render_config([ScrapeJob("operator", ["127.0.0.1:8080"])])
    assert cfg["global"] == {
        "scrape_interval": "2s",
        "scrape_timeout": "2s",
        "evaluation_interval": "2s",
    }


def test_one_path_is_the_jobs_metrics_path() -> None:
    job = ScrapeJob("op", ["127.0.0.1:1", "127.0.0.1:2"], paths=("/m",), scheme="https")
    (scrape,) = render_config([job])["scrape_configs"]
    assert scrape == {
        "job_name": "op",
        "scheme": "https",
        "metrics_path": "/m",
        "static_configs": [{"targets": ["127.0.0.1:1", "127.0.0.1:2"]}],
    }


def test_slurmctld_is_scraped_at_every_endpoint_each_series_naming_its_path() -> None:
    (scrape,) = render_config([slurmctld_job("10.64.0.1:6817")])["scrape_configs"]
    assert scrape["job_name"] == "slurmctld"
    assert "metrics_path" not in scrape
    statics = scrape["static_configs"]
    assert [s["labels"]["__metrics_path__"] for s in statics] == list(SLURMCTLD_METRICS_PATHS)
    assert all(s["labels"]["metrics_path"] == s["labels"]["__metrics_path__"] for s in statics)
    assert all(s["targets"] == ["10.64.0.1:6817"] for s in statics)


def test_static_labels_auth_and_tls_are_passed_on(tmp_path: Path) -> None:
    job = ScrapeJob(
        "secure",
        ["127.0.0.1:9"],
        scheme="https",
        labels={"cluster": "slurm"},
        bearer_token_file=tmp_path / "token",
        ca_file=tmp_path / "ca.crt",
    )
    (scrape,) = render_config([job])["scrape_configs"]
    assert scrape["static_configs"] == [
        {"targets": ["127.0.0.1:9"], "labels": {"cluster": "slurm"}}
    ]
    assert scrape["authorization"] == {"credentials_file": str(tmp_path / "token")}
    assert scrape["tls_config"] == {"ca_file": str(tmp_path / "ca.crt")}


def test_rule_files_are_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = render_config([ScrapeJob("a", ["127.0.0.1:1"])], [Path("rules.yaml")])
    assert cfg["rule_files"] == [str(tmp_path / "rules.yaml")]


@pytest.mark.parametrize(
    "jobs",
    [
        [ScrapeJob("a", ["127.0.0.1:1"]), ScrapeJob("a", ["127.0.0.1:2"])],
        [ScrapeJob("a", [])],
        [ScrapeJob("a", ["127.0.0.1:1"], paths=())],
    ],
)
def test_duplicate_names_and_empty_jobs_are_refused(jobs: list[ScrapeJob]) -> None:
    with pytest.raises(ValueError):
        render_config(jobs)


@pytest.mark.skipif(
    not PROMTOOL.exists(), reason=f"{PROMTOOL} not fetched (`slinky testbed build`)"
)
def test_promtool_accepts_the_rendered_config(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        yaml.safe_dump(
            {"groups": [{"name": "g", "rules": [{"record": "x:up", "expr": "sum(up)"}]}]}
        )
    )
    token = tmp_path / "token"
    token.write_text("t")
    jobs = [
        slurmctld_job("127.0.0.1:6817"),
        ScrapeJob(
            "operator", ["127.0.0.1:8080"], bearer_token_file=token, insecure_skip_verify=True
        ),
    ]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(render_config(jobs, [rules])))
    out = subprocess.run(
        [str(PROMTOOL), "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_vector_answer_becomes_samples() -> None:
    body = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"__name__": "slurm_nodes", "job": "slurmctld"}, "value": [1.5, "3"]},
                {"metric": {"__name__": "up"}, "value": [1.5, "NaN"]},
            ],
        },
    }
    samples = parse_query_result(body)
    assert samples[0] == Sample({"__name__": "slurm_nodes", "job": "slurmctld"}, 3.0)
    assert samples[0].name == "slurm_nodes"
    assert samples[1].value != samples[1].value  # NaN


def test_a_scalar_answer_is_one_sample_without_labels() -> None:
    body = {"status": "success", "data": {"resultType": "scalar", "result": [1.5, "2"]}}
    assert parse_query_result(body) == [Sample({}, 2.0)]


def test_an_error_answer_raises_with_prometheus_message() -> None:
    body = {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}
    with pytest.raises(PrometheusError, match="bad_data: parse error at char 3"):
        parse_query_result(body)


def test_targets_are_read_with_their_health_and_error() -> None:
    body = {
        "status": "success",
        "data": {
            "activeTargets": [
                {
                    "labels": {"job": "slurmctld", "instance": "127.0.0.1:6817"},
                    "scrapeUrl": "http://127.0.0.1:6817/metrics/jobs",
                    "health": "down",
                    "lastError": "connection refused",
                },
                {
                    "labels": {"job": "operator"},
                    "scrapeUrl": "http://127.0.0.1:8080/metrics",
                    "health": "unknown",
                },
            ],
            "droppedTargets": [],
        },
    }
    targets = parse_targets(body)
    assert [(t.job, t.health, t.last_error) for t in targets] == [
        ("slurmctld", "down", "connection refused"),
        ("operator", "unknown", ""),
    ]


def test_targets_given_by_hand_become_one_job_per_name() -> None:
    jobs = targets_to_jobs(["op=127.0.0.1:1", "op=127.0.0.1:2", "b=127.0.0.1:3/m/x"])
    assert jobs == [
        ScrapeJob("op", ["127.0.0.1:1", "127.0.0.1:2"], paths=("/metrics",)),
        ScrapeJob("b", ["127.0.0.1:3"], paths=("/m/x",)),
    ]
    with pytest.raises(ValueError, match="already scrapes /metrics"):
        targets_to_jobs(["op=127.0.0.1:1", "op=127.0.0.1:2/other"])
    with pytest.raises(ValueError, match="want job=host:port"):
        targets_to_jobs(["127.0.0.1:1"])
