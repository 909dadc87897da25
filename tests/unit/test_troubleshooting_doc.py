"""docs/troubleshooting.md lists every condition reason the code can write (read from the
code's own call sites), so a new reason cannot ship unexplained."""

from __future__ import annotations

import collections
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Where the code writes a condition reason (Cluster, NodeSet, pod PodScheduled).
PATTERNS = [
    r'_not_ready\(\s*key,\s*obj,\s*"(\w+)"',
    r'Outcome\(\s*(?:True|False),\s*"(\w+)"',
    r'set_unschedulable\(\s*[\w.]+,\s*\w+,\s*"(\w+)"',
    r'(?:PlaceholderProblem|GroupProblem|NoControllerAddress|ConfigProblem)\(\s*"(\w+)"',
    r'\(\s*[A-Z_.]+,\s*(?:True|False),\s*"(\w+)"',
    r'\breason = "(\w+)"',
    r'\(\s*(?:True|False),\s*"(\w+)"',
    r'return \(\s*"(\w+)",',
    r'reason="(\w+)"',
    r'"(\w+)" if view.active else "(\w+)"',
    r'_write_status\(\s*obj,\s*\w+,\s*(?:True|False),\s*"(\w+)"',
    r'creatable = view.conf_problem or \(\s*"(\w+)"',
]


def reasons_in_code() -> dict[str, set[str]]:
    found: dict[str, set[str]] = collections.defaultdict(set)
    for path in (REPO / "src/slinky").rglob("*.py"):
        text = path.read_text()
        for pattern in PATTERNS:
            for m in re.finditer(pattern, text):
                for reason in m.groups():
                    found[reason].add(str(path.relative_to(REPO)))
    return found


def test_every_condition_reason_is_explained() -> None:
    doc = (REPO / "docs/troubleshooting.md").read_text()
    found = reasons_in_code()
    assert len(found) > 40, sorted(found)  # the patterns still find the call sites
    missing = {r: sorted(f) for r, f in found.items() if f"`{r}`" not in doc}
    assert not missing, f"reasons not in docs/troubleshooting.md: {missing}"
