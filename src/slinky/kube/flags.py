"""Command-line flags written the way Kubernetes users write them for Go controllers.

Helm charts and kubebuilder manifests pass `--leader-elect=false`, `--leader-elect=true` or a
bare `--leader-elect`, and durations in Go syntax (`90s`, `1m30s`, `500ms`). argparse knows
neither, so every process of ours declares such flags through these two helpers.
"""

from __future__ import annotations

import argparse
import re

# Go's strconv.ParseBool accepts exactly these spellings.
_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
_FALSE = frozenset({"0", "f", "F", "false", "FALSE", "False"})
_DURATION = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_bool(text: str) -> bool:
    """A boolean as Go's flag package parses it; anything else is an error."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r} (use true or false)")


def parse_duration(text: str) -> float:
    """Seconds in a Go duration ("90s", "1m30s", "1.5h", "500ms", "0"); garbage is an error."""
    body = text.strip()
    if body == "0":
        return 0.0
    if not body or _DURATION.sub("", body) != "":
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r} (write it as Go does, e.g. 90s, 1m30s, 500ms)"
        )
    total = 0.0
    for part in _DURATION.findall(body):
        unit = part.lstrip("0123456789.")
        total += float(part[: len(part) - len(unit)]) * _UNIT_S[unit]
    return total


def add_bool(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    name: str,
    *,
    default: bool,
    help: str,
) -> None:
    """`--name`, `--name=true|false` (any Go spelling), and `--no-name` for the shell-minded."""
    dest = name.lstrip("-").replace("-", "_")
    parser.add_argument(
        name,
        dest=dest,
        nargs="?",
        const=True,
        default=default,
        type=parse_bool,
        metavar="true|false",
        help=f"{help} (default {str(default).lower()})",
    )
    parser.add_argument(
        "--no-" + name.lstrip("-"), dest=dest, action="store_false", help=argparse.SUPPRESS
    )


def add_duration(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    name: str,
    *,
    default: str,
    help: str = "",
) -> None:
    """A duration flag in Go syntax; the parsed value is seconds (float)."""
    parser.add_argument(
        name,
        type=parse_duration,
        default=parse_duration(default),
        metavar="DURATION",
        help=f"{help} (default {default})".strip(),
    )
