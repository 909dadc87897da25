"""One reconcile of a Cluster, following the seeds' Cluster controller sequence:

1. deleted? stop the Slurm informer, close the client, drop it from the map, release the
   finalizer;
2. read the referenced Secret (a stored token, or the JWT key to mint tokens) from its by-name
   cache, which the controller starts as soon as a Cluster names it;
3. build (or keep, or re-key) the Slurm client and its informer, and put them in the map;
4. ping slurmctld through slurmrestd;
5. write status: the `Ready` condition with a reason naming the cause, `isReady`, versions,
   last ping time, node count; record an event when readiness changes.

Failures never remove a working connection: a Secret that vanished or a token that was
refused shows up as `Ready=False` and is retried with backoff; NodeSet controllers keep
reading the last Slurm state meanwhile.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

import jwt

from slinky.api.schema import ParseError, parse
from slinky.api.v1alpha1.cluster import ClusterSpec
from slinky.api.v1alpha1.common import parse_duration
from slinky.background import Backoff
from slinky.kube import conditions, events, objects, rest
from slinky.kube.controller import DONE, Result
from slinky.kube.informer import MultiInformer, NamedInformers, NotSynced
from slinky.kube.store import split_key
from slinky.operator.clients import ClusterClients, Connection
from slinky.operator.cluster import diagnose
from slinky.operator.resources import CLUSTERS, FINALIZER
from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.informer import SlurmInformer
from slinky.slurm.tokens import MintedToken, StaticToken, TokenProvider
from slinky.types import JSON

log = logging.getLogger(__name__)

READY = "Ready"
# While a just-referenced Secret's cache does its first list (milliseconds, normally).
NOT_SYNCED_RETRY = 0.2


class ConfigProblem(Exception):
    """The Cluster cannot be connected as configured; `reason` goes into the condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Auth:
    """How to authenticate: a fingerprint to notice changes, and a token provider factory."""

    fingerprint: str
    make_tokens: Callable[[], TokenProvider]
    source: str


@dataclass
class Options:
    token_lifetime: float = 900.0
    ping_interval: float = 30.0
    idle_poll_interval: float = 60.0
    max_retry_interval: float = 60.0


def _secret_value(
    secrets: NamedInformers, namespace: str, name: str, key: str, field: str
) -> bytes:
    secret = secrets.get(f"{namespace}/{name}")
    if secret is None:
        raise ConfigProblem(
            "SecretNotFound",
            f"Secret {namespace}/{name} (from {field}.name) not found; create it with key {key!r}",
        )
    data = secret.get("data") or {}
    if key not in data:
        have = ", ".join(sorted(data)) or "no keys"
        raise ConfigProblem(
            "SecretKeyMissing",
            f"Secret {namespace}/{name} has no key {key!r} (from {field}.key); it has: {have}",
        )
    value = base64.b64decode(data[key])
    if not value.strip():
        raise ConfigProblem("SecretKeyMissing", f"Secret {namespace}/{name} key {key!r} is empty")
    return value


def resolve_auth(
    namespace: str, cspec: ClusterSpec, secrets: NamedInformers, opts: Options
) -> Auth:
    if cspec.jwt_key_ref is not None:
        ref = cspec.jwt_key_ref
        key = _secret_value(secrets, namespace, ref.name, ref.key, "spec.jwtKeyRef")
        fp = hashlib.sha256(key + cspec.username.encode()).hexdigest()[:16]
        return Auth(
            fingerprint=f"jwt:{fp}:{opts.token_lifetime}",
            make_tokens=lambda: MintedToken(key, user=cspec.username, lifetime=opts.token_lifetime),
            source=f"tokens minted from Secret {namespace}/{ref.name} key {ref.key!r}",
        )
    assert cspec.token is not None  # the CRD's CEL rule requires one of the two
    tref = cspec.token
    token = _secret_value(secrets, namespace, tref.secret_ref, tref.key, "spec.token.secretRef")
    text = token.decode(errors="replace").strip()
    user = cspec.username
    with contextlib.suppress(jwt.PyJWTError):  # the token names its user; the header must too
        user = str(jwt.decode(text, options={"verify_signature": False}).get("sun") or user)
    fp = hashlib.sha256(text.encode() + user.encode()).hexdigest()[:16]
    return Auth(
        fingerprint=f"static:{fp}",
        make_tokens=lambda: StaticToken(text, user=user),
        source=f"the token in Secret {namespace}/{tref.secret_ref} key {tref.key!r}",
    )


# Slurm's errors for a failed exchange with slurmctld (slurm_errno.h: the communication
# errors, and their slurmctld variants).
SLURMCTLD_COMM_ERRNOS = frozenset({1001, 1002, 1003, 1004, 1800, 1801, 1802, 1803})
PROBE_TIMEOUT_S = 3.0
# A full node list at least this often. slurmctld restarted from state saved before a
# dynamic node registered has forgotten that node, but its update time went back too, so a
# delta poll says "nothing changed" and the cache keeps the node: the pod would stay Ready
# with no Slurm node until a full list (the 30-minute soak's run 5 saw 5 minutes of it).
# Well within the registration deadline, so `replace_unregistered` acts on time. It costs
# no extra request (the idle poll comes every 60 s anyway), only a larger answer.
SLURM_RESYNC_S = 60.0


def slurmctld_trouble(e: errors.SlurmError) -> bool:
    """Whether slurmrestd answered that it could not talk to slurmctld."""
    return any(
        x.error_number in SLURMCTLD_COMM_ERRNOS
        or "controller" in f"{x.error} {x.description}".lower()
        for x in e.errors
    )


async def listening(url: str) -> bool:
    """Whether something accepts TCP connections at the URL's host and port."""
    u = urllib.parse.urlsplit(url)
    if not u.hostname:
        return False
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(u.hostname, port), PROBE_TIMEOUT_S
        )
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


class ClusterSync:
    """The Cluster reconciler."""

    def __init__(
        self,
        kube: rest.Kube,
        *,
        clusters: MultiInformer,
        secrets: NamedInformers,
        clients: ClusterClients,
        recorder: events.EventRecorder,
        opts: Options | None = None,
    ) -> None:
        self.kube = kube
        self.clusters = clusters
        self.secrets = secrets
        self.clients = clients
        self.recorder = recorder
        self.opts = opts or Options()
        self._failures: dict[str, Backoff] = {}

    async def reconcile(self, key: str) -> Result:
        obj = self.clusters.get(key)
        if obj is None:
            await self.clients.remove(key)
            self._failures.pop(key, None)
            return DONE
        if obj["metadata"].get("deletionTimestamp"):
            return await self._finalize(key, obj)
        if not objects.has_finalizer(obj, FINALIZER):
            obj = await objects.add_finalizer(self.kube, CLUSTERS, obj, FINALIZER)

        namespace, _ = split_key(key)
        try:
            cspec = parse(ClusterSpec, obj.get("spec"), "spec")
            poll_interval = parse_duration(cspec.poll_interval)
            auth = resolve_auth(namespace or "", cspec, self.secrets, self.opts)
        except ParseError as e:
            return await self._not_ready(key, obj, "InvalidSpec", str(e))
        except ValueError as e:
            return await self._not_ready(key, obj, "InvalidSpec", f"spec.pollInterval: {e}")
        except ConfigProblem as e:
            return await self._not_ready(key, obj, e.reason, e.message)
        except NotSynced as e:
            if e.error is None:
                return Result(requeue_after=NOT_SYNCED_RETRY)
            return await self._not_ready(
                key,
                obj,
                "SecretNotReadable",
                f"cannot read Secret {e.key}: {e.error}; the operator needs list and watch on "
                f"it: bind ClusterRole slurm-operator-secrets in namespace {namespace}",
            )

        conn = await self._connection(key, obj, cspec, auth, poll_interval)
        if self._answered_lately(conn):
            # The evidence expires one ping interval after that poll: look again then.
            age = conn.informer.polled_ago
            return await self._connected(obj, cspec, conn, auth, self.opts.ping_interval - age)
        try:
            ping = await conn.client.ping()
        except errors.SlurmAuthError as e:
            hint = (
                "the key differs from the one slurmctld and slurmrestd read at their start "
                "(a rotated key needs both restarted; the slurm chart rolls them)"
                if cspec.jwt_key_ref is not None
                else "check that the token is valid and unexpired, or use spec.jwtKeyRef"
            )
            return await self._not_ready(
                key, obj, "Unauthorized", f"slurmrestd at {cspec.server} refused {auth.source} "
                f"({e}); {hint}"
            )  # fmt: skip
        except errors.SlurmUnavailable as e:
            return await self._unreachable(key, obj, cspec, e)
        except errors.SlurmVersionUnsupported as e:
            return await self._not_ready(key, obj, "UnsupportedVersion", str(e))
        except errors.SlurmError as e:
            if slurmctld_trouble(e):
                return await self._slurmctld_down(
                    key, obj, cspec, f"slurmrestd at {cspec.server} answers, but not slurmctld: {e}"
                )
            return await self._not_ready(key, obj, "SlurmError", f"{cspec.server}: {e}")
        if not ping.responding:
            return await self._slurmctld_down(
                key,
                obj,
                cspec,
                f"slurmrestd at {cspec.server} answers but slurmctld does not respond to ping",
            )

        return await self._connected(obj, cspec, conn, auth)

    async def _unreachable(
        self, key: str, obj: JSON, cspec: ClusterSpec, e: errors.SlurmError
    ) -> Result:
        """slurmrestd's answer did not come: slurmctld's pod may say why; else, when slurmrestd
        accepts connections, it is waiting on slurmctld (or stuck), not gone."""
        if await listening(cspec.server):
            return await self._slurmctld_down(
                key,
                obj,
                cspec,
                f"slurmrestd at {cspec.server} accepts connections but does not answer ({e}): "
                "it waits on slurmctld, which does not respond (or slurmrestd is stuck); check "
                "slurmctld first",
            )
        problem = await self._controller_problem(obj, cspec)
        if problem is not None:
            return await self._not_ready(key, obj, *problem)
        return await self._not_ready(
            key,
            obj,
            "Unreachable",
            f"cannot reach slurmrestd at {cspec.server}: {e}; check spec.server and that "
            "slurmrestd is running",
        )

    async def _slurmctld_down(self, key: str, obj: JSON, cspec: ClusterSpec, said: str) -> Result:
        problem = await self._controller_problem(obj, cspec)
        if problem is not None:
            return await self._not_ready(key, obj, *problem)
        return await self._not_ready(key, obj, "SlurmctldNotResponding", said)

    async def _controller_problem(self, obj: JSON, cspec: ClusterSpec) -> tuple[str, str] | None:
        host = cspec.controller.host if cspec.controller else None
        return await diagnose.controller_problem(
            self.kube, host, str(obj["metadata"].get("namespace") or "")
        )

    def _answered_lately(self, conn: Connection) -> bool:
        """Whether slurmctld answered a poll of the informer within the ping interval (a
        node list comes from slurmctld through slurmrestd): then that answer stands for the
        ping, and the ping costs Slurm nothing in steady state."""
        informer = conn.informer
        return (
            bool(conn.client.slurm_release)  # pinged once: the version is known
            and informer.has_synced
            and not informer.stale
            and informer.polled_ago < self.opts.ping_interval
        )

    async def _connected(
        self,
        obj: JSON,
        cspec: ClusterSpec,
        conn: Connection,
        auth: Auth,
        recheck: float | None = None,
    ) -> Result:
        self._failures.pop(conn.cluster_key, None)
        nodes = len(conn.informer.nodes) if conn.informer.has_synced else None
        message = (
            f"connected to {cspec.server}: Slurm {conn.client.slurm_release}, "
            f"data parser {conn.client.version}, {auth.source}"
        )
        if conn.informer.stale and conn.informer.has_synced:
            message += f"; Slurm state is stale ({conn.informer.last_error})"
        status: JSON = {
            "isReady": True,
            "slurmVersion": conn.client.slurm_release,
            "apiVersion": conn.client.version,
            "lastPingTime": conditions.now_rfc3339(),
        }
        if nodes is not None:
            status["nodes"] = nodes
        await self._write_status(obj, status, True, "Connected", message)
        return Result(requeue_after=max(1.0, recheck or self.opts.ping_interval))

    async def _connection(
        self, key: str, obj: JSON, cspec: ClusterSpec, auth: Auth, poll_interval: float
    ) -> Connection:
        """The live connection for this Cluster: reused, re-keyed or replaced."""
        uid = obj["metadata"]["uid"]
        ctld = f"{cspec.controller.host}:{cspec.controller.port}" if cspec.controller else None
        conn = self.clients.get(key)
        if conn is not None and conn.cluster_uid == uid and conn.server == cspec.server:
            if conn.auth_fingerprint != auth.fingerprint:
                log.info("cluster %s: credentials changed; new token provider", key)
                conn.client.tokens = auth.make_tokens()
                conn.auth_fingerprint = auth.fingerprint
                conn.informer.poke()
            conn.informer.poll_interval = poll_interval
            conn.informer.idle_interval = self.opts.idle_poll_interval
            conn.controller_addr = ctld
            return conn
        client = SlurmClient(cspec.server, auth.make_tokens())
        informer = SlurmInformer(
            client,
            poll_interval=poll_interval,
            idle_interval=self.opts.idle_poll_interval,
            watch_jobs=True,  # pending jobs feed the autoscaling metrics (operator/autoscale)
            resync_interval=SLURM_RESYNC_S,
        )
        conn = Connection(key, uid, cspec.server, client, informer, auth.fingerprint, ctld)
        await self.clients.put(conn)
        return conn

    async def _not_ready(self, key: str, obj: JSON, reason: str, message: str) -> Result:
        log.warning("cluster %s: not ready: %s: %s", key, reason, message)
        await self._write_status(obj, {"isReady": False}, False, reason, message)
        backoff = self._failures.setdefault(key, Backoff(1.0, self.opts.max_retry_interval))
        return Result(requeue_after=backoff.next())

    async def _write_status(
        self, obj: JSON, status: JSON, ready: bool, reason: str, message: str
    ) -> None:
        old = obj.get("status") or {}
        generation = obj["metadata"].get("generation")
        conds, changed = conditions.set_condition(
            old.get("conditions"),
            READY,
            ready,
            reason=reason,
            message=message,
            observed_generation=generation,
        )
        was_ready = conditions.is_true(old.get("conditions"), READY)
        old_reason = (conditions.find(old.get("conditions"), READY) or {}).get("reason")
        new_status = {**status, "conditions": conds, "observedGeneration": generation}
        unchanged = not changed and all(old.get(k) == v for k, v in new_status.items())
        if unchanged and "lastPingTime" not in status:
            return
        try:
            await objects.patch_status(self.kube, CLUSTERS, obj, new_status)
        except rest.ApiError as e:
            if not e.not_found:
                raise
            return
        if ready != was_ready or reason != old_reason:
            kind = events.NORMAL if ready else events.WARNING
            self.recorder.event(obj, kind, reason, message)

    async def _finalize(self, key: str, obj: JSON) -> Result:
        if await self.clients.remove(key):
            self.recorder.event(
                obj, events.NORMAL, "Disconnected", "Slurm client and informer stopped"
            )
        self._failures.pop(key, None)
        await objects.remove_finalizer(self.kube, CLUSTERS, obj, FINALIZER)
        return DONE
