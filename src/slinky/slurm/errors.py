"""Slurm errors as exceptions carrying Slurm's own error number and text.

slurmrestd reports failures in an `errors` array; the HTTP status alone is not enough
(a missing node answers 200 or 422, an invalid token 401 or 511). Only a Slurm error number
says "no such object": a bare HTTP 404 means the path is not served. These classes let callers
tell apart the answers that matter: not found, busy, unauthorized, unreachable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Slurm error numbers (slurm_errno.h) we act on.
SLURM_PROTOCOL_AUTHENTICATION_ERROR = 1007
ESLURM_NODES_BUSY = 2016
ESLURM_INVALID_JOB_ID = 2017
ESLURM_INVALID_NODE_NAME = 2018
ESLURM_ALREADY_DONE = 2021
ESLURM_INVALID_PARTITION_NAME = 2000
ESLURM_RESERVATION_INVALID = 2039
AUTH_ERRNO_RANGE = range(6000, 6100)  # ESLURM_AUTH_* (credentials, expired tokens)
NOT_FOUND_ERRNOS = {
    ESLURM_INVALID_JOB_ID,
    ESLURM_INVALID_NODE_NAME,
    ESLURM_INVALID_PARTITION_NAME,
    ESLURM_RESERVATION_INVALID,
}


@dataclass(frozen=True)
class SlurmErrorEntry:
    error_number: int
    error: str
    description: str
    source: str

    @classmethod
    def of(cls, raw: dict[str, Any]) -> SlurmErrorEntry:
        return cls(
            error_number=int(raw.get("error_number") or 0),
            error=str(raw.get("error") or ""),
            description=str(raw.get("description") or ""),
            source=str(raw.get("source") or ""),
        )


class SlurmError(Exception):
    """A request slurmrestd answered with an error. Never carries the token."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        errors: list[SlurmErrorEntry] | None = None,
        endpoint: str = "",
    ) -> None:
        self.status = status
        self.errors = errors or []
        self.endpoint = endpoint
        detail = "; ".join(f"{e.error} ({e.error_number}): {e.description}" for e in self.errors)
        super().__init__(f"{message}{f' [{detail}]' if detail else ''}")

    @property
    def error_numbers(self) -> list[int]:
        return [e.error_number for e in self.errors]


class SlurmNotFound(SlurmError):
    """The node, job, partition or reservation does not exist (a definite answer)."""


class SlurmEndpointMissing(SlurmError):
    """HTTP 404 without a Slurm error: the path is not served (a data parser the server
    stopped serving, a proxy in front of slurmrestd). Not an answer about the object."""


class SlurmNodeBusy(SlurmError):
    """The node runs jobs (e.g. delete of a busy node)."""


class SlurmAuthError(SlurmError):
    """The token was refused (twice: once more after a refresh)."""


class SlurmUnavailable(SlurmError):
    """slurmrestd could not be reached or did not answer in time."""


class SlurmVersionUnsupported(SlurmError):
    """The server serves none of the data-parser versions this client speaks."""


def classify(
    message: str, *, status: int, errors: list[SlurmErrorEntry], endpoint: str
) -> SlurmError:
    """The most specific SlurmError for an answer."""
    numbers = {e.error_number for e in errors}
    kwargs: dict[str, Any] = {"status": status, "errors": errors, "endpoint": endpoint}
    if (
        status == 401
        or SLURM_PROTOCOL_AUTHENTICATION_ERROR in numbers
        or any(n in AUTH_ERRNO_RANGE for n in numbers)
    ):
        return SlurmAuthError(message, **kwargs)
    if ESLURM_NODES_BUSY in numbers or any("busy" in e.error.lower() for e in errors):
        return SlurmNodeBusy(message, **kwargs)
    if numbers & NOT_FOUND_ERRNOS:
        return SlurmNotFound(message, **kwargs)
    if status == 404:
        return SlurmEndpointMissing(message, **kwargs)
    return SlurmError(message, **kwargs)
