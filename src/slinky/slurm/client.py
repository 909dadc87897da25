"""The async slurmrestd client.

One pooled connection set per Slurm cluster. The data-parser version is negotiated once:
the client reads the versions the server serves (`/openapi/v3`) and uses the newest it
speaks; a bare HTTP 404 (the server stopped serving that version) negotiates again.
Connection errors are retried with backoff (a request that may have reached the server only
when it is idempotent); an HTTP answer is never retried, except a refused token, which is
refreshed and tried once more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import Counter, Histogram

from slinky import jsonio
from slinky.background import Backoff
from slinky.slurm import errors
from slinky.slurm.models import Job, Node, Partition, Ping, Reservation, Resources, number
from slinky.slurm.tokens import TokenProvider
from slinky.transport import Reply, Session, Transport, TransportError
from slinky.types import JSON

log = logging.getLogger(__name__)

Params = (
    Mapping[str, Any] | list[tuple[str, str | int | float | bool | None]] | None
)  # pairs: a key twice
SUPPORTED_VERSIONS = ("v0.0.45", "v0.0.44")

REQUESTS = Counter(
    "slurm_rest_requests_total",
    "Requests sent to slurmrestd",
    ["server", "method", "endpoint", "code"],
)
LATENCY = Histogram(
    "slurm_rest_request_duration_seconds",
    "Latency of slurmrestd requests",
    ["server", "method", "endpoint"],
)

_IDEMPOTENT = {"GET", "DELETE", "HEAD"}
_VERSION_PATH = re.compile(r"/slurm/(v\d+\.\d+\.\d+)/")
# An id after these, not an action (`job/allocate`, `job/submit`).
_ENDPOINT_IDS = re.compile(
    r"/(node|job|partition|reservation|resources)/(?!(?:allocate|submit)(?:/|$))[^/]+"
)


def _endpoint(path: str) -> str:
    """A low-cardinality label: ids replaced by a placeholder."""
    return _ENDPOINT_IDS.sub(lambda m: f"/{m.group(1)}/{{id}}", path)


class SlurmClient:
    """Operations on one Slurm cluster through slurmrestd."""

    def __init__(
        self,
        url: str,
        tokens: TokenProvider,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        versions: tuple[str, ...] = SUPPORTED_VERSIONS,
        max_connections: int = 20,
    ) -> None:
        self.url = url.rstrip("/")
        self.tokens = tokens
        self.retries = retries
        self.versions = versions
        self.version: str | None = None
        self.slurm_release = ""
        self.requests_sent = 0
        self.bytes_received = 0
        self.http: Transport = Session(
            self.url, timeout=timeout, max_connections=max_connections, drop_after_close=True
        )
        self._negotiate_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"SlurmClient({self.url!r}, version={self.version})"

    async def close(self) -> None:
        await self.http.aclose()

    # ------------------------------------------------------------ transport

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        body: Any = None,
        tokens: TokenProvider | None = None,
    ) -> Reply:
        """One HTTP exchange with token refresh on 401 and retries on connection errors;
        as `tokens`' user when given, else as the client's."""
        tokens = tokens or self.tokens
        refreshed = False
        attempt = 0
        backoff = Backoff(0.1, 2.0)
        endpoint = _endpoint(path)
        while True:
            token = await tokens.token()
            headers = {"X-SLURM-USER-NAME": tokens.user, "X-SLURM-USER-TOKEN": token}
            content = None
            if body is not None:
                headers["Content-Type"] = "application/json"
                content = jsonio.dumps(body)
            t0 = time.perf_counter()
            try:
                self.requests_sent += 1
                resp = await self.http.request(
                    method, path, params=params, headers=headers, content=content
                )
            except TransportError as e:
                REQUESTS.labels(self.url, method, endpoint, "error").inc()
                if attempt >= self.retries or (e.sent and method not in _IDEMPOTENT):
                    raise errors.SlurmUnavailable(
                        f"slurmrestd {self.url} unreachable ({method} {endpoint}): {e}",
                        endpoint=endpoint,
                    ) from None
                attempt += 1
                await asyncio.sleep(backoff.next())
                continue
            finally:
                LATENCY.labels(self.url, method, endpoint).observe(time.perf_counter() - t0)
            REQUESTS.labels(self.url, method, endpoint, str(resp.status_code)).inc()
            self.bytes_received += len(resp.content)
            if self._refused_token(resp) and not refreshed:
                tokens.invalidate()
                refreshed = True
                continue
            return resp

    @staticmethod
    def _refused_token(resp: Reply) -> bool:
        if resp.status_code == 401:
            return True
        if resp.status_code in (500, 511):
            try:
                data = resp.json()
            except ValueError:
                return False
            nums = {int(e.get("error_number") or 0) for e in data.get("errors") or []}
            return errors.SLURM_PROTOCOL_AUTHENTICATION_ERROR in nums or any(
                n in errors.AUTH_ERRNO_RANGE for n in nums
            )
        return False

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        body: Any = None,
        what: str = "",
        tokens: TokenProvider | None = None,
    ) -> tuple[int, JSON]:
        """A versioned call: `path` is relative to /slurm/<version>/. Returns (status, body)
        for 2xx/304, raises a classified SlurmError otherwise (or when `errors` is set).
        `tokens`: act as that provider's user instead of the client's."""
        version = await self.negotiate()
        full = f"/slurm/{version}/{path.lstrip('/')}"
        resp = await self._send(method, full, params=params, body=body, tokens=tokens)
        data: JSON = {}
        if resp.content:
            try:
                data = resp.json()
            except ValueError:
                data = {"raw": resp.text[:500]}
        errs = [errors.SlurmErrorEntry.of(e) for e in data.get("errors") or []]
        real_errs = [e for e in errs if e.error_number != 0]
        if resp.status_code >= 400 or real_errs:
            err = errors.classify(
                f"{what or method + ' ' + path} failed: HTTP {resp.status_code}",
                status=resp.status_code,
                errors=errs,
                endpoint=_endpoint(full),
            )
            if isinstance(err, errors.SlurmEndpointMissing) and self.version == version:
                log.warning(
                    "slurmrestd %s: %s is not served; negotiating the data parser again",
                    self.url,
                    full,
                )
                self.version = None
            raise err
        return resp.status_code, data

    # ------------------------------------------------------------ negotiation

    async def negotiate(self) -> str:
        """The newest data-parser version both sides speak (asked once per client)."""
        if self.version:
            return self.version
        async with self._negotiate_lock:
            if self.version:
                return self.version
            resp = await self._send("GET", "/openapi/v3")
            if resp.status_code != 200:
                raise errors.classify(
                    f"reading {self.url}/openapi/v3 failed: HTTP {resp.status_code}",
                    status=resp.status_code,
                    errors=[],
                    endpoint="/openapi/v3",
                )
            try:
                paths = resp.json().get("paths") or {}
            except ValueError:
                paths = {}
            served = {m.group(1) for p in paths if (m := _VERSION_PATH.match(p))}
            for v in self.versions:
                if v in served:
                    self.version = v
                    log.info(
                        "slurmrestd %s: using data parser %s (served: %s)",
                        self.url,
                        v,
                        ", ".join(sorted(served)),
                    )
                    return v
            raise errors.SlurmVersionUnsupported(
                f"slurmrestd {self.url} serves {sorted(served) or 'no versions'}; "
                f"this client speaks {list(self.versions)}"
            )

    # ------------------------------------------------------------ diagnostics

    async def ping(self) -> Ping:
        """Ping slurmctld through slurmrestd. slurmrestd answers a ping made with a refused
        token with HTTP 200 and `"status": "Protocol authentication error"`, so that answer
        is turned into SlurmAuthError here (after one token refresh)."""
        for attempt in range(2):
            _, data = await self.call("GET", "ping/", what="ping")
            p = (data.get("pings") or [{}])[0]
            status = str(p.get("status") or "")
            if "authentication" not in status.lower():
                break
            if attempt == 0:
                self.tokens.invalidate()
        else:
            raise errors.SlurmAuthError(
                f"ping {self.url} refused: {status}", status=200, endpoint="/ping/"
            )
        meta = data.get("meta") or {}
        self.slurm_release = str((meta.get("slurm") or {}).get("release") or "")
        return Ping(
            hostname=str(p.get("hostname") or ""),
            # v0.0.44 adds "pinged": "UP"|"DOWN"; v0.0.45 only has "responding".
            responding=bool(p.get("responding")) and p.get("pinged", "UP") == "UP",
            latency_us=int(p.get("latency") or 0),
            slurm_version=self.slurm_release,
            data_parser=str((meta.get("plugin") or {}).get("data_parser") or ""),
        )

    async def diag(self) -> JSON:
        _, data = await self.call("GET", "diag/", what="diag")
        return dict(data.get("statistics") or {})

    # ------------------------------------------------------------ nodes

    async def list_nodes(self, *, update_time: int | None = None) -> tuple[list[Node] | None, int]:
        """All nodes and the server's `last_update`; (None, update_time) when nothing changed
        since `update_time` (slurmrestd answers 304 then)."""
        params = {"update_time": update_time} if update_time else None
        status, data = await self.call("GET", "nodes/", params=params, what="list nodes")
        last = number(data.get("last_update")) or 0
        if status == 304:
            return None, update_time or last
        return [Node.parse(n) for n in data.get("nodes") or []], last

    async def get_node(self, name: str) -> Node:
        """The node, or SlurmNotFound (slurmrestd answers 200 with no node for a missing one)."""
        _, data = await self.call("GET", f"node/{name}", what=f"get node {name}")
        nodes = data.get("nodes") or []
        if not nodes:
            raise errors.SlurmNotFound(f"node {name} not found", status=200, endpoint="/node/{id}")
        return Node.parse(nodes[0])

    async def update_node(
        self,
        name: str,
        *,
        state: list[str] | str | None = None,
        reason: str | None = None,
        features: list[str] | None = None,
        comment: str | None = None,
        extra: JSON | None = None,
    ) -> None:
        """Update a node: state DRAIN / UNDRAIN / RESUME / DOWN (+reason), features, comment."""
        body: JSON = dict(extra or {})
        if state is not None:
            body["state"] = [state] if isinstance(state, str) else list(state)
        if reason is not None:
            body["reason"] = reason
        if features is not None:
            body["features"] = list(features)
        if comment is not None:
            body["comment"] = comment
        await self.call("POST", f"node/{name}", body=body, what=f"update node {name}")

    async def drain_node(self, name: str, reason: str) -> None:
        await self.update_node(name, state="DRAIN", reason=reason)

    async def undrain_node(self, name: str) -> None:
        await self.update_node(name, state="UNDRAIN")

    async def delete_node(self, name: str) -> None:
        """Delete a node record; SlurmNodeBusy if jobs run, SlurmNotFound if unknown."""
        await self.call("DELETE", f"node/{name}", what=f"delete node {name}")

    async def create_node(self, node_conf: str) -> None:
        """`POST /new/node` with a slurm.conf NodeName line (FUTURE/CLOUD/EXTERNAL only)."""
        await self.call("POST", "new/node/", body={"node_conf": node_conf}, what="create node")

    # ------------------------------------------------------------ jobs

    async def submit_job(self, job: JSON, *, script: str | None = None) -> int:
        """Submit a job description (`job_desc_msg`); returns the job id. Without a script
        and with flags ["EXTERNAL_JOB"] this is a placeholder that Slurm allocates only."""
        body: JSON = {"job": job}
        if script is not None:
            body["script"] = script
        _, data = await self.call("POST", "job/submit", body=body, what="submit job")
        return int(data["job_id"])

    async def allocate_job(self, job: JSON, *, tokens: TokenProvider | None = None) -> int:
        """`POST job/allocate` with `immediate`: slurmctld allocates the job inside the
        request, or refuses it (SlurmNodeBusy, or another SlurmError when a job of higher
        priority waits or a limit holds it) and keeps no pending job, only a FAILED record.
        Never without `immediate`: slurmrestd would wait inside the request for the
        allocation of a pending job (and time out, error 5004). The job belongs to the user
        who asks (a `user_id` in it is not honoured here, unlike on submit): `tokens` of
        that user, else the client's own."""
        body: JSON = {"job": {**job, "immediate": True}}
        _, data = await self.call(
            "POST", "job/allocate", body=body, what="allocate job", tokens=tokens
        )
        return int(data["job_id"])

    async def get_job(self, job_id: int) -> Job:
        _, data = await self.call("GET", f"job/{job_id}", what=f"get job {job_id}")
        jobs = data.get("jobs") or []
        if not jobs:
            raise errors.SlurmNotFound(f"job {job_id} not found", status=200, endpoint="/job/{id}")
        return Job.parse(jobs[0])

    async def job_states(self, job_ids: Sequence[int]) -> dict[int, list[str]]:
        """The states of the jobs given, in one request (`GET /jobs/state/?job_id=1&job_id=2`,
        slurmctld's light job-state call); a job Slurm does not know is left out of the
        answer, which stays 200 (an error answer would close the connection)."""
        if not job_ids:
            return {}
        params: list[tuple[str, str | int | float | bool | None]] = [("job_id", j) for j in job_ids]
        _, data = await self.call("GET", "jobs/state/", params=params, what="job states")
        out: dict[int, list[str]] = {}
        for entry in data.get("jobs") or []:
            with contextlib.suppress(TypeError, ValueError):
                out[int(entry.get("job_id"))] = [str(x) for x in entry.get("state") or []]
        return out

    async def list_jobs(self, *, update_time: int | None = None) -> tuple[list[Job] | None, int]:
        """All jobs slurmctld still knows and `last_update`; (None, update_time) when none
        changed since `update_time`. Not for hot paths: use the informer's cache."""
        params = {"update_time": update_time} if update_time else None
        status, data = await self.call("GET", "jobs/", params=params, what="list jobs")
        last = number(data.get("last_update")) or 0
        if status == 304 or (update_time and last == 0):
            return None, update_time or last
        return [Job.parse(j) for j in data.get("jobs") or []], last

    async def update_job(self, job_id: int, changes: JSON) -> None:
        await self.call("POST", f"job/{job_id}", body=changes, what=f"update job {job_id}")

    async def cancel_job(self, job_id: int, *, signal: str | None = None) -> None:
        """Cancel (or signal) a job. Cancelling a finished or unknown job is not an error."""
        params = {"signal": signal} if signal else None
        try:
            await self.call("DELETE", f"job/{job_id}", params=params, what=f"cancel job {job_id}")
        except errors.SlurmError as e:
            if errors.ESLURM_ALREADY_DONE in e.error_numbers or isinstance(e, errors.SlurmNotFound):
                return
            raise

    async def job_resources(self, job_id: int) -> Resources:
        _, data = await self.call("GET", f"resources/{job_id}", what=f"resources of job {job_id}")
        return Resources(job_id=job_id, raw=data)

    # ------------------------------------------------------------ partitions, reservations

    async def list_partitions(self) -> list[Partition]:
        _, data = await self.call("GET", "partitions/", what="list partitions")
        return [Partition.parse(p) for p in data.get("partitions") or []]

    async def list_partitions_since(
        self, update_time: int | None
    ) -> tuple[list[Partition] | None, int]:
        """All partitions and `last_update`; (None, update_time) when none changed since."""
        params = {"update_time": update_time} if update_time else None
        status, data = await self.call("GET", "partitions/", params=params, what="list partitions")
        last = number(data.get("last_update")) or 0
        if status == 304 or (update_time and last == 0):
            return None, update_time or last
        return [Partition.parse(p) for p in data.get("partitions") or []], last

    async def put_partition(self, partition: JSON) -> None:
        """Create the partition, or update the fields given (`POST /partitions/`)."""
        name = partition.get("name")
        await self.call(
            "POST", "partitions/", body={"partitions": [partition]}, what=f"put partition {name}"
        )

    async def delete_partition(self, name: str) -> None:
        """Delete a partition; SlurmNotFound when it does not exist."""
        await self.call("DELETE", f"partition/{name}", what=f"delete partition {name}")

    async def get_partition(self, name: str) -> Partition:
        _, data = await self.call("GET", f"partition/{name}", what=f"get partition {name}")
        parts = data.get("partitions") or []
        if not parts:
            raise errors.SlurmNotFound(f"partition {name} not found", status=200)
        return Partition.parse(parts[0])

    async def list_reservations(self) -> list[Reservation]:
        _, data = await self.call("GET", "reservations/", what="list reservations")
        return [Reservation.parse(r) for r in data.get("reservations") or []]
