"""A real `kubectl` against the Kubernetes API emulator (issue #21).

kubectl reads discovery before any verb, asks for Tables, watches, validates through
OpenAPI v3, evicts with protobuf bodies, and sends its bearer token only over TLS: each test
drives the kubectl binary through one of these against the emulator's HTTPS port, and reads
the outcome back through the Python client or the store.

Integration lane: the tests run kubectl processes (and a watch that outlives a command).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client, watch

from autoclusters.core.cluster_spec import load_cluster_spec
from autoclusters.integrations.k8s import api_client
from autoclusters.integrations.slinky_crs import controller_body, loginset_body, nodeset_body
from autoclusters.sandbox.kubernetes.emulator import Running, running
from autoclusters.sandbox.kubernetes.tls import kubeconfig

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
]

TOKEN = "kubectl-test-token"
ROOT = Path(__file__).resolve().parents[2]
SLURM_NS = "slurm"
NODESET_UID = "6c3f3a55-1c1e-4d8e-9a55-0d7c0f6b0e01"


@pytest.fixture
def emu() -> Iterator[Running]:
    with running(TOKEN, tls=True) as e:
        for name, vm in (("gpu-01", "vm-1"), ("gpu-02", "vm-2")):
            httpx.post(
                f"{e.url}/_emulator/nodes",
                json={"name": name, "provider_id": f"crusoe://{vm}", "gpus": 8},
                verify=e.verify,
            ).raise_for_status()
        yield e


@pytest.fixture
def kube_env(emu: Running, tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "kubeconfig"
    config.write_text(emu.kubeconfig())
    # A HOME of its own: kubectl caches discovery under ~/.kube/cache.
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KUBECONFIG": str(config)}


@pytest.fixture
def core(emu: Running, kube_env: dict[str, str]) -> Iterator[Core]:
    api = api_client(kubeconfig=kube_env["KUBECONFIG"])  # kubectl's kubeconfig: one for both
    yield client.CoreV1Api(api)
    api.close()


Kubectl = Callable[..., subprocess.CompletedProcess[str]]
# The Python client's CoreV1Api, untyped here: its models make every field Optional and its
# methods take models, where these tests pass dicts and read back fields they just wrote.
Core = Any


@pytest.fixture
def kubectl(kube_env: dict[str, str]) -> Kubectl:
    def run(*args: str, check: bool = True, stdin: str | None = None) -> Any:
        done = subprocess.run(
            ["kubectl", *args],
            env=kube_env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr}")
        return done

    return run


def slurmd_pod(core: Core, name: str, node: str, ns: str = SLURM_NS) -> None:
    """A pod like Slinky's slurmd: owned by a NodeSet (a controller, so drain may evict it),
    with an emptyDir (so drain needs --delete-emptydir-data)."""
    owner = {"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet", "name": "gpu",
             "uid": NODESET_UID, "controller": True}  # fmt: skip
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": name, "labels": {"app": "slurmd"}, "ownerReferences": [owner]},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "slurmd", "image": "slurmd"}],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
            },
        },
    )


def pods_on(core: Core, node: str) -> list[str]:
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    return sorted(p.metadata.name for p in pods)


def until(check: Callable[[], Any], timeout_s: float = 20, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def test_get_nodes_wide_and_describe(kubectl: Kubectl) -> None:
    wide = kubectl("get", "nodes", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[:5] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert "INTERNAL-IP" in wide[0] and "CONTAINER-RUNTIME" in wide[0]
    assert [line.split()[:2] for line in wide[1:]] == [["gpu-01", "Ready"], ["gpu-02", "Ready"]]
    # The short name comes from discovery.
    assert kubectl("get", "no", "-o", "name").stdout.split() == ["node/gpu-01", "node/gpu-02"]
    described = kubectl("describe", "node", "gpu-01").stdout
    assert "ProviderID:" in described and "crusoe://vm-1" in described
    assert "nvidia.com/gpu:" in described and "Non-terminated Pods:" in described


def test_cordon_and_uncordon_reach_the_node(kubectl: Kubectl, core: Core) -> None:
    assert "cordoned" in kubectl("cordon", "gpu-01").stdout
    assert core.read_node("gpu-01").spec.unschedulable is True
    assert "Ready,SchedulingDisabled" in kubectl("get", "node", "gpu-01").stdout
    assert "uncordoned" in kubectl("uncordon", "gpu-01").stdout
    assert not core.read_node("gpu-01").spec.unschedulable
    assert not core.read_node("gpu-02").spec.unschedulable


def test_drain_evicts_through_the_eviction_subresource(
    kubectl: Kubectl, core: Core, emu: Running
) -> None:
    core.create_namespace({"metadata": {"name": SLURM_NS}})
    slurmd_pod(core, "slurmd-gpu-01", "gpu-01")
    slurmd_pod(core, "slurmd-gpu-02", "gpu-02")
    # A budget that allows no disruption: only an eviction (not a delete) is refused by it.
    policy: Any = client.PolicyV1Api(core.api_client)
    policy.create_namespaced_pod_disruption_budget(
        SLURM_NS,
        {"metadata": {"name": "slurmd"},
         "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "slurmd"}}}},
    )  # fmt: skip
    blocked = kubectl(
        "drain", "gpu-01", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=2s",
        check=False,
    )  # fmt: skip
    assert blocked.returncode != 0
    assert "disruption budget" in blocked.stderr + blocked.stdout
    assert pods_on(core, "gpu-01") == ["slurmd-gpu-01"]

    policy.delete_namespaced_pod_disruption_budget("slurmd", SLURM_NS)
    out = kubectl("drain", "gpu-01", "--ignore-daemonsets", "--delete-emptydir-data").stdout
    assert "pod/slurmd-gpu-01 evicted" in out and "drained" in out
    assert pods_on(core, "gpu-01") == []
    assert pods_on(core, "gpu-02") == ["slurmd-gpu-02"]
    assert core.read_node("gpu-01").spec.unschedulable is True


def test_get_pods_in_all_namespaces(kubectl: Kubectl, core: Core) -> None:
    kubectl("create", "namespace", SLURM_NS)  # a protobuf body from kubectl's typed client
    slurmd_pod(core, "slurmd-gpu-01", "gpu-01")
    core.create_namespaced_pod(
        "default",
        {"metadata": {"name": "web"}, "spec": {"nodeName": "gpu-02",
                                               "containers": [{"name": "c", "image": "nginx"}]}},
    )  # fmt: skip
    lines = kubectl("get", "pods", "-A").stdout.splitlines()
    assert lines[0].split()[:3] == ["NAMESPACE", "NAME", "READY"]
    rows = sorted(line.split()[:4] for line in lines[1:])
    assert rows == [["default", "web", "1/1", "Running"], [SLURM_NS, "slurmd-gpu-01", "1/1",
                                                           "Running"]]  # fmt: skip
    as_json = json.loads(kubectl("get", "pods", "-n", SLURM_NS, "-o", "json").stdout)
    assert [p["spec"]["nodeName"] for p in as_json["items"]] == ["gpu-01"]


def _product_crs() -> list[dict[str, Any]]:
    spec, _ = load_cluster_spec(ROOT / "examples" / "clusters" / "sandbox.yaml")
    return [
        controller_body(spec),
        loginset_body(spec),
        *(nodeset_body(spec.name, ns) for ns in spec.node_sets),
    ]


def test_apply_the_products_custom_resources(kubectl: Kubectl, core: Core, tmp_path: Path) -> None:
    core.create_namespace({"metadata": {"name": SLURM_NS}})
    crs = _product_crs()
    manifest = tmp_path / "crs.yaml"
    manifest.write_text(yaml.safe_dump_all(crs))
    created = kubectl("apply", "-n", SLURM_NS, "-f", str(manifest)).stdout
    assert created.count(" created") == len(crs)
    assert kubectl("apply", "-n", SLURM_NS, "-f", str(manifest)).stdout.count(" unchanged") == len(
        crs
    )
    crs[0]["spec"]["extraConf"] = "TopologyPlugin=topology/tree\nSchedulerParameters=x"
    manifest.write_text(yaml.safe_dump_all(crs))
    assert "controller.slinky.slurm.net/" in kubectl("apply", "-n", SLURM_NS, "-f", str(manifest))\
        .stdout  # fmt: skip
    custom: Any = client.CustomObjectsApi(core.api_client)
    name = crs[0]["metadata"]["name"]
    read = custom.get_namespaced_custom_object(
        "slinky.slurm.net", "v1beta1", SLURM_NS, "controllers", name
    )
    assert read["spec"]["extraConf"].endswith("SchedulerParameters=x")
    listed = kubectl("get", "nodesets,controllers,loginsets", "-A", "-o", "name").stdout.split()
    assert sorted(listed) == sorted(
        f"{c['kind'].lower()}.slinky.slurm.net/{c['metadata']['name']}" for c in crs
    )
    assert "nodesets.slinky.slurm.net" in kubectl("get", "crd").stdout


def test_apply_checks_custom_resources_against_the_published_schema(
    kubectl: Kubectl, core: Core, tmp_path: Path
) -> None:
    """kubectl sends fieldValidation=Strict: an unknown field is refused, not pruned; a
    missing required field is the API server's 422 (sandbox/kubernetes/crd_schema.py)."""
    core.create_namespace({"metadata": {"name": SLURM_NS}})
    manifest = tmp_path / "nodeset.yaml"
    nodeset: dict[str, Any] = {
        "apiVersion": "slinky.slurm.net/v1beta1",
        "kind": "NodeSet",
        "metadata": {"name": "gpu"},
        "spec": {"controllerRef": {"name": "alpha"}, "replicaz": 2},
    }
    manifest.write_text(yaml.safe_dump(nodeset))
    done = kubectl("apply", "-n", SLURM_NS, "-f", str(manifest), check=False)
    assert done.returncode != 0 and 'strict decoding error: unknown field "spec.replicaz"' in (
        done.stderr
    )
    del nodeset["spec"]["controllerRef"], nodeset["spec"]["replicaz"]
    manifest.write_text(yaml.safe_dump(nodeset))
    done = kubectl("apply", "-n", SLURM_NS, "-f", str(manifest), check=False)
    assert done.returncode != 0 and "spec.controllerRef: Required value" in done.stderr
    assert "No resources found" in kubectl("get", "nodesets", "-n", SLURM_NS).stderr


def test_patch_flavours(kubectl: Kubectl, core: Core) -> None:
    kubectl("patch", "node", "gpu-01", "-p", '{"metadata":{"labels":{"a":"1"}}}')
    kubectl("patch", "node", "gpu-01", "--type=merge", "-p", '{"metadata":{"labels":{"b":"2"}}}')
    kubectl("patch", "node", "gpu-01", "--type=json",
            "-p", '[{"op":"add","path":"/metadata/labels/c","value":"3"}]')  # fmt: skip
    labels = core.read_node("gpu-01").metadata.labels
    assert (labels["a"], labels["b"], labels["c"]) == ("1", "2", "3")
    kubectl("label", "node", "gpu-01", "a-")
    assert "a" not in core.read_node("gpu-01").metadata.labels


def test_watch_nodes_prints_a_change(kube_env: dict[str, str], core: Core, tmp_path: Path) -> None:
    out = tmp_path / "watch.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            ["kubectl", "get", "nodes", "-w"], env=kube_env, stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        until(lambda: "gpu-02" in out.read_text(), what="the watch's initial list")
        core.patch_node("gpu-02", {"spec": {"unschedulable": True}})
        line = until(
            lambda: next(
                (ln for ln in out.read_text().splitlines() if "SchedulingDisabled" in ln), None
            ),
            what="the watch event of the cordon",
        )
        assert line.split()[0] == "gpu-02"
        assert proc.poll() is None, "the watch ended by itself"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_python_client_watch_gets_events(core: Core) -> None:
    """The store's watch serves the Python client too: ADDED for what exists, then changes."""
    seen: list[tuple[str, str]] = []
    w = watch.Watch()
    for event in w.stream(core.list_node, timeout_seconds=10):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 2:
            core.patch_node("gpu-01", {"metadata": {"labels": {"watched": "yes"}}})
        if event["type"] == "MODIFIED":
            assert event["object"].metadata.labels["watched"] == "yes"
            w.stop()
    assert seen == [("ADDED", "gpu-01"), ("ADDED", "gpu-02"), ("MODIFIED", "gpu-01")]


def test_a_bad_token_is_refused(emu: Running, tmp_path: Path) -> None:
    config = tmp_path / "bad.kubeconfig"
    config.write_text(kubeconfig(emu.url, "not-the-token", emu.ca_pem))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KUBECONFIG": str(config)}
    done = subprocess.run(
        ["kubectl", "get", "nodes"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "You must be logged in to the server" in done.stderr


@pytest.mark.parametrize("path", ["/api", "/api/", "/apis", "/apis/", "/api/v1", "/version",
                                  "/openapi/v3", "/apis/slinky.slurm.net/v1beta1"])  # fmt: skip
def test_discovery_needs_the_token_and_never_redirects(emu: Running, path: str) -> None:
    with httpx.Client(
        base_url=emu.url, follow_redirects=False, timeout=5, verify=emu.verify
    ) as http:
        anonymous = http.get(path)
        assert anonymous.status_code == 401
        assert anonymous.json()["kind"] == "Status" and anonymous.json()["code"] == 401
        ok = http.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200


def test_discovery_lists_what_drain_needs(emu: Running) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    core_v1 = httpx.get(f"{emu.url}/api/v1", headers=headers, verify=emu.verify).json()
    by_name = {r["name"]: r for r in core_v1["resources"]}
    assert by_name["nodes"]["shortNames"] == ["no"] and not by_name["nodes"]["namespaced"]
    assert by_name["pods"]["namespaced"] and "watch" in by_name["pods"]["verbs"]
    eviction = by_name["pods/eviction"]
    assert (eviction["group"], eviction["version"], eviction["kind"]) == ("policy", "v1",
                                                                          "Eviction")  # fmt: skip
    groups = httpx.get(f"{emu.url}/apis", headers=headers, verify=emu.verify).json()["groups"]
    names = {g["name"] for g in groups}
    assert {"apps", "policy", "slinky.slurm.net", "apiextensions.k8s.io"} <= names


def test_the_module_writes_one_kubeconfig_kubectl_and_the_client_use(tmp_path: Path) -> None:
    """`--cert-dir` and `--kubeconfig`: the emulator as a process, as the sandbox runs it, on
    one HTTPS port; kubectl and the Python client both go through the one kubeconfig, and a
    restart keeps the certificate it trusts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config, certs = tmp_path / "kubeconfig", tmp_path / "certs"
    argv = [sys.executable, "-m", "autoclusters.sandbox.kubernetes.emulator", "--port", str(port),
            f"--token={TOKEN}", "--cert-dir", str(certs), "--kubeconfig", str(config)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KUBECONFIG": str(config)}

    def namespaces() -> str:
        if proc.poll() is not None:
            raise AssertionError(f"the emulator exited with {proc.returncode}")
        done = subprocess.run(
            ["kubectl", "get", "ns", "-o", "name"], env=env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        return done.stdout if done.returncode == 0 else ""

    try:
        until(lambda: config.exists() and namespaces(), what="kubectl through the kubeconfig")
        assert "namespace/kube-system" in namespaces().split()
        assert oct(config.stat().st_mode & 0o777) == "0o600"
        api = api_client(kubeconfig=config)
        names = [n.metadata.name for n in client.CoreV1Api(api).list_namespace().items]
        api.close()
        assert "kube-system" in names
        with pytest.raises(httpx.HTTPError):  # no plain-HTTP door any more
            httpx.get(f"http://127.0.0.1:{port}/version", timeout=5).raise_for_status()
        first = (certs / "tls.crt").read_text()
        proc.terminate()
        proc.wait(timeout=10)
        proc = subprocess.Popen(argv, cwd=ROOT)
        until(namespaces, what="kubectl after a restart, through the same kubeconfig")
        assert (certs / "tls.crt").read_text() == first
    finally:
        proc.terminate()
        proc.wait(timeout=10)
