"""Secure /metrics: who may read it (TokenReview, then SubjectAccessReview), cached per
token; an apiserver that does not answer decides nothing."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from slinky.kube import rest
from slinky.kube.metricsauth import ACCESS_REVIEWS, TOKEN_REVIEWS, MetricsAccess
from tests.unit.test_helm_charts import REPO, one, render

JSON = dict[str, Any]


class Apiserver:
    """TokenReview: token "good-*" is user "system:serviceaccount:ns:<rest>"; SAR: only
    user ...:prometheus may get /metrics. `down` answers 503."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.down = False

    async def request(self, method: str, path: str, *, body: JSON, **_: Any) -> JSON:
        self.calls.append(path)
        if self.down:
            raise rest.ApiError(503, "ServiceUnavailable", "apiserver restarting")
        if path == TOKEN_REVIEWS:
            token = body["spec"]["token"]
            if not token.startswith("good-"):
                return {"status": {"authenticated": False, "error": "invalid bearer token"}}
            name = token.removeprefix("good-")
            user = {"username": f"system:serviceaccount:ns:{name}", "groups": ["g"]}
            return {"status": {"authenticated": True, "user": user}}
        assert path == ACCESS_REVIEWS
        spec = body["spec"]
        assert spec["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
        return {"status": {"allowed": spec["user"].endswith(":prometheus")}}


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (None, 401),
        ("Basic abc", 401),
        ("Bearer forged", 401),
        ("Bearer good-someone", 403),
        ("Bearer good-prometheus", 200),
    ],
)
async def test_only_a_token_allowed_to_get_metrics_reads_them(
    header: str | None, status: int
) -> None:
    access = MetricsAccess(Apiserver())  # type: ignore[arg-type]
    assert (await access.decide(header)).status == status


async def test_an_answer_is_kept_for_a_minute_and_an_unanswered_review_is_not() -> None:
    api = Apiserver()
    access = MetricsAccess(api)  # type: ignore[arg-type]
    for _ in range(4):  # a scrape every 15 s
        assert (await access.decide("Bearer good-prometheus")).status == 200
    assert api.calls == [TOKEN_REVIEWS, ACCESS_REVIEWS]
    api.down = True
    assert (await access.decide("Bearer good-other")).status == 503
    api.down = False
    assert (await access.decide("Bearer good-other")).status == 403


@pytest.mark.parametrize(
    ("chart", "name"),
    [
        ("slurm-operator", "slurm-operator-metrics-reader"),
        ("slurm-bridge", "slurm-bridge-metrics-reader"),
    ],
)
def test_the_charts_metrics_reader_role_is_config_rbacs(chart: str, name: str) -> None:
    objs = render(chart, namespace="slinky-system", release=chart)
    want = yaml.safe_load((REPO / "config/rbac/metrics_reader_role.yaml").read_text())
    assert one(objs, "ClusterRole", name)["rules"] == want["rules"]
