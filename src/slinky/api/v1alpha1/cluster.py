"""Cluster: the operator's connection to one Slurm cluster through slurmrestd."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slinky.api.schema import prop
from slinky.api.v1alpha1.common import CONDITIONS_SCHEMA, DURATION_PATTERN, Condition

KIND = "Cluster"
PLURAL = "clusters"
DEFAULT_TOKEN_KEY = "auth-token"
DEFAULT_JWT_KEY = "jwt_hs256.key"


@dataclass
class ClusterToken:
    """A stored JWT for slurmrestd."""

    secret_ref: str = prop(
        required=True, description="Name of a Secret in this namespace holding the token."
    )
    key: str = prop(default=DEFAULT_TOKEN_KEY, description="Key of the token in that Secret.")


@dataclass
class SecretKeySelector:
    """A key of a Secret in the same namespace."""

    name: str = prop(required=True, description="Secret name.")
    key: str = prop(default=DEFAULT_JWT_KEY, description="Key in the Secret.")


@dataclass
class ControllerAddress:
    """Where slurmctld listens; handed to slurmd as --conf-server (configless)."""

    host: str = prop(required=True, description="slurmctld host name or address.")
    port: int = prop(default=6817, minimum=1, maximum=65535, description="slurmctld port.")


@dataclass
class ClusterSpec:
    """How to reach a Slurm cluster."""

    __validations__ = [
        (
            "has(self.token) || has(self.jwtKeyRef)",
            "set spec.token.secretRef (a stored token) or spec.jwtKeyRef (the Slurm JWT key)",
            "",
        )
    ]

    server: str = prop(
        required=True,
        pattern=r"^https?://[^\s/]+(/.*)?$",
        description="slurmrestd base URL, e.g. http://slurm-restapi.slurm:6820.",
    )
    token: ClusterToken | None = prop(description="A stored JWT (Secret key auth-token).")
    jwt_key_ref: SecretKeySelector | None = prop(
        description="The Slurm HS256 JWT key; when set the operator mints and renews its own "
        "short-lived tokens."
    )
    username: str = prop(
        default="slurm",
        description="Slurm user the operator acts as (X-SLURM-USER-NAME; `sun` of minted tokens).",
    )
    controller: ControllerAddress | None = prop(description="slurmctld address for slurmd pods.")
    poll_interval: str = prop(
        default="500ms",
        pattern=DURATION_PATTERN,
        description="How often Slurm state is refreshed while something waits on it (a pod "
        "being drained, a rolling update); idle, the operator polls slowly "
        "(--slurm-idle-poll-interval).",
    )


@dataclass
class ClusterStatus:
    """What the operator observed."""

    is_ready: bool | None = prop(description="True when slurmrestd answers with this token.")
    conditions: list[Condition] | None = prop(schema=CONDITIONS_SCHEMA)
    observed_generation: int | None = prop()
    slurm_version: str | None = prop()
    api_version: str | None = prop(description="slurmrestd data parser in use.")
    last_ping_time: str | None = prop(format="date-time")
    nodes: int | None = prop(description="Slurm nodes known to slurmctld.")


@dataclass
class Cluster:
    spec: ClusterSpec = prop(required=True)
    status: ClusterStatus | None = prop()


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Ready", "type": "boolean", "jsonPath": ".status.isReady"},
    {"name": "Server", "type": "string", "jsonPath": ".spec.server"},
    {"name": "Version", "type": "string", "jsonPath": ".status.slurmVersion"},
    {
        "name": "Reason",
        "type": "string",
        "priority": 1,
        "jsonPath": ".status.conditions[?(@.type=='Ready')].reason",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
