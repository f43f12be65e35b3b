"""deploy/kubernetes/ against the Kubernetes schemas and against the code: every object
validates, every command is a real CLI command, ports and names meet, the PrometheusRule is
the shipped rules, and each ServiceAccount's RBAC is exactly what its code calls."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from autoclusters.clients.agent.settings import AgentSettings
from autoclusters.clients.cli.app import app
from autoclusters.clients.web.auth import BearerAuth, Caller
from autoclusters.clients.web.settings import ApiSettings
from autoclusters.integrations import slinky_crs
from autoclusters.integrations.temporal import SEARCH_ATTRIBUTES
from tests.project.settings_names import names_a_setting

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE_DIR = ROOT / "deploy/kubernetes"
# Kubernetes versions the manifests must be valid for: native sidecars (an init container
# with restartPolicy: Always) are on by default since 1.29.
K8S_VERSIONS = ("1.29.0", "1.33.0")
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

Rule = tuple[str, str, str]  # (apiGroup, resource, verb)

# What our code calls: a `kubernetes` client method -> the (apiGroup, resource, verb) it
# needs. A call missing here fails test_every_kubernetes_call_is_in_the_table: add it
# (and its rule to rbac.yaml). The sharing feature will add AppsV1Api deployment calls and
# pod lists/patches; their rows are here already.
K8S_CALLS: dict[str, Rule] = {
    # CoreV1Api
    "read_node": ("", "nodes", "get"),
    "list_node": ("", "nodes", "list"),
    "patch_node": ("", "nodes", "patch"),
    "read_node_status": ("", "nodes/status", "get"),
    "patch_node_status": ("", "nodes/status", "patch"),
    "list_pod_for_all_namespaces": ("", "pods", "list"),
    "list_namespaced_pod": ("", "pods", "list"),
    "read_namespaced_pod": ("", "pods", "get"),
    "patch_namespaced_pod": ("", "pods", "patch"),
    "delete_namespaced_pod": ("", "pods", "delete"),
    "create_namespaced_pod_eviction": ("", "pods/eviction", "create"),
    "create_namespaced_event": ("", "events", "create"),
    "read_namespaced_event": ("", "events", "get"),
    "patch_namespaced_event": ("", "events", "patch"),
    "create_namespace": ("", "namespaces", "create"),
    "create_namespaced_config_map": ("", "configmaps", "create"),
    "read_namespaced_config_map": ("", "configmaps", "get"),
    "patch_namespaced_config_map": ("", "configmaps", "patch"),
    "delete_namespaced_config_map": ("", "configmaps", "delete"),
    "create_namespaced_secret": ("", "secrets", "create"),
    "delete_namespaced_secret": ("", "secrets", "delete"),
    "create_namespaced_persistent_volume_claim": ("", "persistentvolumeclaims", "create"),
    "read_namespaced_persistent_volume_claim": ("", "persistentvolumeclaims", "get"),
    "delete_namespaced_persistent_volume_claim": ("", "persistentvolumeclaims", "delete"),
    # AppsV1Api
    "read_namespaced_deployment": ("apps", "deployments", "get"),
    "list_namespaced_deployment": ("apps", "deployments", "list"),
    "patch_namespaced_deployment": ("apps", "deployments", "patch"),
    "read_namespaced_deployment_scale": ("apps", "deployments/scale", "get"),
    "patch_namespaced_deployment_scale": ("apps", "deployments/scale", "patch"),
    "replace_namespaced_deployment_scale": ("apps", "deployments/scale", "update"),
}
# CustomObjectsApi: the group and resource come from the kind the call is for.
CUSTOM_VERBS = {
    "create_namespaced_custom_object": "create",
    "get_namespaced_custom_object": "get",
    "list_namespaced_custom_object": "list",
    "patch_namespaced_custom_object": "patch",
    "delete_namespaced_custom_object": "delete",
}
# Whose code runs under which ServiceAccount.
COMPONENTS = {
    "autoclusters-worker": ("activities", "integrations"),
    # The API places an incident's nodes by their Nodes' labels (clients/fabric_topology.py).
    "autoclusters-api": ("clients/api", "clients/console", "clients/fabric_topology.py"),
    # The agent's condition change leaves an Event through the worker's recorder.
    "autoclusters-agent": ("clients/agent", "integrations/k8s_events.py"),
}
# The objects of the kubernetes client we call through, wherever they are made.
API_ATTR = re.compile(
    r"self\.(_\w+)\s*(?::[^=\n]+)?=\s*(?:client|k8s|kubernetes\.client)\.(\w+Api)\("
)
INLINE_CALL = re.compile(r"\b(?:client|k8s)\.(\w+Api)\([^()]*\)\.(\w+)")
VERB_PREFIX = re.compile(r"^(list|read|create|patch|replace|delete|get)_")


# --- rendering -----------------------------------------------------------------------------


def _kustomization() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((KUSTOMIZE_DIR / "kustomization.yaml").read_text())
    return data


def render_with_pyyaml() -> list[dict[str, Any]]:
    """What `kubectl kustomize` makes of this kustomization, for the parts it uses:
    resources, configMapGenerator from files (no hash suffix) and images."""
    k = _kustomization()
    assert set(k) <= {
        "apiVersion",
        "kind",
        "resources",
        "configMapGenerator",
        "generatorOptions",
        "images",
    }, "the kustomization uses a feature render_with_pyyaml does not know"
    assert k["generatorOptions"] == {"disableNameSuffixHash": True}
    objects: list[dict[str, Any]] = []
    for resource in k["resources"]:
        objects += [d for d in yaml.safe_load_all((KUSTOMIZE_DIR / resource).read_text()) if d]
    for gen in k.get("configMapGenerator", []):
        data = {Path(f).name: (KUSTOMIZE_DIR / f).read_text() for f in gen["files"]}
        meta = {"name": gen["name"], "namespace": gen["namespace"]}
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    images = {i["name"]: f"{i.get('newName', i['name'])}:{i['newTag']}" for i in k["images"]}
    for container in _containers(objects):
        name = container["image"].split(":")[0]
        if name in images:
            container["image"] = images[name]
    return objects


def render_with_kubectl() -> list[dict[str, Any]]:
    done = subprocess.run(
        ["kubectl", "kustomize", str(KUSTOMIZE_DIR)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render_with_kubectl() if shutil.which("kubectl") else render_with_pyyaml()


def _pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for obj in objects:
        if obj["kind"] in ("Deployment", "DaemonSet", "Job"):
            yield obj, obj["spec"]["template"]["spec"]


def _containers(objects: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for _, spec in _pod_specs(objects):
        yield from spec.get("initContainers", [])
        yield from spec["containers"]


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


# --- the objects ---------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_pyyaml_rendering_is_what_kubectl_kustomize_makes() -> None:
    by_kubectl = sorted(render_with_kubectl(), key=_key)
    by_pyyaml = sorted(render_with_pyyaml(), key=_key)
    assert [_key(o) for o in by_pyyaml] == [_key(o) for o in by_kubectl]
    assert by_pyyaml == by_kubectl


def test_every_object_is_valid_for_kubernetes(objects: list[dict[str, Any]]) -> None:
    assert len(objects) >= 20
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{_key(obj)} on {version}: {e.message} at {list(e.path)}")
        ns = obj["metadata"].get("namespace")
        cluster_scoped = obj["kind"] in ("Namespace", "ClusterRole", "ClusterRoleBinding")
        assert (ns is None) == cluster_scoped, _key(obj)
        assert ns in (None, "autoclusters"), _key(obj)


def test_a_broken_object_fails_validation() -> None:
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"ports": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[0], strict=True)


def test_the_parts_and_their_replicas(objects: list[dict[str, Any]]) -> None:
    assert _one(objects, "Deployment", "autoclusters-worker")["spec"]["replicas"] >= 2
    assert _one(objects, "Deployment", "autoclusters-api")["spec"]["replicas"] >= 2
    _one(objects, "DaemonSet", "autoclusters-agent")


def test_our_containers_run_real_cli_commands_from_our_image(objects: list[dict[str, Any]]) -> None:
    image = "{newName}:{newTag}".format(**_kustomization()["images"][0])
    dockerfile = (ROOT / "Dockerfile").read_text()
    runner = CliRunner()
    seen = set()
    for container in _containers(objects):
        if container["image"] != image:
            repo = container["image"].split(":")[0]
            assert repo == "temporalio/admin-tools", container["name"]
            continue
        if "command" in container:
            # Only the munged sidecar replaces the entrypoint, with a binary the image has.
            assert container["command"][0] == "munged"
            assert re.search(r"apt-get install[^\n]* munge\b", dockerfile)
            continue
        args = [re.sub(r"=\$\(\w+\)$", "=x", a) for a in container["args"]]
        result = runner.invoke(app, [*args, "--help"])
        assert result.exit_code == 0, f"{container['name']}: {args}: {result.output}"
        seen.add(tuple(container["args"][:2]))
    assert {("worker",), ("api", "run"), ("agent", "run")} <= seen


def test_settings_in_the_config_map_exist(
    objects: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _one(objects, "ConfigMap", "autoclusters-config")["data"]
    for var, value in data.items():
        if var.startswith("AUTOCLUSTERS_"):
            assert names_a_setting(var), var
        monkeypatch.setenv(var, value)
    # The API reads them as the pods will (the environment), and accepts every value.
    s = ApiSettings()
    assert s.api_port == int(data["AUTOCLUSTERS_API_PORT"])
    assert str(s.policy_file) == data["AUTOCLUSTERS_POLICY_FILE"]
    for container in _containers(objects):
        for env in container.get("env", []):
            name = env["name"]
            if name.startswith("AUTOCLUSTERS_AGENT_"):
                assert (
                    name.removeprefix("AUTOCLUSTERS_AGENT_").lower() in AgentSettings.model_fields
                )
            elif name.startswith("AUTOCLUSTERS_"):
                assert names_a_setting(name), name


def test_references_between_objects_resolve(objects: list[dict[str, Any]]) -> None:
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    for owner, spec in _pod_specs(objects):
        if "serviceAccountName" in spec:
            assert ("ServiceAccount", spec["serviceAccountName"]) in names
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in names, volume
            if "secret" in volume and not volume["secret"].get("optional"):
                assert volume["secret"]["secretName"] in secrets, volume
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            for ref in container.get("envFrom", []):
                assert ("ConfigMap", ref["configMapRef"]["name"]) in names
            for env in container.get("env", []):
                source = env.get("valueFrom", {})
                if "secretKeyRef" in source:
                    ref = source["secretKeyRef"]
                    secret = secrets[ref["name"]]
                    keys = {**secret.get("stringData", {}), **secret.get("data", {})}
                    assert ref["key"] in keys, (owner["metadata"]["name"], ref)
                if "configMapKeyRef" in source:
                    ref = source["configMapKeyRef"]
                    assert ref["key"] in _one(objects, "ConfigMap", ref["name"])["data"]
    # The mounted files are where the settings say.
    data = _one(objects, "ConfigMap", "autoclusters-config")["data"]
    worker = _one(objects, "Deployment", "autoclusters-worker")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in worker["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in worker["volumes"]}

    def file_in(setting: str, kind: str) -> dict[str, Any]:
        path = data[setting]
        [(vol, mount)] = [(n, m) for n, m in mounts.items() if path.startswith(m + "/")]
        ref = volumes[vol]["configMap"]["name"]
        key = path.removeprefix(mount + "/")
        cm = _one(objects, kind, ref)
        assert key in cm["data"], (setting, ref, key)
        return cm

    file_in("AUTOCLUSTERS_SLURM__CONF", "ConfigMap")
    kubeconfig = yaml.safe_load(
        file_in("AUTOCLUSTERS_KUBERNETES__KUBECONFIG", "ConfigMap")["data"]["kubeconfig"]
    )
    assert kubeconfig["users"][0]["user"]["tokenFile"].startswith("/var/run/secrets/kubernetes.io")
    policy = file_in("AUTOCLUSTERS_POLICY_FILE", "ConfigMap")["data"]["policy.yaml"]
    assert policy == (ROOT / "deploy/config/policy.yaml").read_text()


def test_the_policy_copy_loads() -> None:
    from autoclusters.core.policy import load_policy

    load_policy(KUSTOMIZE_DIR / "policy.yaml")


def test_the_agent_reaches_nvml_sysfs_and_its_node(objects: list[dict[str, Any]]) -> None:
    ds = _one(objects, "DaemonSet", "autoclusters-agent")
    spec = ds["spec"]["template"]["spec"]
    [agent] = spec["containers"]
    assert agent["securityContext"]["privileged"] is True
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "--node=$(NODE_NAME)" in agent["args"]
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    [sys_mount] = [
        m for m in mounts.values() if volumes[m["name"]].get("hostPath", {}).get("path") == "/sys"
    ]
    assert sys_mount["readOnly"] is True
    assert f"--sysfs-root={sys_mount['mountPath']}" in agent["args"]
    effects = {
        t["effect"] for t in spec["tolerations"] if t["operator"] == "Exists" and "key" not in t
    }
    assert effects == {"NoSchedule", "NoExecute"}
    # Reports go to the API Service's port; metrics on the port the Service names.
    api_svc = _one(objects, "Service", "autoclusters-api")
    [port] = api_svc["spec"]["ports"]
    assert f"--api=http://autoclusters-api.autoclusters.svc:{port['port']}" in agent["args"]
    [metrics] = agent["ports"]
    assert f"--metrics-port={metrics['containerPort']}" in agent["args"]
    assert env["AUTOCLUSTERS_AGENT_METRICS_HOST"]["value"] == "0.0.0.0"


def test_the_agent_checks_at_its_own_default_interval_everywhere(
    objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    """One check interval for the shipped agent and the sandbox's: the agent's default
    (fatal GPU events wake the agent at once, so the sandbox needs no shorter one)."""
    from autoclusters.sandbox.runtime.config import SandboxConfig
    from autoclusters.sandbox.runtime.daemons import agent_argv

    [agent] = _one(objects, "DaemonSet", "autoclusters-agent")["spec"]["template"]["spec"][
        "containers"
    ]
    assert not [a for a in agent["args"] if a.startswith("--interval")]
    assert "AUTOCLUSTERS_AGENT_INTERVAL_S" not in {e["name"] for e in agent.get("env", [])}
    assert "envFrom" not in agent
    argv = agent_argv(SandboxConfig(state_dir=tmp_path), "gpu-01")
    assert not [a for a in argv if a.startswith("--interval")]


def test_services_ports_match_the_listen_ports(objects: list[dict[str, Any]]) -> None:
    data = _one(objects, "ConfigMap", "autoclusters-config")["data"]
    api = _one(objects, "Deployment", "autoclusters-api")["spec"]["template"]["spec"]
    [http] = api["containers"][0]["ports"]
    assert http["containerPort"] == int(data["AUTOCLUSTERS_API_PORT"])
    assert data["AUTOCLUSTERS_API_HOST"] == "0.0.0.0"
    worker = _one(objects, "Deployment", "autoclusters-worker")["spec"]["template"]["spec"]
    [metrics] = worker["containers"][0]["ports"]
    assert metrics["containerPort"] == int(data["AUTOCLUSTERS_WORKER__METRICS_PORT"])
    assert data["AUTOCLUSTERS_WORKER__METRICS_HOST"] == "0.0.0.0"
    # alertmanager.yml's receiver names this Service and port.
    am = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    url = next(r for r in am["receivers"] if r["name"] == "autoclusters")["webhook_configs"][0][
        "url"
    ]
    [svc_port] = _one(objects, "Service", "autoclusters-api")["spec"]["ports"]
    assert url.startswith(f"http://autoclusters-api:{svc_port['port']}/")
    assert svc_port["targetPort"] == http["name"]


def test_service_monitors_select_services_with_the_named_ports(
    objects: list[dict[str, Any]],
) -> None:
    services = [o for o in objects if o["kind"] == "Service"]
    monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
    scraped = set()
    for sm in monitors:
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        selector = sm["spec"]["selector"]
        chosen = [s for s in services if _selects(selector, s["metadata"].get("labels", {}))]
        assert chosen, sm["metadata"]["name"]
        ports = {p["name"] for s in chosen for p in s["spec"]["ports"]}
        for endpoint in sm["spec"]["endpoints"]:
            assert endpoint["port"] in ports, (sm["metadata"]["name"], endpoint["port"])
            assert endpoint["path"] == "/metrics"
        scraped |= {s["metadata"]["name"] for s in chosen}
    assert scraped == {s["metadata"]["name"] for s in services}


def test_every_metrics_port_asks_for_the_token_prometheus_shows(
    objects: list[dict[str, Any]],
) -> None:
    token_ref = {"name": "autoclusters-metrics", "key": "token"}
    token = _one(objects, "Secret", "autoclusters-metrics")["stringData"]["token"]
    for sm in (o for o in objects if o["kind"] == "ServiceMonitor"):
        for endpoint in sm["spec"]["endpoints"]:
            assert endpoint["authorization"] == {"type": "Bearer", "credentials": token_ref}
    # The worker and the agents listen on the pod network, so they are given the token
    # (without one they refuse to serve /metrics there) ...
    data = _one(objects, "ConfigMap", "autoclusters-config")["data"]
    assert data["AUTOCLUSTERS_WORKER__METRICS_HOST"] == "0.0.0.0"
    worker = _one(objects, "Deployment", "autoclusters-worker")["spec"]["template"]["spec"]
    agent = _one(objects, "DaemonSet", "autoclusters-agent")["spec"]["template"]["spec"]
    for container, var in (
        (worker["containers"][0], "AUTOCLUSTERS_WORKER__METRICS_TOKEN"),
        (agent["containers"][0], "AUTOCLUSTERS_AGENT_METRICS_TOKEN"),
    ):
        env = {e["name"]: e for e in container["env"]}
        assert env[var]["valueFrom"]["secretKeyRef"] == token_ref, var
    # ... and the API knows it as the caller `prometheus`, a reader (it may scrape, nothing
    # more).
    raw = _one(objects, "Secret", "autoclusters-api-tokens")["stringData"]
    api = ApiSettings(api_tokens=json.loads(raw["AUTOCLUSTERS_API_TOKENS"]))
    assert BearerAuth(api).caller(f"Bearer {token}") == Caller("prometheus", "reader")


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for k, v in selector.get("matchLabels", {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In"
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def test_the_prometheus_rule_is_the_shipped_rules(objects: list[dict[str, Any]]) -> None:
    rule = _one(objects, "PrometheusRule", "autoclusters-gpu-alerts")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    shipped = yaml.safe_load((ROOT / "deploy/prometheus/gpu-alerts.yml").read_text())
    assert rule["spec"]["groups"] == shipped["groups"]


def test_the_setup_job_registers_our_search_attributes(objects: list[dict[str, Any]]) -> None:
    job = _one(objects, "Job", "autoclusters-temporal-setup")
    [container] = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    declared = set(env["SEARCH_ATTRIBUTES"]["value"].split())
    assert declared == {f"{k.name}=Keyword" for k in SEARCH_ATTRIBUTES}
    address = env["TEMPORAL_ADDRESS"]["valueFrom"]["configMapKeyRef"]
    assert address["key"] == "AUTOCLUSTERS_TEMPORAL__ADDRESS"


# --- RBAC: what the code calls ------------------------------------------------------------


def _python_files(folders: tuple[str, ...]) -> Iterator[Path]:
    for folder in folders:
        path = ROOT / folder
        yield from [path] if path.is_file() else sorted(path.rglob("*.py"))


def client_calls(
    folders: tuple[str, ...], skip: frozenset[str] = frozenset()
) -> set[tuple[str, str]]:
    """(API class, method) of every kubernetes client method the code in `folders` names:
    through an attribute bound to an API object (`self._core = client.CoreV1Api(api)`,
    then `self._core.patch_node`, called or passed to a helper), or inline
    (`k8s.CoreV1Api(api).read_node(...)`)."""
    texts = [path.read_text() for path in _python_files(folders) if path.name not in skip]
    # Bindings hold across files: a subclass uses the attribute its base class set.
    bound = {attr: api for text in texts for attr, api in API_ATTR.findall(text)}
    calls = set()
    for text in texts:
        for attr, api in bound.items():
            for method in re.findall(rf"self\.{attr}\.(\w+)", text):
                calls.add((api, method))
        calls |= set(INLINE_CALL.findall(text))
    return calls


def _kube_objects_closure() -> dict[str, set[tuple[str, str]]]:
    """For each KubeObjects method: the (API attribute, client method) it reaches."""
    tree = ast.parse(Path(slinky_crs.__file__).read_text())
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KubeObjects"]
    direct: dict[str, set[tuple[str, str]]] = {}
    calls: dict[str, set[str]] = {}
    for fn in cls.body:
        if not isinstance(fn, ast.AsyncFunctionDef | ast.FunctionDef):
            continue
        direct[fn.name], calls[fn.name] = set(), set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
                inner = node.value
                if isinstance(inner.value, ast.Name) and inner.value.id == "self":
                    direct[fn.name].add((inner.attr, node.attr))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "self":
                    calls[fn.name].add(node.attr)
    closure = {}
    for name in direct:
        seen, todo, reached = set(), [name], set()
        while todo:
            m = todo.pop()
            if m in seen or m not in direct:
                continue
            seen.add(m)
            reached |= direct[m]
            todo += calls[m]
        closure[name] = reached
    return closure


def _kinds() -> dict[str, slinky_crs.CustomKind]:
    return {n: v for n, v in vars(slinky_crs).items() if isinstance(v, slinky_crs.CustomKind)}


def kube_objects_rules(folders: tuple[str, ...]) -> set[Rule]:
    """The rules the KubeObjects calls in `folders` need, custom resources by kind (a kind
    passed through a `for kind in (A, B)` loop counts each)."""
    closure, kinds, rules = _kube_objects_closure(), _kinds(), set()
    api_of = {"_custom": "CustomObjectsApi", "_core": "CoreV1Api"}
    for path in _python_files(folders):
        if path.name == "slinky_crs.py":
            continue
        tree = ast.parse(path.read_text())
        loops: dict[str, list[str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.For | ast.AsyncFor) and isinstance(node.target, ast.Name):
                if isinstance(node.iter, ast.Tuple):
                    loops[node.target.id] = [
                        e.id for e in node.iter.elts if isinstance(e, ast.Name)
                    ]
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            target = node.func.value
            if not (isinstance(target, ast.Attribute) and target.attr == "_kube"):
                continue
            method = node.func.attr
            assert method in closure, f"{path.name}: KubeObjects has no {method}"
            for attr, client_method in closure[method]:
                if attr not in api_of:
                    continue
                if api_of[attr] == "CoreV1Api":
                    rules.add(K8S_CALLS[client_method])
                    continue
                arg = node.args[0]
                assert isinstance(arg, ast.Name), f"{path.name}:{node.lineno}: kind not a name"
                for kind_name in loops.get(arg.id, [arg.id]):
                    assert kind_name in kinds, (
                        f"{path.name}:{node.lineno}: unknown kind {kind_name}"
                    )
                    kind = kinds[kind_name]
                    rules.add((kind.group, kind.plural, CUSTOM_VERBS[client_method]))
    return rules


def rules_the_code_needs(folders: tuple[str, ...]) -> set[Rule]:
    rules = kube_objects_rules(folders)
    # KubeObjects (slinky_crs.py) counts through its callers: a method no activity calls
    # needs no rule.
    for api, method in client_calls(folders, skip=frozenset({"slinky_crs.py"})):
        if api == "CustomObjectsApi":
            continue  # by kind, above (KubeObjects is the only caller)
        if VERB_PREFIX.match(method) or method in K8S_CALLS:
            rules.add(K8S_CALLS[method])
    return rules


def rbac_rules(objects: list[dict[str, Any]], account: str) -> set[Rule]:
    bindings = [
        b
        for b in objects
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
        and any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"])
    ]
    rules: set[Rule] = set()
    for binding in bindings:
        role = _one(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"])
        for rule in role["rules"]:
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert "*" not in (group, resource, verb), role["metadata"]["name"]
                        rules.add((group, resource, verb))
    return rules


def test_every_kubernetes_call_is_in_the_table() -> None:
    for account, folders in COMPONENTS.items():
        for api, method in client_calls(folders):
            if api == "CustomObjectsApi":
                assert method in CUSTOM_VERBS, method
            elif VERB_PREFIX.match(method):
                assert method in K8S_CALLS, f"{account}: add {api}.{method} to K8S_CALLS"


def test_the_scan_finds_the_calls_we_know() -> None:
    worker = rules_the_code_needs(COMPONENTS["autoclusters-worker"])
    # activities/kubernetes.py: cordon, evict, force-delete, mark; the CMK provider's kinds.
    assert {
        ("", "nodes", "patch"),
        ("", "pods/eviction", "create"),
        ("", "pods", "delete"),
        ("", "nodes/status", "patch"),
        ("slinky.slurm.net", "nodesets", "list"),
        ("slurm.crusoe.ai", "slurmusers", "delete"),  # through `for kind in (...)`
        ("apps", "deployments/scale", "patch"),  # activities/sharing_k8s.py
        ("", "pods", "patch"),  # on `self._core`, which its base class sets
    } <= worker
    assert rules_the_code_needs(COMPONENTS["autoclusters-agent"]) == {
        ("", "nodes", "get"),  # clients/agent/slurm_name.py
        ("", "nodes/status", "get"),
        ("", "nodes/status", "patch"),
        ("", "events", "create"),  # its condition's Event (integrations/k8s_events.py)
        ("", "events", "get"),
        ("", "events", "patch"),
    }


@pytest.mark.parametrize("account", sorted(COMPONENTS))
def test_rbac_is_exactly_what_the_code_calls(objects: list[dict[str, Any]], account: str) -> None:
    needed = rules_the_code_needs(COMPONENTS[account])
    granted = rbac_rules(objects, account)
    assert not needed - granted, f"{account} lacks {sorted(needed - granted)}"
    assert not granted - needed, f"{account} is granted unused {sorted(granted - needed)}"
    # Each Deployment/DaemonSet runs as its own account.
    [owner] = [
        o
        for o, spec in _pod_specs(objects)
        if spec.get("serviceAccountName") == account and o["kind"] != "Job"
    ]
    assert owner["metadata"]["name"] == account


def test_the_in_cluster_kubeconfig_gives_the_client_the_service_account_token(
    objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    from autoclusters.integrations.k8s import api_client

    text = _one(objects, "ConfigMap", "autoclusters-kubeconfig")["data"]["kubeconfig"]
    sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert f"{sa_dir}/token" in text and f"{sa_dir}/ca.crt" in text
    (tmp_path / "token").write_text("sa-token-123")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(text.replace(sa_dir, str(tmp_path)))
    with api_client(kubeconfig=kubeconfig) as api:
        config = api.configuration
        assert config.host == "https://kubernetes.default.svc"
        assert "Bearer sa-token-123" in config.api_key.values()
        assert Path(config.ssl_ca_cert).read_text() == "-----BEGIN CERTIFICATE-----\n"
