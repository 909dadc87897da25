"""Pure logic of slinky.slurm: node state rules, error classification, token providers."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest

from slinky.slurm import errors
from slinky.slurm.client import _endpoint
from slinky.slurm.models import Job, Node, NodeState, number
from slinky.slurm.tokens import MintedToken, StaticToken, TokenFile


@pytest.mark.parametrize(
    ("states", "drained", "busy"),
    [
        (["IDLE", "DRAIN"], True, False),
        (["IDLE"], False, False),
        (["MIXED", "DRAIN"], False, True),
        (["ALLOCATED", "DRAIN"], False, True),
        (["IDLE", "DRAIN", "COMPLETING"], False, True),
        (["DOWN", "DRAIN", "NOT_RESPONDING"], True, False),
        (["IDLE", "DYNAMIC_NORM"], False, False),
    ],
)
def test_drained_means_drain_and_nothing_running(
    states: list[str], drained: bool, busy: bool
) -> None:
    s = NodeState.parse(states)
    assert s.is_drained is drained
    assert s.is_busy is busy


def test_node_state_base_and_flags() -> None:
    s = NodeState.parse(["DRAIN", "IDLE", "NOT_RESPONDING"])
    assert s.base == "IDLE"
    assert s.flags == {"DRAIN", "NOT_RESPONDING"}
    assert str(s) == "IDLE+DRAIN+NOT_RESPONDING"
    assert NodeState.parse([]).base == "UNKNOWN"


def test_node_and_job_parse_no_val_structs() -> None:
    n = Node.parse({"name": "a", "state": ["MIXED"], "features": "x,y", "cpus": 4})
    assert n.features == ["x", "y"] and n.state.is_busy
    j = Job.parse(
        {
            "job_id": 7,
            "job_state": ["RUNNING"],
            "time_limit": {"set": True, "number": 10},
            "end_time": {"set": False, "number": 0},
        }
    )
    assert j.time_limit_min == 10 and j.end_time is None and j.is_running
    assert number({"set": True, "infinite": True, "number": 5}) is None


def entry(n: int, text: str = "") -> errors.SlurmErrorEntry:
    return errors.SlurmErrorEntry(n, text, "", "")


def test_errors_are_classified_by_slurm_number_not_only_http_status() -> None:
    kw = {"endpoint": "/x"}
    assert isinstance(
        errors.classify("m", status=422, errors=[entry(2018)], **kw), errors.SlurmNotFound
    )
    assert isinstance(
        errors.classify("m", status=404, errors=[entry(2017)], **kw), errors.SlurmNotFound
    )
    assert isinstance(
        errors.classify("m", status=500, errors=[entry(2016)], **kw), errors.SlurmNodeBusy
    )
    assert isinstance(
        errors.classify("m", status=511, errors=[entry(1007)], **kw), errors.SlurmAuthError
    )
    assert isinstance(errors.classify("m", status=401, errors=[], **kw), errors.SlurmAuthError)
    plain = errors.classify("m", status=500, errors=[entry(9999, "odd")], **kw)
    assert type(plain) is errors.SlurmError and "odd (9999)" in str(plain)


async def test_minted_token_claims_and_renewal() -> None:
    t = MintedToken(b"k" * 32, user="slurm", lifetime=60, refresh_before=20)
    tok = await t.token()
    claims = jwt.decode(tok, b"k" * 32, algorithms=["HS256"])
    assert claims["sun"] == "slurm" and claims["exp"] - claims["iat"] == 60
    assert await t.token() == tok, "reused while fresh"
    t._expires = time.time() + 10  # inside the refresh window
    assert await t.token() != tok or t.minted == 2
    assert t.minted == 2
    t.invalidate()
    await t.token()
    assert t.minted == 3
    assert tok not in repr(t)


async def test_static_and_file_tokens_hide_secrets(tmp_path: object) -> None:
    assert "secret" not in repr(StaticToken("secret"))
    from pathlib import Path

    p = Path(str(tmp_path)) / "t"
    p.write_text("one\n")
    f = TokenFile(p)
    assert await f.token() == "one"
    p.write_text("two-longer\n")
    assert await f.token() == "two-longer"
    assert "two" not in repr(f)


async def test_tokens_minted_from_a_key_file_follow_a_rotated_key(tmp_path: Path) -> None:
    """A mounted Secret is a symlink the kubelet swaps (..data -> ..<timestamp>); the key
    read at start must not stay in use after a rotation, nor need a restart."""

    def mount(version: str, key: bytes) -> None:
        (tmp_path / version).mkdir()
        (tmp_path / version / "jwt_hs256.key").write_bytes(key)
        link = tmp_path / "..data.tmp"
        link.symlink_to(version)
        link.rename(tmp_path / "..data")  # the swap is atomic, as the kubelet's is

    mount("v1", b"k" * 32)
    (tmp_path / "jwt_hs256.key").symlink_to("..data/jwt_hs256.key")
    tokens = MintedToken.from_file(tmp_path / "jwt_hs256.key", user="slurm", lifetime=600)
    first = await tokens.token()
    jwt.decode(first, b"k" * 32, algorithms=["HS256"])
    assert await tokens.token() == first  # unchanged key: the same token
    mount("v2", b"n" * 32)
    second = await tokens.token()
    assert second != first
    jwt.decode(second, b"n" * 32, algorithms=["HS256"])


def test_a_request_metric_names_the_endpoint_with_ids_replaced_but_actions_kept() -> None:
    """`job/allocate` and `job/submit` are actions, not job ids: they were counted as
    `job/{id}`, mixed with the updates of jobs."""
    v = "/slurm/v0.0.44"
    assert _endpoint(f"{v}/job/123") == f"{v}/job/{{id}}"
    assert _endpoint(f"{v}/job/allocate") == f"{v}/job/allocate"
    assert _endpoint(f"{v}/job/submit") == f"{v}/job/submit"
    assert _endpoint(f"{v}/node/kwok-1") == f"{v}/node/{{id}}"
    assert _endpoint(f"{v}/jobs/state/") == f"{v}/jobs/state/"
