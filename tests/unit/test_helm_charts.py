"""The Helm charts in helm/, rendered with the cached helm binary (`make test` builds it): lint,
values schema, the branches worth checking (hybrid mode, cert-manager, autoscaling, one NodeSet
per entry) and drift against what the code and config/ say (CRDs, RBAC, flags, webhooks)."""

from __future__ import annotations

import base64
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from slinky.bridge import main as bridge_main
from slinky.bridge.admission import manifests
from slinky.bridge.config import parse_config
from slinky.operator import keys as keys_command
from slinky.operator import main as operator_main
from slinky.operator.autoscale.metrics import NODESET_METRICS, PARTITION_METRICS
from slinky.operator.nodeset import partition
from slinky_testbed import paths
from slinky_testbed.prometheus import SLURMCTLD_METRICS_PATHS

JSON = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
CHARTS = REPO / "helm"
HELM = paths.bin_dir() / "helm"
CHART_NAMES = ["slurm-operator-crds", "slurm-operator", "slurm", "slurm-bridge"]

pytestmark = pytest.mark.skipif(
    not HELM.exists(), reason=f"{HELM} not built (`make testbed-build` builds it)"
)


class StrictLoader(yaml.SafeLoader):
    """Refuses a mapping with a key twice, which PyYAML would silently collapse and the
    apiserver's decoder rejects (`mapping key ... already defined`)."""


def _no_duplicates(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise AssertionError(f"key {key!r} twice at {key_node.start_mark}")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def load_all(text: str) -> list[JSON]:
    return [d for d in yaml.load_all(text, Loader=StrictLoader) if d]


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, timeout=60, check=False
    )
    if check and out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{out.stderr}")
    return out


def render(chart: str, *sets: str, namespace: str = "slurm", release: str = "slurm") -> list[JSON]:
    """The chart's objects for these `--set` values (release `slurm` unless given)."""
    args = ["template", release, str(CHARTS / chart), "--namespace", namespace]
    for s in sets:
        args += ["--set", s]
    return load_all(helm(*args).stdout)


def render_values(chart: str, values: JSON, tmp_path: Path, release: str = "slurm") -> list[JSON]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    out = helm("template", release, str(CHARTS / chart), "-n", "slurm", "-f", str(path))
    return load_all(out.stdout)


def kinds(objs: list[JSON], kind: str) -> list[JSON]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[JSON], kind: str, name: str | None = None) -> JSON:
    found = [o for o in kinds(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in {[o['kind'] for o in objs]}"
    return found[0]


def args_of(deployment: JSON) -> list[str]:
    return [str(a) for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]]


# ---------------------------------------------------------------- chart quality


@pytest.mark.parametrize("chart", CHART_NAMES)
def test_chart_lints_clean_in_strict_mode(chart: str) -> None:
    out = helm("lint", "--strict", str(CHARTS / chart), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout, out.stdout


@pytest.mark.parametrize(
    ("chart", "typo", "where"),
    [
        ("slurm-operator", "operator.replicaz=2", "'/operator': additional properties 'replicaz'"),
        ("slurm-operator-crds", "kepp=false", "'': additional properties 'kepp'"),
        (
            "slurm",
            "controller.persistance.enabled=false",
            "'/controller': additional properties 'persistance'",
        ),
        (
            "slurm-bridge",
            "sharedConfig.managedNamespace={a}",
            "'/sharedConfig': additional properties 'managedNamespace'",
        ),
    ],
)
def test_a_typo_in_values_is_rejected_naming_the_key(chart: str, typo: str, where: str) -> None:
    out = helm("template", "x", str(CHARTS / chart), "--set", typo, check=False)
    assert out.returncode != 0
    assert where in out.stderr, out.stderr


def test_a_typo_inside_a_nodeset_entry_is_rejected_naming_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text("compute:\n  nodesets:\n    - name: a\n      replicaz: 2\n")
    out = helm("template", "x", str(CHARTS / "slurm"), "-f", str(path), check=False)
    assert out.returncode != 0
    assert "'/compute/nodesets/0': additional properties 'replicaz' not allowed" in out.stderr


def _key_lines(text: str) -> list[tuple[int, int, str, str]]:
    """(line number, indent, key, previous line) of every mapping key in a values file."""
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)(?:- )?([A-Za-z][\w.-]*):(\s|$)", line)
        if m and not line.lstrip().startswith("#"):
            out.append((i, len(m.group(1)), m.group(2), lines[i - 1] if i else ""))
    return out


# Maps whose content is Kubernetes' or Slurm's own vocabulary, explained by the parent's comment.
FREE_FORM = {
    "resources", "requests", "limits", "podSecurityContext", "securityContext", "capabilities",
    "seccompProfile", "config", "behavior", "scaleDown", "scaleUp",
}  # fmt: skip


@pytest.mark.parametrize("chart", CHART_NAMES)
def test_every_values_key_is_documented_by_a_comment(chart: str) -> None:
    """Each key has a comment above it, or directly follows a documented sibling (one comment
    for a group such as nodeSelector/tolerations/affinity), or lives inside a free-form map
    (resources, security contexts, Slurm options) that its parent's comment explains."""
    text = (CHARTS / chart / "values.yaml").read_text()
    documented: dict[int, bool] = {}
    undocumented = []
    parents: list[tuple[int, str]] = []
    for _, indent, key, prev in _key_lines(text):
        while parents and parents[-1][0] >= indent:
            parents.pop()
        prev_s = prev.strip()
        ok = (
            prev_s.startswith(("#", "- #"))
            or (documented.get(indent, False) and bool(prev_s) and not prev_s.startswith("-"))
            or any(p in FREE_FORM for _, p in parents)
        )
        if not ok:
            undocumented.append(".".join([*(p for _, p in parents), key]))
        documented = {d: v for d, v in documented.items() if d < indent}
        documented[indent] = ok
        parents.append((indent, key))
    assert not undocumented, f"undocumented keys in {chart}/values.yaml: {undocumented}"


def test_no_chart_uses_the_crds_folder() -> None:
    """Helm installs crds/ once and never upgrades it (upstream's broken installs)."""
    assert not list(CHARTS.glob("*/crds"))


# ---------------------------------------------------------------- drift against the code


def test_crd_chart_holds_config_crd_byte_for_byte() -> None:
    ours = {p.name: p.read_bytes() for p in (CHARTS / "slurm-operator-crds/files").glob("*")}
    generated = {p.name: p.read_bytes() for p in (REPO / "config/crd").glob("*.yaml")}
    assert ours.keys() == generated.keys()
    stale = [name for name in ours if ours[name] != generated[name]]
    assert not stale, f"copy config/crd/{stale[0]} to helm/slurm-operator-crds/files/"


def test_crd_chart_renders_every_crd_unchanged_and_kept_on_uninstall() -> None:
    objs = render("slurm-operator-crds")
    by_name = {o["metadata"]["name"]: o for o in objs}
    for path in (REPO / "config/crd").glob("*.yaml"):
        want = yaml.safe_load(path.read_text())
        got = by_name[want["metadata"]["name"]]
        assert got["spec"] == want["spec"]
        assert got["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(objs) == 2
    dropped = render("slurm-operator-crds", "keep=false")
    assert all("annotations" not in o["metadata"] for o in dropped)


def _rules(path: Path, kind: str) -> list[JSON]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == kind]
    return [rule for d in docs for rule in d["rules"]]


def test_operator_chart_grants_exactly_config_rbac() -> None:
    objs = render("slurm-operator", namespace="slinky-system", release="slurm-operator")
    role = one(objs, "ClusterRole", "slurm-operator")
    assert role["rules"] == _rules(REPO / "config/rbac/role.yaml", "ClusterRole")
    secrets = one(objs, "ClusterRole", "slurm-operator-secrets")
    assert secrets["rules"] == _rules(REPO / "config/rbac/secrets_role.yaml", "ClusterRole")
    lease = one(objs, "Role", "slurm-operator-leader-election")
    assert lease["rules"] == _rules(REPO / "config/rbac/leader_election_role.yaml", "Role")


def test_bridge_chart_grants_exactly_config_rbac() -> None:
    objs = render("slurm-bridge", namespace="slinky-system", release="slurm-bridge")
    role = one(objs, "ClusterRole", "slurm-bridge")
    assert role["rules"] == _rules(REPO / "config/rbac/bridge_role.yaml", "ClusterRole")
    lease = one(objs, "Role", "slurm-bridge-leader-election")
    assert lease["rules"] == _rules(REPO / "config/rbac/bridge_leader_election_role.yaml", "Role")


def test_operator_deployment_passes_only_flags_the_operator_knows() -> None:
    objs = render(
        "slurm-operator",
        "operator.watchNamespaces={a,b}",
        "operator.slurmWatchJobs=true",
        "operator.drainNotReadyNodes=false",
        "operator.drainNodeConditions={KernelDeadlock,ReadonlyFilesystem}",
        "operator.nodeFeatureLabels={feature.node.kubernetes.io/,topology.kubernetes.io/zone}",
        "operator.topologyLabels={topology.kubernetes.io/zone,example.com/rack}",
        "operator.topologyRoot=racks:top",
        namespace="slinky-system",
    )
    deployment = one(objs, "Deployment")
    argv = args_of(deployment)
    assert argv[0] == "slurm-operator"
    parsed = operator_main.parse_args(argv[1:])
    assert parsed.leader_elect is True
    assert parsed.namespace == ["a", "b"]
    assert parsed.slurm_watch_jobs is True
    assert parsed.drain_not_ready_nodes is False
    assert parsed.drain_node_conditions == {"KernelDeadlock", "ReadonlyFilesystem"}
    assert parsed.placement.feature_labels == (
        "feature.node.kubernetes.io/",
        "topology.kubernetes.io/zone",
    )
    assert parsed.placement.topology_labels == ("topology.kubernetes.io/zone", "example.com/rack")
    assert parsed.placement.topology_root == "racks:top"
    assert parsed.metrics_api_bind_address == ":8443"
    # Graceful shutdown fits in the pod's grace period (the Lease is released in time).
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert float(parsed.graceful_shutdown_timeout) < grace


def test_bridge_deployments_pass_only_flags_and_config_keys_the_bridge_knows() -> None:
    objs = render(
        "slurm-bridge",
        "sharedConfig.managedNamespaces={jobs}",
        "sharedConfig.managedNodeTaint.effect=NoSchedule",
        namespace="slinky-system",
        release="slurm-bridge",
    )
    components = {}
    for deployment in kinds(objs, "Deployment"):
        argv = args_of(deployment)
        assert argv[0] == "slurm-bridge"
        components[deployment["metadata"]["name"]] = bridge_main.parse_args(argv[1:]).components
    assert components == {
        "slurm-bridge-scheduler": ["scheduler"],
        "slurm-bridge-controllers": ["nodes", "workload"],
        "slurm-bridge-admission": ["admission"],
    }
    config = yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"])
    auth = config.pop("slurmAuth")
    assert auth["jwtKeyFile"] == "/var/run/secrets/slurm/jwt_hs256.key"
    parsed = parse_config(config)  # every key known, every value valid
    assert parsed.managed_namespaces == ("jobs",)
    assert parsed.managed_node_taint.effect == "NoSchedule"


def test_the_webhook_runs_two_replicas_under_a_pdb_and_holds_no_slurm_credentials() -> None:
    objs = render("slurm-bridge", namespace="slinky-system", release="slurm-bridge")
    webhook = one(objs, "Deployment", "slurm-bridge-admission")
    assert webhook["spec"]["replicas"] == 2
    pdb = one(objs, "PodDisruptionBudget", "slurm-bridge-admission")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == webhook["spec"]["selector"]["matchLabels"]
    pod = webhook["spec"]["template"]["spec"]
    assert "--config=/etc/slurm-bridge/admission.yaml" in args_of(webhook)
    assert [v["name"] for v in pod["volumes"]] == ["config", "tmp", "webhook-certs"]
    assert "podAntiAffinity" in pod["affinity"]
    config = yaml.safe_load(one(objs, "ConfigMap")["data"]["admission.yaml"])
    assert "slurmAuth" not in config
    parse_config(config)
    for name in ("slurm-bridge-scheduler", "slurm-bridge-controllers"):
        volumes = one(objs, "Deployment", name)["spec"]["template"]["spec"]["volumes"]
        assert "slurm-auth" in [v["name"] for v in volumes]
    one_replica = render("slurm-bridge", "admission.replicas=1", namespace="slinky-system")
    assert kinds(one_replica, "PodDisruptionBudget") == []  # a PDB would block every drain


def test_the_tenancy_policy_value_reaches_the_bridge_and_the_webhook(tmp_path: Path) -> None:
    policy = {"namespaces": {"team-a": {"users": ["alice"], "groups": ["alice"]}}}
    objs = render_values("slurm-bridge", {"sharedConfig": {"policy": policy}}, tmp_path)
    data = one(objs, "ConfigMap")["data"]
    for key in ("config.yaml", "admission.yaml"):
        config = yaml.safe_load(data[key])
        config.pop("slurmAuth", None)
        assert parse_config(config).policy.rule_for("team-a").users == ("alice",)


@pytest.mark.parametrize(
    "sets",
    [
        ["sharedConfig.managedNamespaces={jobs,more-jobs}"],
        [
            "sharedConfig.managedNamespaceSelector.matchLabels.slurm=yes",
            "sharedConfig.schedulerName=other-scheduler",
        ],
    ],
)
def test_bridge_webhook_registrations_are_what_the_bridge_code_renders(sets: list[str]) -> None:
    objs = render("slurm-bridge", *sets, namespace="slinky-system")
    config = parse_config(
        {
            k: v
            for k, v in yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"]).items()
            if k != "slurmAuth"
        }
    )
    ca = base64.b64decode(one(objs, "Secret")["data"]["ca.crt"])
    want = manifests.webhook_configurations(
        config,
        own_namespace="slinky-system",
        name="slurm-slurm-bridge",
        service=("slurm-slurm-bridge-webhook", "slinky-system", 443),
        ca_bundle=ca,
    )
    for expected in want:
        got = one(objs, expected["kind"])
        assert got["webhooks"] == expected["webhooks"]


# ---------------------------------------------------------------- certificates


def _openssl(*args: str, stdin: bytes | None = None) -> str:
    out = subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=True)
    return out.stdout.decode()


@pytest.mark.parametrize(
    ("chart", "secret", "service"),
    [
        ("slurm-operator", "so-slurm-operator-metrics-api-tls", "so-slurm-operator-metrics-api"),
        ("slurm-bridge", "so-slurm-bridge-webhook-tls", "so-slurm-bridge-webhook"),
    ],
)
def test_without_cert_manager_the_chart_makes_a_serving_certificate_its_ca_bundle_trusts(
    chart: str, secret: str, service: str, tmp_path: Path
) -> None:
    objs = render(chart, namespace="ops", release="so")
    data = one(objs, "Secret", secret)["data"]
    for name in ("ca.crt", "tls.crt", "tls.key"):
        (tmp_path / name).write_bytes(base64.b64decode(data[name]))
    _openssl("verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt"))
    sans = _openssl("x509", "-noout", "-ext", "subjectAltName", "-in", str(tmp_path / "tls.crt"))
    assert f"DNS:{service}.ops.svc" in sans
    bundles = [o.get("spec", {}).get("caBundle") for o in kinds(objs, "APIService")] + [
        w["clientConfig"]["caBundle"]
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for o in kinds(objs, kind)
        for w in o["webhooks"]
    ]
    assert bundles and set(bundles) == {data["ca.crt"]}
    assert not kinds(objs, "Certificate")


@pytest.mark.parametrize(
    ("chart", "key", "name"),
    [
        ("slurm-operator", "metricsApi", "so-slurm-operator-metrics-api"),
        ("slurm-bridge", "admission", "so-slurm-bridge-webhook"),
    ],
)
def test_with_cert_manager_a_certificate_is_requested_and_the_ca_injected(
    chart: str, key: str, name: str
) -> None:
    objs = render(chart, f"{key}.certManager.enabled=true", namespace="ops", release="so")
    cert = one(objs, "Certificate", name)
    assert cert["spec"]["secretName"] == f"{name}-tls"
    assert f"{name}.ops.svc" in cert["spec"]["dnsNames"]
    assert not [o for o in kinds(objs, "Secret") if o["metadata"]["name"] == f"{name}-tls"]
    registrations = [
        o
        for o in objs
        if o["kind"]
        in ("APIService", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    ]
    assert registrations
    for o in registrations:
        assert o["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"ops/{name}"
        assert "caBundle" not in str(o)
    # A self-signed CA of its own unless an issuer is named.
    assert len(kinds(objs, "Issuer")) == 2
    named = render(
        chart,
        f"{key}.certManager.enabled=true",
        f"{key}.certManager.issuerRef.name=corp-ca",
        f"{key}.certManager.issuerRef.kind=ClusterIssuer",
        namespace="ops",
        release="so",
    )
    assert not kinds(named, "Issuer")
    assert one(named, "Certificate")["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
    }


def test_operator_without_metrics_api_serves_none() -> None:
    objs = render("slurm-operator", "metricsApi.enabled=false", namespace="ops")
    assert not kinds(objs, "APIService")
    assert "--metrics-api-bind-address" not in " ".join(args_of(one(objs, "Deployment")))


# ---------------------------------------------------------------- the slurm chart


def slurm_conf(objs: list[JSON]) -> list[str]:
    return str(one(objs, "ConfigMap", "slurm-config")["data"]["slurm.conf"]).splitlines()


def test_slurm_chart_deploys_slurmctld_slurmrestd_and_a_cluster_pointing_at_them() -> None:
    objs = render("slurm")
    ctld = one(objs, "StatefulSet", "slurm-controller")
    assert ctld["spec"]["template"]["spec"]["containers"][0]["args"][0] == "slurmctld"
    assert ctld["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"] == {
        "storage": "4Gi"
    }
    restd = one(objs, "Deployment", "slurm-restapi")
    env = restd["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "SLURM_JWT", "value": "daemon"} in env
    cluster = one(objs, "Cluster", "slurm")["spec"]
    assert cluster["server"] == "http://slurm-restapi.slurm.svc.cluster.local:6820"
    assert cluster["jwtKeyRef"] == {"name": "slurm-jwt-key", "key": "jwt_hs256.key"}
    assert cluster["controller"] == {
        "host": "slurm-controller.slurm.svc.cluster.local",
        "port": 6817,
    }
    conf = slurm_conf(objs)
    for line in (
        "SlurmctldHost=slurm-controller-0(slurm-controller.slurm.svc.cluster.local)",
        "SlurmctldParameters=enable_configless,reconfig_on_restart",
        "AuthAltTypes=auth/jwt",
        "AuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key",
    ):
        assert line in conf
    # The operator may read exactly the JWT key Secret, nothing else.
    role = one(objs, "Role", "slurm-operator-secrets")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["slurm-jwt-key"],
            "verbs": ["list", "watch"],
        }
    ]
    binding = one(objs, "RoleBinding", "slurm-operator-secrets")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "slurm-operator", "namespace": "slinky-system"}
    ]


def keys_hook(objs: list[JSON]) -> tuple[JSON, dict[str, keys_command.Key], JSON]:
    """The keys hook Job, what it makes ("secret/key": Key, parsed by the command's own
    parser: the chart passes only flags it knows) and the command's other options."""
    job = one(objs, "Job", "slurm-keys")
    argv = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert argv[:3] == ["python3", "-m", "slinky.operator.keys"], argv
    opts = vars(keys_command.parser().parse_args(argv[3:]))
    made = {f"{k.secret}/{k.key}": k for k in opts.pop("keys")}
    return job, made, opts


def test_no_key_is_rendered_and_the_hook_makes_them_with_the_sizes_slurm_expects() -> None:
    objs = render("slurm")
    for secret in kinds(objs, "Secret"):
        assert not {"slurm.key", "jwt_hs256.key"} & set(secret.get("data") or {}), secret
    job, made, opts = keys_hook(objs)
    assert job["metadata"]["annotations"] == {
        "helm.sh/hook": "pre-install,pre-upgrade",
        "helm.sh/hook-weight": "-5",
        "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
    }
    assert made == {
        "slurm-slurm-key/slurm.key": keys_command.Key(
            "slurm-slurm-key", "slurm.key", "bytes", "1024"
        ),
        "slurm-jwt-key/jwt_hs256.key": keys_command.Key(
            "slurm-jwt-key", "jwt_hs256.key", "bytes", "32"
        ),
    }
    # A missing slurm.key is not made anew under a running slurmctld (unless asked).
    assert opts["guard"] == ["slurm-slurm-key"] and opts["controller"] == "slurm-controller"
    assert opts["namespace"] == "slurm" and not opts["regenerate"]
    # Not Argo CD's tracking label: the Secrets are not the Application's to prune.
    assert dict(opts["label"]) == {
        "app.kubernetes.io/part-of": "slinky",
        "slinky.slurm.net/keys-of": "slurm",
    }
    # Its ServiceAccount, Role and RoleBinding come first; the Role reads only those Secrets
    # and slurmctld's StatefulSet.
    role = one(objs, "Role", "slurm-keys")
    assert role["metadata"]["annotations"]["helm.sh/hook-weight"] == "-10"
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["slurm-slurm-key", "slurm-jwt-key"],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {
            "apiGroups": ["apps"],
            "resources": ["statefulsets"],
            "resourceNames": ["slurm-controller"],
            "verbs": ["get"],
        },
    ]
    for kind in ("ServiceAccount", "RoleBinding"):
        assert (
            one(objs, kind, "slurm-keys")["metadata"]["annotations"]["helm.sh/hook-weight"] == "-10"
        )
    image = job["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "localhost/slinky/slinky:0.1.0"
    assert "initContainers" not in job["spec"]["template"]["spec"]  # no sshd, no ssh-keygen
    # The site's own Secrets: nothing to make, no hook.
    site = render("slurm", "slurmKey.existingSecret=k", "jwtKey.existingSecret=j")
    assert not [o for o in site if o["metadata"]["name"] == "slurm-keys"]
    # slurmKey.regenerate passes --regenerate; keys.image wins over cleanup.image.
    job, _, opts = keys_hook(
        render("slurm", "slurmKey.regenerate=true", "keys.image.repository=site/slinky")
    )
    assert opts["regenerate"]
    image = job["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "site/slinky:0.1.0"


@pytest.mark.parametrize(
    "sets",
    [
        [],
        [
            "login.enabled=true",
            "compute.ssh.enabled=true",
            "accounting.enabled=true",
            "accounting.mariadb.enabled=true",
        ],
    ],
)
def test_two_renders_are_the_same_bytes(sets: list[str]) -> None:
    """Argo CD renders with `helm template` at every sync (no cluster access, no lookup): a
    key or a checksum made at render time would re-key the cluster and restart the daemons
    each time. Two renders (as an install, as an upgrade) are byte-identical."""
    args = ["template", "slurm", str(CHARTS / "slurm"), "-n", "slurm"]
    for s in sets:
        args += ["--set", s]
    assert helm(*args).stdout == helm(*args).stdout
    assert helm(*args, "--is-upgrade").stdout == helm(*args, "--is-upgrade").stdout


def test_no_template_makes_random_bytes() -> None:
    """What made every render differ is gone for good."""
    for path in sorted((CHARTS / "slurm/templates").iterdir()):
        text = path.read_text()
        for word in ("randBytes", "randAlphaNum", "randAscii", "genPrivateKey", "uuidv4"):
            assert not re.search(rf"\b{word}\b", text), f"{path.name} uses {word}"


def test_slurmctld_state_is_an_empty_dir_without_persistence() -> None:
    objs = render("slurm", "controller.persistence.enabled=false")
    ctld = one(objs, "StatefulSet", "slurm-controller")
    assert "volumeClaimTemplates" not in ctld["spec"]
    volumes = {v["name"]: v for v in ctld["spec"]["template"]["spec"]["volumes"]}
    assert volumes["statesave"] == {"name": "statesave", "emptyDir": {}}


def test_one_nodeset_and_partition_per_compute_entry(tmp_path: Path) -> None:
    values = {
        "compute": {
            "nodesets": [
                {"name": "cpu", "replicas": 3, "nodeConfig": "CPUs=4 RealMemory=8000"},
                {"name": "gpu", "replicas": 0, "partition": {"name": "accel"}},
                {"name": "spare", "partition": {"enabled": False}},
            ]
        }
    }
    objs = render_values("slurm", values, tmp_path)
    nodesets = {o["metadata"]["name"]: o["spec"] for o in kinds(objs, "NodeSet")}
    assert list(nodesets) == ["slurm-compute-cpu", "slurm-compute-gpu", "slurm-compute-spare"]
    assert [s["replicas"] for s in nodesets.values()] == [3, 0, 1]
    for name, spec in nodesets.items():
        assert spec["clusterName"] == "slurm"
        assert spec["selector"]["matchLabels"] == {"nodeset.slinky.slurm.net/name": name}
        labels = spec["template"]["metadata"]["labels"]
        assert labels["nodeset.slinky.slurm.net/name"] == name
        slurmd = spec["template"]["spec"]["containers"][0]
        assert slurmd["name"] == "slurmd"
    cpu = nodesets["slurm-compute-cpu"]["template"]["spec"]["containers"][0]
    assert cpu["args"] == ["--conf", "CPUs=4 RealMemory=8000"]
    # The operator makes each partition (kept across slurmctld restarts by KeepPartInfo), so
    # removing an entry changes no slurm.conf line and restarts nothing.
    partitions = {name: spec.get("partition") for name, spec in nodesets.items()}
    assert partitions == {
        "slurm-compute-cpu": {
            "enabled": True,
            "name": "cpu",
            "config": "MaxTime=UNLIMITED State=UP",
        },
        "slurm-compute-gpu": {
            "enabled": True,
            "name": "accel",
            "config": "MaxTime=UNLIMITED State=UP",
        },
        "slurm-compute-spare": None,
    }
    claims = {
        o["metadata"]["name"]: (o["metadata"].get("annotations") or {}).get(
            partition.ANNOTATION_PARTITION
        )
        for o in kinds(objs, "NodeSet")
    }
    assert claims == {
        "slurm-compute-cpu": "cpu",
        "slurm-compute-gpu": "accel",
        "slurm-compute-spare": None,
    }
    conf = slurm_conf(objs)
    assert "ReconfigFlags=KeepPartInfo" in conf
    assert not [line for line in conf if line.startswith("NodeSet=") or "slurm-compute" in line]
    assert "PartitionName=all Nodes=ALL Default=YES MaxTime=UNLIMITED State=UP" in conf
    for spec in nodesets.values():  # every option the chart gives is one the operator takes
        if spec.get("partition"):
            partition.parse_config(spec["partition"]["config"])


def _slurmd(objs: list[JSON]) -> dict[str, JSON]:
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["containers"][0]
        for o in kinds(objs, "NodeSet")
    }


def test_jobs_are_isolated_by_cgroups_by_default_with_sys_ptrace_and_sys_admin_added(
    tmp_path: Path,
) -> None:
    values = {
        "compute": {
            "nodesets": [
                {"name": "plain"},
                {"name": "own", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}},
                {"name": "twice", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
                {"name": "fallback", "securityContext": {"privileged": True}},
            ]
        }
    }
    objs = render_values("slurm", values, tmp_path)
    conf = slurm_conf(objs)
    assert "ProctrackType=proctrack/cgroup" in conf
    assert "TaskPlugin=task/cgroup" in conf
    cgroup_conf = one(objs, "ConfigMap", "slurm-config")["data"]["cgroup.conf"].split()
    for line in ("CgroupPlugin=autodetect", "ConstrainCores=yes", "ConstrainRAMSpace=yes"):
        assert line in cgroup_conf
    assert "ConstrainDevices=yes" in cgroup_conf
    contexts = {name: c.get("securityContext") for name, c in _slurmd(objs).items()}
    assert contexts == {
        "slurm-compute-plain": {"capabilities": {"add": ["SYS_PTRACE", "SYS_ADMIN"]}},
        "slurm-compute-own": {"capabilities": {"add": ["NET_ADMIN", "SYS_PTRACE", "SYS_ADMIN"]}},
        "slurm-compute-twice": {"capabilities": {"add": ["SYS_ADMIN", "SYS_PTRACE"]}},
        "slurm-compute-fallback": {"privileged": True},
    }


def test_a_nodeset_dropping_sys_ptrace_gets_none_added(tmp_path: Path) -> None:
    """A namespace of Pod Security level baseline refuses SYS_PTRACE: an entry dropping it
    keeps it dropped (sacct's MaxRSS then stays empty)."""
    values = {
        "slurmConfig": {"jobIsolation": "none", "cgroupConf": "CgroupPlugin=cgroup/v2\n"},
        "compute": {"nodesets": [
            {"name": "base", "securityContext": {"capabilities": {"drop": ["SYS_PTRACE"]}}},
            {"name": "all", "securityContext": {"capabilities": {"drop": ["CAP_SYS_PTRACE"]}}},
        ]},
    }  # fmt: skip
    contexts = {
        name: c.get("securityContext")
        for name, c in _slurmd(render_values("slurm", values, tmp_path)).items()
    }
    assert contexts == {
        "slurm-compute-base": {"capabilities": {"drop": ["SYS_PTRACE"]}},
        "slurm-compute-all": {"capabilities": {"drop": ["CAP_SYS_PTRACE"]}},
    }


def test_without_job_isolation_there_are_no_cgroups_and_only_sys_ptrace(tmp_path: Path) -> None:
    """SYS_PTRACE stays: slurmstepd samples every job's usage (sacct's MaxRSS) from
    /proc/<pid>/io, which it may read for another user's process only with it."""
    values = {
        "slurmConfig": {"jobIsolation": "none", "cgroupConf": "CgroupPlugin=cgroup/v2\n"},
        "compute": {"nodesets": [{"name": "plain"}, {"name": "own", "securityContext": {
            "runAsUser": 0}}]},
    }  # fmt: skip
    objs = render_values("slurm", values, tmp_path)
    conf = slurm_conf(objs)
    assert "ProctrackType=proctrack/linuxproc" in conf and "TaskPlugin=task/none" in conf
    assert one(objs, "ConfigMap", "slurm-config")["data"]["cgroup.conf"].split() == [
        "CgroupPlugin=disabled"
    ]
    contexts = {name: c.get("securityContext") for name, c in _slurmd(objs).items()}
    ptrace = {"capabilities": {"add": ["SYS_PTRACE"]}}
    assert contexts == {
        "slurm-compute-plain": ptrace,
        "slurm-compute-own": {"runAsUser": 0, **ptrace},
    }


def test_an_unknown_job_isolation_is_refused_naming_the_key() -> None:
    out = helm("template", "slurm", str(CHARTS / "slurm"), "--set",
               "slurmConfig.jobIsolation=strict", check=False)  # fmt: skip
    assert out.returncode != 0
    assert "/slurmConfig/jobIsolation" in out.stderr and "'cgroup', 'none'" in out.stderr


def test_two_nodesets_with_one_name_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text("compute:\n  nodesets:\n    - name: a\n    - name: a\n")
    out = helm("template", "x", str(CHARTS / "slurm"), "-f", str(path), check=False)
    assert out.returncode != 0
    assert 'compute.nodesets[1].name: "a" is used twice' in out.stderr


def test_autoscaling_off_renders_no_hpa_and_keeps_replicas() -> None:
    objs = render("slurm")
    assert not kinds(objs, "HorizontalPodAutoscaler")
    assert one(objs, "NodeSet")["spec"]["replicas"] == 1


def test_autoscaling_on_sizes_the_nodeset_by_a_metric_the_operator_serves(tmp_path: Path) -> None:
    values = {
        "compute": {
            "nodesets": [
                {
                    "name": "cpu",
                    "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 8},
                }
            ]
        }
    }
    objs = render_values("slurm", values, tmp_path)
    nodeset = one(objs, "NodeSet")
    # The HPA owns replicas: an upgrade must not reset what it chose.
    assert "replicas" not in nodeset["spec"]
    hpa = one(objs, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "slinky.slurm.net/v1alpha1",
        "kind": "NodeSet",
        "name": "slurm-compute-cpu",
    }
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (0, 8)
    metric = hpa["metrics"][0]["external"]
    # Upstream's docs once queried a metric name the exporter no longer had.
    assert metric["metric"]["name"] in (*PARTITION_METRICS, *NODESET_METRICS)
    assert metric["metric"]["selector"]["matchLabels"] == {"partition": "cpu", "cluster": "slurm"}
    assert metric["target"] == {"type": "AverageValue", "averageValue": "1"}


def test_slurmctld_serves_its_own_metrics_by_default_and_not_when_switched_off() -> None:
    assert "MetricsType=metrics/openmetrics" in slurm_conf(render("slurm"))
    assert not kinds(render("slurm"), "ServiceMonitor")
    off = render("slurm", "controller.metrics.enabled=false")
    assert not any(line.startswith("Metrics") for line in slurm_conf(off))


def test_a_health_check_script_runs_on_every_slurmd_pod_and_changes_without_a_roll(
    tmp_path: Path,
) -> None:
    assert not any(line.startswith("HealthCheck") for line in slurm_conf(render("slurm")))
    script = '#!/bin/sh\n[ -e /tmp/bad ] && scontrol update nodename="$(hostname)" state=drain\n'
    objs = render_values(
        "slurm",
        {"compute": {"healthCheck": {"script": script, "interval": 30, "nodeState": "IDLE,CYCLE"}}},
        tmp_path,
    )
    conf = slurm_conf(objs)
    assert "HealthCheckProgram=/etc/slurm-health/healthcheck" in conf
    assert "HealthCheckInterval=30" in conf and "HealthCheckNodeState=IDLE,CYCLE" in conf
    config_map = one(objs, "ConfigMap", "slurm-config")
    assert config_map["data"]["healthcheck"] == script
    pod = one(objs, "NodeSet")["spec"]["template"]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "healthcheck"]
    assert volume["configMap"] == {
        "name": "slurm-config",
        "items": [{"key": "healthcheck", "path": "healthcheck", "mode": 0o755}],
    }
    (mount,) = [
        m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "healthcheck"
    ]
    assert mount["mountPath"] == "/etc/slurm-health" and "subPath" not in mount
    with pytest.raises(AssertionError, match="nodeState"):
        render("slurm", "compute.healthCheck.script=x", "compute.healthCheck.nodeState=SOMETIMES")
    # Hybrid mode: slurm.conf is the site's, and the script's ConfigMap is not made.
    with pytest.raises(AssertionError, match=r"compute\.healthCheck\.script: not in hybrid mode"):
        render(
            "slurm",
            "external.enabled=true",
            "slurmKey.existingSecret=k",
            "jwtKey.existingSecret=j",
            "compute.healthCheck.script=x",
        )


def test_gres_types_and_gres_conf_reach_slurmctld_and_the_operator_maps_gpus() -> None:
    assert "GresTypes=gpu" in slurm_conf(render("slurm"))
    objs = render(
        "slurm", "slurmConfig.gresTypes={gpu,widget}", "slurmConfig.gresConf=AutoDetect=nvml"
    )
    assert "GresTypes=gpu,widget" in slurm_conf(objs)
    assert one(objs, "ConfigMap", "slurm-config")["data"]["gres.conf"].strip() == "AutoDetect=nvml"
    init = one(objs, "StatefulSet")["spec"]["template"]["spec"]["initContainers"][0]
    # The init container copies every file of the config volume (the ConfigMap).
    assert (
        "${CONFIG_SRC:-/mnt/config}" in init["command"][-1]
        and "stage /etc/slurm" in init["command"][-1]
    )
    argv = args_of(
        one(
            render(
                "slurm-operator",
                "operator.gresResources.example\\.com/widget=widget",
                namespace="slinky-system",
            ),
            "Deployment",
        )
    )
    parsed = operator_main.parse_args(argv[1:])
    assert parsed.gres_resources == {
        "amd.com/gpu": "gpu",
        "example.com/widget": "widget",
        "nvidia.com/gpu": "gpu",
    }


def test_topology_yaml_reaches_slurmctld_as_yaml() -> None:
    assert "topology.yaml" not in one(render("slurm"), "ConfigMap", "slurm-config")["data"]
    objs = render(
        "slurm",
        "slurmConfig.topology[0].topology=flat",
        "slurmConfig.topology[0].cluster_default=true",
        "slurmConfig.topology[0].flat=true",
        "slurmConfig.topology[1].topology=racks",
        "slurmConfig.topology[1].tree.switches[0].switch=root",
        "slurmConfig.topology[1].tree.switches[0].children=spare",
        "slurmConfig.topology[1].tree.switches[1].switch=spare",
    )
    text = one(objs, "ConfigMap", "slurm-config")["data"]["topology.yaml"]
    assert yaml.safe_load(text) == [
        {"topology": "flat", "cluster_default": True, "flat": True},
        {
            "topology": "racks",
            "tree": {"switches": [{"switch": "root", "children": "spare"}, {"switch": "spare"}]},
        },
    ]
    init = one(objs, "StatefulSet")["spec"]["template"]["spec"]["initContainers"][0]
    # The init container copies every file of the config volume (the ConfigMap).
    assert (
        "${CONFIG_SRC:-/mnt/config}" in init["command"][-1]
        and "stage /etc/slurm" in init["command"][-1]
    )
    with pytest.raises(AssertionError, match="topology"):
        render("slurm", "slurmConfig.topology[0].topology=a b")


def test_the_service_monitor_scrapes_every_slurmctld_metrics_path_on_the_controller() -> None:
    objs = render(
        "slurm",
        "controller.metrics.serviceMonitor.enabled=true",
        "controller.metrics.serviceMonitor.labels.release=prom",
    )
    sm = one(objs, "ServiceMonitor", "slurm-controller")
    assert sm["metadata"]["labels"]["release"] == "prom"
    # It selects the controller's Service, and no other Service of the release.
    services = kinds(objs, "Service")
    selected = [
        svc["metadata"]["name"]
        for svc in services
        if sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    ]
    assert selected == ["slurm-controller"]
    ports = [p["name"] for p in one(objs, "Service", "slurm-controller")["spec"]["ports"]]
    endpoints = sm["spec"]["endpoints"]
    # The same paths the test bed's Prometheus scrapes (and verifies against slurmctld).
    assert [e["path"] for e in endpoints] == list(SLURMCTLD_METRICS_PATHS)
    for e in endpoints:
        assert e["port"] in ports
        assert e["scheme"] == "http"
        assert {"sourceLabels": ["__metrics_path__"], "targetLabel": "metrics_path"} in e[
            "relabelings"
        ]
        assert {"targetLabel": "job", "replacement": "slurmctld"} in e["relabelings"]
    off = render(
        "slurm",
        "controller.metrics.enabled=false",
        "controller.metrics.serviceMonitor.enabled=true",
    )
    assert not kinds(off, "ServiceMonitor")


def test_hybrid_mode_points_the_cluster_at_an_external_slurmctld(tmp_path: Path) -> None:
    values = {
        "external": {
            "enabled": True,
            "controllerHost": "ctld.example.org",
            "controllerPort": 7817,
            "restapiUrl": "http://ctld.example.org:6820",
        },
        "slurmKey": {"existingSecret": "site-slurm-key"},
        "jwtKey": {"existingSecret": "site-jwt-key"},
    }
    objs = render_values("slurm", values, tmp_path)
    assert not kinds(objs, "StatefulSet")
    assert not kinds(objs, "Deployment")
    assert not kinds(objs, "ConfigMap")
    assert not kinds(objs, "Secret")  # the site's keys, not new ones
    cluster = one(objs, "Cluster")["spec"]
    assert cluster["server"] == "http://ctld.example.org:6820"
    assert cluster["controller"] == {"host": "ctld.example.org", "port": 7817}
    assert cluster["jwtKeyRef"]["name"] == "site-jwt-key"
    nodeset = one(objs, "NodeSet")["spec"]["template"]["spec"]
    assert nodeset["volumes"][0]["secret"]["secretName"] == "site-slurm-key"


def test_hybrid_mode_without_the_sites_keys_is_refused_naming_them() -> None:
    out = helm(
        "template",
        "x",
        str(CHARTS / "slurm"),
        "--set",
        "external.enabled=true,external.controllerHost=c,external.restapiUrl=http://c:6820",
        check=False,
    )
    assert out.returncode != 0
    assert "set slurmKey.existingSecret and jwtKey.existingSecret" in out.stderr


def test_uninstall_drains_the_nodesets_before_anything_else_goes() -> None:
    objs = render("slurm")
    job = one(objs, "Job", "slurm-cleanup")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    # Every NodeSet naming the release's Cluster goes first, also one made by hand.
    assert env["CLUSTER"] == "slurm" and env["RELEASE"] == "slurm"
    (role,) = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == "slurm-cleanup"]
    assert role["rules"] == [
        {"apiGroups": ["slinky.slurm.net"], "resources": ["nodesets"], "verbs": ["list", "delete"]}
    ]
    # The script compiles (it runs in the Slinky image's Python).
    compile(container["args"][2], "cleanup", "exec")
    assert "slurm-cleanup" not in [
        j["metadata"]["name"] for j in kinds(render("slurm", "cleanup.enabled=false"), "Job")
    ]


def test_login_pods_run_sackd_against_slurmctld_and_only_sackd_has_the_key() -> None:
    objs = render("slurm", "login.enabled=true", "login.image.repository=site/slurm-login")
    login = one(objs, "Deployment", "slurm-login")["spec"]["template"]["spec"]
    container = login["containers"][0]
    assert container["image"] == "site/slurm-login:26.05"
    # Ready (in the Service) only once sackd holds the configuration the commands read.
    probe = container["readinessProbe"]["exec"]["command"]
    assert probe == ["test", "-s", "/run/slurm/conf/slurm.conf"]
    assert container["args"][:2] == ["/bin/sh", "-ec"]
    assert (
        "/usr/sbin/sackd -D --conf-server slurm-controller.slurm.svc.cluster.local:6817"
        in container["args"][2]
    )
    assert [m["mountPath"] for m in container["volumeMounts"]] == [
        "/etc/slurm/slurm.key",
        "/run/slurm",
    ]
    for other in login["containers"][1:]:
        assert "/etc/slurm/slurm.key" not in [m["mountPath"] for m in other["volumeMounts"]]


def test_accounting_runs_slurmdbd_against_the_database_named_and_points_slurmctld_at_it() -> None:
    objs = render(
        "slurm",
        "accounting.enabled=true",
        "accounting.storage.host=mariadb.db",
        "accounting.storage.passwordSecretRef.name=db-password",
    )
    dbd = one(objs, "Deployment", "slurm-accounting")["spec"]["template"]["spec"]
    conf_init = next(c for c in dbd["initContainers"] if c["name"] == "slurmdbd-conf")
    assert "StorageHost=mariadb.db" in conf_init["command"][2]
    assert conf_init["env"][0]["valueFrom"]["secretKeyRef"] == {
        "name": "db-password",
        "key": "password",
    }
    conf = slurm_conf(objs)
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf
    assert "AccountingStorageHost=slurm-accounting.slurm.svc.cluster.local" in conf


def test_accounting_without_a_password_secret_is_refused_naming_the_key() -> None:
    out = helm(
        "template", "x", str(CHARTS / "slurm"), "--set", "accounting.enabled=true", check=False
    )
    assert out.returncode != 0
    assert "accounting.storage.passwordSecretRef.name is required" in out.stderr


def _schema_problems(value: Any, schema: JSON, path: str) -> list[str]:
    """Where `value` leaves the CRD's structural schema: fields the apiserver would prune
    (silently dropped settings), missing required fields, wrong basic types."""
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool}
    if kind in types and not isinstance(value, types[kind]):
        return [f"{path}: expected {kind}, got {type(value).__name__}"]
    if kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
        return [f"{path}: expected integer, got {value!r}"]
    problems = []
    if isinstance(value, dict):
        props = schema.get("properties")
        problems += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in value]
        for k, v in value.items():
            if props is not None and k in props:
                problems += _schema_problems(v, props[k], f"{path}.{k}")
            elif isinstance(schema.get("additionalProperties"), dict):
                problems += _schema_problems(v, schema["additionalProperties"], f"{path}.{k}")
            elif props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                problems.append(f"{path}.{k}: not in the CRD schema (pruned)")
    if isinstance(value, list) and "items" in schema:
        for n, item in enumerate(value):
            problems += _schema_problems(item, schema["items"], f"{path}[{n}]")
    return problems


def test_clusters_and_nodesets_the_chart_renders_fit_the_crds(tmp_path: Path) -> None:
    schemas = {}
    for path in (REPO / "config/crd").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        version = crd["spec"]["versions"][0]
        schemas[crd["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
    values = {
        "compute": {
            "nodesetDefaults": {"nodeConfig": "CPUs=2", "extraVolumes": [{"name": "x"}]},
            "nodesets": [
                {"name": "a", "volumeClaimTemplates": [{"metadata": {"name": "scratch"}}]},
                {"name": "b", "autoscaling": {"enabled": True}, "tolerations": [{"key": "k"}]},
            ],
        }
    }
    objs = render_values("slurm", values, tmp_path)
    checked = [o for o in objs if o["kind"] in schemas]
    assert len(checked) == 3
    for obj in checked:
        assert (
            _schema_problems(obj["spec"], schemas[obj["kind"]]["properties"]["spec"], "spec") == []
        )


# ---------------------------------------------------------------- busy pod protection


def _busy_pod_policy_of_config(name: str, username: str) -> dict[str, JSON]:
    """config/policy/'s objects by kind, with the chart's name and operator username put in."""
    docs = yaml.safe_load_all((REPO / "config/policy/busy_pod_deletion.yaml").read_text())
    text = yaml.safe_dump(list(docs))
    text = text.replace("system:serviceaccount:slinky-system:slurm-operator", username)
    text = text.replace("slurm-operator-busy-pods", name)
    return {d["kind"]: d for d in yaml.safe_load(text)}


@pytest.mark.parametrize(
    ("sets", "username"),
    [
        ([], "system:serviceaccount:ops:so-slurm-operator"),
        (
            ["operator.serviceAccount.create=false", "operator.serviceAccount.name=site-op"],
            "system:serviceaccount:ops:site-op",
        ),
    ],
)
def test_operator_chart_installs_the_busy_pod_policy_of_config_sparing_its_own_account(
    sets: list[str], username: str
) -> None:
    objs = render("slurm-operator", *sets, namespace="ops", release="so")
    want = _busy_pod_policy_of_config("so-slurm-operator-busy-pods", username)
    policy = one(objs, "ValidatingAdmissionPolicy", "so-slurm-operator-busy-pods")
    binding = one(objs, "ValidatingAdmissionPolicyBinding", "so-slurm-operator-busy-pods")
    assert policy["spec"] == want["ValidatingAdmissionPolicy"]["spec"]
    assert binding["spec"] == want["ValidatingAdmissionPolicyBinding"]["spec"]
    # The operator is known by its ServiceAccount, the one its Deployment runs as.
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert username.endswith(f":{pod['serviceAccountName']}")


def test_operator_chart_without_busy_pod_protection_installs_no_policy() -> None:
    objs = render("slurm-operator", "busyPodProtection.enabled=false", namespace="ops")
    assert not kinds(objs, "ValidatingAdmissionPolicy")
    assert not kinds(objs, "ValidatingAdmissionPolicyBinding")


def test_setting_one_key_of_a_nodeset_entry_says_how_to_do_it() -> None:
    """`--set compute.nodesets[0].replicas=3` replaces the whole entry (Helm sets list
    entries whole): the error says so and how to set it, not only "missing property"."""
    out = helm(
        "template", "x", str(CHARTS / "slurm"), "--set", "compute.nodesets[0].replicas=3",
        check=False,
    )  # fmt: skip
    assert out.returncode != 0
    assert "compute.nodesets[0].name is missing" in out.stderr, out.stderr
    assert "compute.nodesets[0].name=debug,compute.nodesets[0].replicas=3" in out.stderr
    objs = render("slurm", "compute.nodesets[0].name=debug,compute.nodesets[0].replicas=3")
    (ns,) = [o for o in objs if o["kind"] == "NodeSet"]
    assert ns["spec"]["replicas"] == 3


def test_bridge_uninstall_stops_it_then_takes_its_taint_and_finalizer_off() -> None:
    objs = render("slurm-bridge", release="slurm-bridge")
    job = one(objs, "Job", "slurm-bridge-cleanup")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["python3", "-m", "slinky.bridge.uninstall"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in args[3:])
    assert flags["scheduler-name"] == "slurm-bridge-scheduler"
    assert flags["deployments"] == "slurm-bridge-scheduler,slurm-bridge-controllers"
    assert {"slurm-bridge-scheduler", "slurm-bridge-controllers"} <= {
        o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"
    }
    (role,) = [
        o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-cleanup")
    ]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list", "patch"]}
    ]
    # The flags are the module's own.
    from slinky.bridge import uninstall

    with pytest.raises(SystemExit) as help_exit:
        uninstall.main(["--help"])
    assert help_exit.value.code == 0
    assert not kinds(render("slurm-bridge", "cleanup.enabled=false", release="b"), "Job")


def test_operator_uninstall_waits_for_what_it_still_finalizes() -> None:
    objs = render("slurm-operator", release="slurm-operator")
    job = one(objs, "Job", "slurm-operator-cleanup")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["python3", "-m", "slinky.operator.uninstall"]
    (role,) = [
        o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-cleanup")
    ]
    assert role["rules"] == [
        {
            "apiGroups": ["slinky.slurm.net"],
            "resources": ["clusters", "nodesets"],
            "verbs": ["list"],
        },
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list"]},
    ]
    assert not kinds(render("slurm-operator", "cleanup.enabled=false"), "Job")


def test_an_upgrade_renders_the_same_hook_the_refusal_is_at_run_time() -> None:
    """A slurm.key whose Secret is gone at an upgrade is refused by the hook at run time
    (slinky.operator.keys: slurmctld's StatefulSet exists), not by the render, which cannot
    know (Argo CD renders as an install with no cluster access)."""
    install = keys_hook(render("slurm"))
    upgrade = keys_hook(
        load_all(
            helm("template", "slurm", str(CHARTS / "slurm"), "-n", "slurm", "--is-upgrade").stdout
        )
    )
    assert install == upgrade


# ---------------------------------------------------------------- monitoring

MONITORING = REPO / "config/monitoring"
CHART_MONITORING = CHARTS / "slurm-operator/files/monitoring"


def _monitoring_files(root: Path) -> dict[str, bytes]:
    """alerts.yaml and the dashboards (the promtool tests stay in config/monitoring/ only)."""
    paths = [root / "alerts.yaml", *sorted((root / "dashboards").glob("*.json"))]
    return {str(p.relative_to(root)): p.read_bytes() for p in paths if p.exists()}


def test_operator_chart_holds_config_monitoring_byte_for_byte() -> None:
    ours = _monitoring_files(CHART_MONITORING)
    source = _monitoring_files(MONITORING)
    assert ours.keys() == source.keys(), "copy config/monitoring/ to " + str(CHART_MONITORING)
    stale = [name for name in ours if ours[name] != source[name]]
    assert not stale, f"copy config/monitoring/{stale[0]} to {CHART_MONITORING}/"


def test_operator_chart_renders_no_dashboards_or_rules_unless_asked() -> None:
    objs = render("slurm-operator")
    assert not kinds(objs, "PrometheusRule")
    assert not [
        o for o in kinds(objs, "ConfigMap") if "grafana_dashboard" in o["metadata"]["labels"]
    ]


def test_dashboards_are_configmaps_the_grafana_sidecar_loads_unchanged() -> None:
    objs = render(
        "slurm-operator",
        "monitoring.dashboards.enabled=true",
        "monitoring.dashboards.annotations.grafana_folder=Slinky",
        namespace="slinky-system",
    )
    maps = {
        next(iter(o["data"])): o
        for o in kinds(objs, "ConfigMap")
        if "grafana_dashboard" in o["metadata"]["labels"]
    }
    dashboards = sorted((MONITORING / "dashboards").glob("*.json"))
    assert sorted(maps) == [p.name for p in dashboards]
    for path in dashboards:
        cm = maps[path.name]
        assert cm["data"] == {path.name: path.read_text()}
        assert cm["metadata"]["namespace"] == "slinky-system"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Slinky"}
        assert len(cm["metadata"]["name"]) <= 63


def test_dashboards_go_to_the_namespace_and_labels_asked() -> None:
    objs = render(
        "slurm-operator",
        "monitoring.dashboards.enabled=true",
        "monitoring.dashboards.namespace=monitoring",
        "monitoring.dashboards.labels.grafana_dashboard=null",
        "monitoring.dashboards.labels.dashboards=slinky",
    )
    maps = [o for o in kinds(objs, "ConfigMap") if o["metadata"]["namespace"] == "monitoring"]
    assert len(maps) == len(list((MONITORING / "dashboards").glob("*.json")))
    for cm in maps:
        assert cm["metadata"]["labels"]["dashboards"] == "slinky"
        assert "grafana_dashboard" not in cm["metadata"]["labels"]
        assert "annotations" not in cm["metadata"]


def test_alerts_are_a_prometheus_rule_with_the_rules_of_config() -> None:
    objs = render(
        "slurm-operator",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.prometheusRule.labels.release=prom",
        namespace="slinky-system",
    )
    rule = one(objs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "slinky-system"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    elsewhere = render(
        "slurm-operator",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.prometheusRule.namespace=monitoring",
    )
    assert one(elsewhere, "PrometheusRule")["metadata"]["namespace"] == "monitoring"


def test_the_service_monitor_keeps_the_namespace_label_of_the_gauges() -> None:
    """With honorLabels the slurm_* gauges keep `namespace` (the Cluster's or NodeSet's), which
    the dashboards select by; else Prometheus would rename it `exported_namespace`."""
    objs = render("slurm-operator", "metrics.serviceMonitor.enabled=true")
    (endpoint,) = one(objs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True


def test_the_bridge_pods_get_a_pod_monitor_on_request() -> None:
    assert not kinds(render("slurm-bridge"), "PodMonitor")
    objs = render("slurm-bridge", "podMonitor.enabled=true", "podMonitor.labels.release=kps")
    pm = one(objs, "PodMonitor")
    assert pm["metadata"]["labels"]["release"] == "kps"
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["honorLabels"]) == ("metrics", True)
    selector = pm["spec"]["selector"]["matchLabels"]
    for deployment in kinds(objs, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), deployment["metadata"]["name"]


def test_cgroup_isolation_with_cgroups_disabled_is_refused_naming_both_keys() -> None:
    out = helm("template", "slurm", str(CHARTS / "slurm"), "--set-string",
               "slurmConfig.cgroupConf=CgroupPlugin=disabled", check=False)  # fmt: skip
    assert out.returncode != 0
    assert "slurmConfig.cgroupConf: CgroupPlugin=disabled" in out.stderr
    assert "jobIsolation" in out.stderr
