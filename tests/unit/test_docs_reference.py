"""The reference docs keep up with the code: every flag of `slurm-operator` and `slurm-bridge`
and every key of the bridge's config file is documented, and the README stays a front page."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slinky.bridge import config
from slinky.bridge import main as bridge_main
from slinky.operator import main as operator_main
from slinky_testbed import ldap, nodes, paths
from slinky_testbed.bed import Testbed

DOCS = Path(__file__).resolve().parents[2] / "docs"
README = DOCS.parent / "README.md"
MAKEFILE = DOCS.parent / "Makefile"


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


def test_the_testbed_page_gives_the_makefiles_pytest_workers() -> None:
    workers = re.search(r"^PYTEST_XDIST \?= (-n (\d+) --dist \w+)", MAKEFILE.read_text(), re.M)
    assert workers is not None, "Makefile: no PYTEST_XDIST"
    text = (DOCS / "testbed.md").read_text()
    assert f"`{workers.group(1)}`" in text, f"docs/testbed.md does not give `{workers.group(1)}`"


def fenced_after(text: str, marker: str) -> str:
    """The first fenced block after `marker`."""
    match = re.search(r"```\w*\n(.*?)```", text[text.index(marker) :], re.S)
    assert match is not None, f"no code block after {marker!r}"
    return match.group(1)


def test_the_testbed_ldap_commands_make_the_directory_and_its_sssd_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/testbed.md's Python (piped to kubectl apply) makes slapd's objects, and the
    `sssd` values shown are the ones `ldap.sssd_values` gives."""
    text = (DOCS / "testbed.md").read_text()
    block = fenced_after(text, "<!-- ldap:")
    script = re.search(r"<<'EOF' \| kubectl apply -f -\n(.*?)\nEOF\n", block, re.S)
    assert script is not None, "the LDAP block has no `python - <<'EOF' | kubectl apply` script"
    monkeypatch.setattr(nodes, "image_ref", lambda name: f"localhost/slinky/{name}:test")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(script.group(1), {})  # the documented script
    objects = {(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(out.getvalue())}
    assert {("Deployment", "ldap"), ("Service", "ldap"), ("Secret", "ldap")} <= objects
    values = yaml.safe_load(fenced_after(text, "<!-- ldap values:"))
    assert values == {"sssd": ldap.sssd_values("slurm")}


def test_the_login_page_says_how_to_reach_the_login_service_on_the_test_bed(
    tmp_path: Path,
) -> None:
    block = fenced_after((DOCS / "login.md").read_text(), "<!-- login on the test bed:")
    netns = re.search(r"NETNS=\$\((.*?)\)\n", block, re.S)
    assert netns is not None and 'ip netns exec "$NETNS" ssh' in block, block
    command = netns.group(1).replace("~/.cache/slinky/testbeds/dev", str(tmp_path))
    done = subprocess.run(
        ["bash", "-c", command.replace(".venv/bin/python", sys.executable)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == Testbed(tmp_path).names().netns, done.stderr


HELM = paths.bin_dir() / "helm"


@pytest.mark.skipif(not HELM.exists(), reason=f"{HELM} not built")
@pytest.mark.parametrize("service", ["ClusterIP", "NodePort", "LoadBalancer"])
def test_the_slurm_charts_notes_name_the_login_service(service: str, tmp_path: Path) -> None:
    """NOTES.txt as `helm install` prints it (rendered here through a ConfigMap: `helm
    template` leaves NOTES.txt out), with login pods on."""
    chart = tmp_path / "slurm"
    shutil.copytree(DOCS.parent / "helm" / "slurm", chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "notes.yaml").write_text(
        '{{- define "test.notes" }}' + notes + "{{- end }}\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ include "test.notes" . | quote }}}\n'
    )
    done = subprocess.run(
        [str(HELM), "template", "slurm", str(chart), "-n", "slurm", "--set", "login.enabled=true",
         "--set", f"login.service.type={service}", "--show-only", "templates/notes.yaml"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = yaml.safe_load(done.stdout)["data"]["notes"]
    assert "kubectl -n slurm get svc slurm-login" in text, text
    assert "ssh -p" in text and "docs/login.md" in text, text


def test_the_quickstart_gives_the_test_bed_a_pv_its_install_names() -> None:
    """slurmctld's claim stays Pending on a cluster without a provisioner (the test bed):
    the quickstart's PV is of the StorageClass its `helm install slurm` is told to use."""
    text = (DOCS / "quickstart.md").read_text()
    found = re.search(
        r"kubectl apply -f - <<'EOF'\n(apiVersion: v1\nkind: PersistentVolume\n.*?)\nEOF",
        text,
        re.S,
    )
    assert found is not None, "docs/quickstart.md: no PersistentVolume example"
    pv = yaml.safe_load(found.group(1))
    cls = pv["spec"]["storageClassName"]
    assert f"--set controller.persistence.storageClassName={cls}" in text
    assert "testbeds/quickstart up" in text


def test_the_quickstart_reads_the_cleanup_hooks_log_while_it_runs() -> None:
    """The hooks' Jobs are deleted once they succeeded, and their logs with them."""
    text = (DOCS / "quickstart.md").read_text()
    policies = [
        f.read_text()
        for f in (DOCS.parent / "helm").glob("*/templates/cleanup.yaml")
        if "hook-succeeded" in f.read_text()
    ]
    if policies:
        assert "logs -f job/slurm-cleanup" in text and "hook-succeeded" in text
