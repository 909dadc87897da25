"""Plain tables, coloured only on a terminal (as kubectl's own output: no colour when piped,
none with NO_COLOR set or --no-color)."""

from __future__ import annotations

import datetime as dt
import os
import re
import sys
from collections.abc import Sequence

COLOURS = {"red": "31", "green": "32", "yellow": "33", "bold": "1", "dim": "2"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Style:
    def __init__(self, colour: bool) -> None:
        self.colour = colour

    @classmethod
    def detect(cls, *, no_color: bool = False) -> Style:
        return cls(not no_color and "NO_COLOR" not in os.environ and sys.stdout.isatty())

    def __call__(self, text: str, colour: str) -> str:
        if not self.colour or not text:
            return text
        return f"\x1b[{COLOURS[colour]}m{text}\x1b[0m"


PLAIN = Style(False)


def visible_len(text: str) -> int:
    return len(_ANSI.sub("", text))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    """Columns padded to their widest cell, as `kubectl get` prints them."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], visible_len(cell))

    def line(cells: Sequence[str]) -> str:
        padded = [c + " " * (widths[i] - visible_len(c)) for i, c in enumerate(cells)]
        return (indent + "   ".join(padded)).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def duration(seconds: float) -> str:
    """12s, 5m, 1h30m, 2d4h: kubectl's AGE style."""
    s = int(max(0, seconds))
    if s < 120:
        return f"{s}s"
    if s < 3600 * 3:
        return f"{s // 60}m" if s < 3600 else f"{s // 3600}h{(s % 3600) // 60}m"
    if s < 86400 * 2:
        return f"{s // 3600}h"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def clock(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def state_colour(state: str) -> str | None:
    """The colour of a Slurm node state or a pod phase."""
    up = state.upper()
    if any(w in up for w in ("DOWN", "NOT_RESPONDING", "FAIL", "ERROR", "UNKNOWN")):
        return "red"
    if any(w in up for w in ("DRAIN", "COMPLETING", "PENDING", "TERMINATING", "FUTURE")):
        return "yellow"
    if any(w in up for w in ("IDLE", "ALLOCATED", "MIXED", "RUNNING", "SUCCEEDED", "READY")):
        return "green"
    return None


def coloured_state(style: Style, state: str) -> str:
    colour = state_colour(state)
    return style(state, colour) if colour else state
