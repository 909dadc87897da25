"""The slurm chart's keys hook (python -m slinky.operator.keys): a missing key Secret is made,
one that exists is never changed, and a slurm.key gone under a running slurmctld is refused."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import pytest

from slinky.kube import rest
from slinky.operator import keys
from slinky.operator.keys import STATEFULSETS, Key, Refused, ensure

JSON = dict[str, Any]
NS = "slurm"


class FakeKube:
    """Secrets and StatefulSets by name; records every create."""

    def __init__(self, secrets: dict[str, JSON] | None = None, sts: tuple[str, ...] = ()) -> None:
        self.objs: dict[tuple[str, str], JSON] = {
            ("secrets", n): {"metadata": {"name": n}, "data": d} for n, d in (secrets or {}).items()
        }
        for n in sts:
            self.objs[("statefulsets", n)] = {"metadata": {"name": n}}
        self.created: list[str] = []
        self.patches: list[str] = []
        self.race: JSON | None = None  # made by someone else between our get and create

    async def get(self, res: rest.Resource, name: str, namespace: str | None = None) -> JSON:
        assert namespace == NS
        got = self.objs.get((res.plural, name))
        if got is None:
            raise rest.ApiError(404, "NotFound", f'{res.plural} "{name}" not found')
        return copy.deepcopy(got)

    async def create(self, res: rest.Resource, obj: JSON, namespace: str | None = None) -> JSON:
        assert namespace == NS and res is rest.SECRETS
        name = obj["metadata"]["name"]
        if self.race is not None:
            self.objs[(res.plural, name)] = self.race
            raise rest.ApiError(409, "AlreadyExists", f'secrets "{name}" already exists')
        assert (res.plural, name) not in self.objs
        self.objs[(res.plural, name)] = copy.deepcopy(obj)
        self.created.append(name)
        return obj

    async def patch(
        self, res: rest.Resource, name: str, patch: JSON, namespace: str | None = None
    ) -> JSON:
        assert namespace == NS and res is rest.SECRETS and set(patch) == {"metadata"}
        self.patches.append(name)
        meta = self.objs[(res.plural, name)]["metadata"]
        meta.setdefault("annotations", {}).update(patch["metadata"]["annotations"])
        return dict(self.objs[(res.plural, name)])

    def data(self, name: str) -> dict[str, bytes]:
        raw = self.objs[("secrets", name)]["data"]
        return {k: base64.b64decode(v) for k, v in raw.items()}


def chart_keys(host_key: Path) -> list[Key]:
    """What the chart passes with accounting's MariaDB and login pods on."""
    return [
        keys.parse_key("bytes", "s-slurm-key/slurm.key=1024"),
        keys.parse_key("bytes", "s-jwt-key/jwt_hs256.key=32"),
        keys.parse_key("alnum", "s-mariadb/password=24"),
        keys.parse_key("file", f"s-ssh-host-keys/ssh_host_ecdsa_key={host_key}"),
    ]


def host_key(tmp_path: Path) -> Path:
    path = tmp_path / "ssh_host_ecdsa_key"
    path.write_bytes(b"-----BEGIN EC PRIVATE KEY-----\nx\n-----END EC PRIVATE KEY-----\n")
    return path


async def test_missing_secrets_are_made_with_the_sizes_slurm_expects(tmp_path: Path) -> None:
    kube = FakeKube()
    labels = {"slinky.slurm.net/keys-of": "s"}
    done = await ensure(kube, NS, chart_keys(host_key(tmp_path)), labels=labels)
    assert kube.created == ["s-slurm-key", "s-jwt-key", "s-mariadb", "s-ssh-host-keys"]
    assert done[0] == f"made Secret {NS}/s-slurm-key (slurm.key)"
    assert len(kube.data("s-slurm-key")["slurm.key"]) == 1024
    assert len(kube.data("s-jwt-key")["jwt_hs256.key"]) == 32
    password = kube.data("s-mariadb")["password"]
    assert len(password) == 24 and password.isalnum()
    assert kube.data("s-ssh-host-keys")["ssh_host_ecdsa_key"].startswith(b"-----BEGIN EC")
    assert kube.objs[("secrets", "s-jwt-key")]["metadata"]["labels"] == labels


async def test_a_second_run_changes_nothing_and_an_existing_secret_is_never_rewritten(
    tmp_path: Path,
) -> None:
    kube = FakeKube()
    wanted = chart_keys(host_key(tmp_path))
    await ensure(kube, NS, wanted)
    before = copy.deepcopy(kube.objs)
    kube.created.clear()
    done = await ensure(kube, NS, wanted, guard=frozenset({"s-slurm-key"}), controller="c")
    assert kube.created == [] and kube.objs == before
    assert done == [
        f"kept Secret {NS}/{n}"
        for n in ("s-slurm-key", "s-jwt-key", "s-mariadb", "s-ssh-host-keys")
    ]
    # A Secret the site made itself (other bytes, other keys besides) is kept as it is.
    site = FakeKube({"s-jwt-key": {"jwt_hs256.key": "c2l0ZQ==", "other": "eA=="}})
    await ensure(site, NS, wanted[1:2])
    assert site.created == [] and site.data("s-jwt-key") == {
        "jwt_hs256.key": b"site",
        "other": b"x",
    }


async def test_a_slurm_key_gone_under_a_running_slurmctld_is_refused_naming_it() -> None:
    kube = FakeKube({"s-jwt-key": {"jwt_hs256.key": "c2l0ZQ=="}}, sts=("s-controller",))
    wanted = [keys.parse_key("bytes", "s-slurm-key/slurm.key=1024")]
    with pytest.raises(Refused) as refused:
        await ensure(kube, NS, wanted, guard=frozenset({"s-slurm-key"}), controller="s-controller")
    assert f"Secret {NS}/s-slurm-key (key slurm.key) is gone" in str(refused.value)
    assert "slurmKey.regenerate=true" in str(refused.value)
    assert kube.created == []
    # Asked for knowingly: made.
    await ensure(
        kube,
        NS,
        wanted,
        guard=frozenset({"s-slurm-key"}),
        controller="s-controller",
        regenerate=True,
    )
    assert kube.created == ["s-slurm-key"]
    # A first install (no slurmctld yet) makes it.
    fresh = FakeKube()
    await ensure(fresh, NS, wanted, guard=frozenset({"s-slurm-key"}), controller="s-controller")
    assert fresh.created == ["s-slurm-key"]


async def test_a_secret_without_its_key_is_refused_and_left_alone() -> None:
    kube = FakeKube({"s-mariadb": {"pass": "eA=="}})
    with pytest.raises(Refused, match="Secret slurm/s-mariadb exists without key password"):
        await ensure(kube, NS, [keys.parse_key("alnum", "s-mariadb/password=24")])
    assert kube.data("s-mariadb") == {"pass": b"x"}


async def test_a_secret_made_meanwhile_by_another_run_is_kept() -> None:
    kube = FakeKube()
    kube.race = {"metadata": {"name": "s-jwt-key"}, "data": {"jwt_hs256.key": "b3RoZXI="}}
    done = await ensure(kube, NS, [keys.parse_key("bytes", "s-jwt-key/jwt_hs256.key=32")])
    assert done == [f"kept Secret {NS}/s-jwt-key"]
    assert kube.data("s-jwt-key") == {"jwt_hs256.key": b"other"}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--bytes", "s-slurm-key=1024"], "expected SECRET/KEY=VALUE"),
        (["--alnum", "s/password=x"], "the size must be a positive number"),
        (["--label", "novalue"], "expected KEY=VALUE"),
    ],
)
def test_bad_arguments_are_refused_naming_them(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        keys.main(["--namespace", NS, *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_statefulsets_resource_is_apps_v1() -> None:
    assert STATEFULSETS.path(NS, "c") == f"/apis/apps/v1/namespaces/{NS}/statefulsets/c"


async def test_a_secret_an_earlier_chart_rendered_is_marked_keep_and_its_data_left_alone() -> None:
    """Upgrading from a chart version that rendered the key: the Secret leaves the manifest
    and Helm would delete it (Argo CD prune it) but for these annotations."""
    kube = FakeKube({"s-slurm-key": {"slurm.key": "b2xk"}})
    kube.objs[("secrets", "s-slurm-key")]["metadata"]["annotations"] = {
        "meta.helm.sh/release-name": "s"
    }
    wanted = [keys.parse_key("bytes", "s-slurm-key/slurm.key=1024")]
    done = await ensure(kube, NS, wanted)
    assert done == [f"kept Secret {NS}/s-slurm-key (an earlier chart's: marked keep)"]
    notes = kube.objs[("secrets", "s-slurm-key")]["metadata"]["annotations"]
    assert notes["helm.sh/resource-policy"] == "keep"
    assert notes["argocd.argoproj.io/sync-options"] == "Prune=false"
    assert kube.data("s-slurm-key") == {"slurm.key": b"old"} and kube.created == []
    # Once marked, nothing more; a Secret Helm never made is not touched at all.
    assert await ensure(kube, NS, wanted) == [f"kept Secret {NS}/s-slurm-key"]
    site = FakeKube({"s-slurm-key": {"slurm.key": "b2xk"}})
    await ensure(site, NS, wanted)
    assert kube.patches == ["s-slurm-key"] and site.patches == []
