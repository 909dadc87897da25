"""Types shared by every part of Slinky."""

from __future__ import annotations

from typing import Any

# A decoded JSON object: a Kubernetes object, a slurmrestd answer, a config file.
JSON = dict[str, Any]
