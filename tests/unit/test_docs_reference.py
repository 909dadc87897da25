"""The reference docs keep up with the code: every flag of `slurm-operator` and `slurm-bridge`
and every key of the bridge's config file is documented, and the README stays a front page."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from slinky.bridge import config
from slinky.bridge import main as bridge_main
from slinky.operator import main as operator_main

DOCS = Path(__file__).resolve().parents[2] / "docs"
README = DOCS.parent / "README.md"


def flags(parser: argparse.ArgumentParser) -> list[str]:
    """The long options a user can pass (not --help, --version or hidden spellings)."""
    out = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(
            action, (argparse._HelpAction, argparse._VersionAction)
        ):
            continue
        out += [o for o in action.option_strings if o.startswith("--")]
    return out


def in_backticks(text: str, word: str) -> bool:
    """`word` appears inside a `code span`, alone or as part of a dotted or flag-like name."""
    pattern = rf"`[^`\n]*(?<![\w-]){re.escape(word)}(?![\w-])[^`\n]*`"
    return re.search(pattern, text) is not None


@pytest.mark.parametrize(
    ("page", "parser"),
    [("operator.md", operator_main.build_parser()), ("bridge.md", bridge_main.build_parser())],
    ids=["slurm-operator", "slurm-bridge"],
)
def test_every_flag_is_documented(page: str, parser: argparse.ArgumentParser) -> None:
    text = (DOCS / page).read_text()
    missing = [f for f in flags(parser) if not in_backticks(text, f)]
    assert flags(parser), "no flags found: the parser changed shape"
    assert not missing, f"docs/{page} does not document {', '.join(missing)}"


def test_every_bridge_config_key_is_documented() -> None:
    text = (DOCS / "bridge.md").read_text()
    missing = [k for k in config.all_keys() if not in_backticks(text, k.rsplit(".", 1)[-1])]
    assert not missing, f"docs/bridge.md does not document config keys {', '.join(missing)}"


def test_the_readme_is_a_front_page_whose_links_resolve() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (README.parent / target).is_file(), f"README links to missing {target}"


def test_links_between_docs_resolve() -> None:
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+\.md)", page.read_text()):
            resolved = (page.parent / target).resolve()
            assert resolved.is_file(), f"docs/{page.name} links to missing {target}"
