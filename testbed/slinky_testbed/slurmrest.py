"""A raw slurmrestd client for tests (the product's client lives in slinky.slurm)."""

from __future__ import annotations

from typing import Any

import httpx2

JSON = dict[str, Any]


class SlurmRest:
    """GET/POST/DELETE against slurmrestd with JWT headers; returns (status, json)."""

    def __init__(
        self, url: str, token: str, *, user: str = "root", version: str = "v0.0.44"
    ) -> None:
        self.version = version
        self.http = httpx2.AsyncClient(
            base_url=url,
            timeout=10,
            headers={"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": token},
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def call(self, method: str, path: str, body: JSON | None = None) -> tuple[int, JSON]:
        resp = await self.http.request(
            method, f"/slurm/{self.version}/{path.lstrip('/')}", json=body
        )
        try:
            data = resp.json()
        except ValueError:
            data = {"raw": resp.text}
        return resp.status_code, data

    async def node(self, name: str) -> JSON | None:
        """The node record, or None when slurmctld does not know it."""
        status, data = await self.call("GET", f"node/{name}")
        nodes = data.get("nodes") or []
        return nodes[0] if status == 200 and nodes else None

    async def nodes(self) -> list[JSON]:
        status, data = await self.call("GET", "nodes")
        assert status == 200, data
        return list(data.get("nodes") or [])
