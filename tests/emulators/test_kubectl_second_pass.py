"""A real `kubectl` against the Kubernetes API emulator, second pass (issue 41):

- `kubectl get events -A` and `kubectl describe node` list the Events the runbook's cordon
  and condition leave on the Node (integrations/k8s_events.py);
- `kubectl scale nodeset` goes through the NodeSet's scale subresource (Slinky's CRD declares
  one: sandbox/kubernetes/scale.py), a bad replica count is refused, and the emulated operator
  follows the count within the NodeSet's Nodes (drains and removes a slurmd pod, brings it
  back);
- `kubectl auth can-i` asks a SelfSubjectAccessReview (protobuf) and is answered for the
  emulator's one token, its admin's;
- `kubectl get --raw /openapi/v2` is a Swagger 2.0 document whose references resolve.

Integration lane: the tests run kubectl processes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.kubernetes import KubernetesActivities
from autoclusters.core.kubernetes import CordonNodeInput, SetNodeConditionInput
from autoclusters.sandbox.kubernetes.emulator import Running
from autoclusters.sandbox.kubernetes.tls import kubeconfig
from autoclusters.sandbox.slinky.operator import SlinkyOperator
from tests.emulators.test_kubectl import (  # noqa: F401  (core, emu, kube_env, kubectl: its fixtures)
    SLURM_NS,
    TOKEN,
    Core,
    Kubectl,
    core,
    emu,
    kube_env,
    kubectl,
)
from tests.emulators.test_slinky_operator import OperatorFakeSlurm

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
]


async def test_get_events_lists_the_runbooks_cordon_and_condition(
    kubectl: Kubectl,  # noqa: F811
    core: Core,  # noqa: F811
) -> None:
    acts = KubernetesActivities(core.api_client, request_timeout_s=5)
    env = ActivityEnvironment()
    cordon = CordonNodeInput(node="gpu-01", incident_id="INC-7", phase="quarantine",
                             reason="XID_79 on GPU 3")  # fmt: skip
    await env.run(acts.cordon_node, cordon)
    sick = SetNodeConditionInput(node="gpu-01", unhealthy=True, reason="Xid79", message="XID 79")
    await env.run(acts.set_node_condition, sick)

    lines = kubectl("get", "events", "-A").stdout.splitlines()
    assert lines[0].split()[:6] == ["NAMESPACE", "LAST", "SEEN", "TYPE", "REASON", "OBJECT"]
    rows = [line.split(None, 5) for line in lines[1:]]
    got = sorted((r[0], r[2], r[3], r[4]) for r in rows)
    assert got == [
        ("default", "Warning", "Cordoned", "node/gpu-01"),
        ("default", "Warning", "Xid79", "node/gpu-01"),
    ]
    assert any("INC-7" in r[5] for r in rows)
    # describe finds them by the Node's uid, as it does the kubelet's.
    described = kubectl("describe", "node", "gpu-01").stdout
    events = described[described.index("Events:") :]
    assert re.search(r"Warning\s+Cordoned\s+\S+\s+autoclusters\s+incident INC-7", events)
    assert re.search(r"Warning\s+Xid79\s+\S+\s+autoclusters\s+GpuUnhealthy=True: XID 79", events)
    assert "gpu-01" not in kubectl("describe", "node", "gpu-02").stdout.split("Events:")[1]


def _nodeset(api: Core) -> None:
    api.create_namespace({"metadata": {"name": SLURM_NS}})
    custom: Any = client.CustomObjectsApi(api.api_client)
    custom.create_namespaced_custom_object(
        "slinky.slurm.net", "v1beta1", SLURM_NS, "nodesets",
        {"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
         "metadata": {"name": "gpu"}, "spec": {"controllerRef": {"name": "c"}, "replicas": 2}},
    )  # fmt: skip


def test_scale_nodeset_goes_through_its_scale_subresource(
    kubectl: Kubectl,  # noqa: F811
    core: Core,  # noqa: F811
) -> None:
    _nodeset(core)
    assert (
        "nodeset.slinky.slurm.net/gpu scaled"
        in kubectl("scale", "nodeset", "gpu", "-n", SLURM_NS, "--replicas=5").stdout
    )
    custom: Any = client.CustomObjectsApi(core.api_client)
    got = custom.get_namespaced_custom_object("slinky.slurm.net", "v1beta1", SLURM_NS,
                                              "nodesets", "gpu")  # fmt: skip
    assert got["spec"]["replicas"] == 5
    path = f"/apis/slinky.slurm.net/v1beta1/namespaces/{SLURM_NS}/nodesets/gpu/scale"
    scale = json.loads(kubectl("get", "--raw", path).stdout)
    assert (scale["kind"], scale["apiVersion"]) == ("Scale", "autoscaling/v1")
    assert scale["spec"]["replicas"] == 5
    # With a precondition kubectl reads the Scale first and updates it (PUT).
    kubectl("scale", "nodeset", "gpu", "-n", SLURM_NS, "--current-replicas=5", "--replicas=3")
    got = custom.get_namespaced_custom_object("slinky.slurm.net", "v1beta1", SLURM_NS,
                                              "nodesets", "gpu")  # fmt: skip
    assert got["spec"]["replicas"] == 3
    refused = kubectl("scale", "nodeset", "gpu", "-n", SLURM_NS, "--replicas=-1", check=False)
    assert refused.returncode != 0
    crd = json.loads(kubectl("get", "crd", "nodesets.slinky.slurm.net", "-o", "json").stdout)
    assert crd["spec"]["versions"][0]["subresources"]["scale"]["specReplicasPath"] == (
        ".spec.replicas"
    )


async def test_the_operator_acts_on_kubectl_scale(
    kubectl: Kubectl,  # noqa: F811
    core: Core,  # noqa: F811
) -> None:
    """The emulated Slinky operator follows the replicas `kubectl scale` writes: scaled in,
    a Slurm node is drained and its slurmd pod goes; scaled out again, the pod is back."""
    kubectl("label", "node", "gpu-01", "gpu-02", "nvidia.com/gpu.present=true")
    slurm = OperatorFakeSlurm()
    for name in ("gpu-01", "gpu-02"):
        slurm.add_node(name)
    operator = SlinkyOperator(core.api_client, slurm)
    core.create_namespace({"metadata": {"name": SLURM_NS}})
    custom: Any = client.CustomObjectsApi(core.api_client)
    custom.create_namespaced_custom_object(
        "slinky.slurm.net", "v1beta1", SLURM_NS, "nodesets",
        {"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet", "metadata": {"name": "gpu"},
         "spec": {"controllerRef": {"name": "c"}, "scalingMode": "DaemonSet"}},
    )  # fmt: skip

    def pods() -> list[str]:
        return kubectl("get", "pods", "-n", SLURM_NS, "-o", "name").stdout.split()

    await operator.reconcile_once()
    assert pods() == ["pod/slurmd-gpu-01", "pod/slurmd-gpu-02"]
    kubectl("scale", "nodeset", "gpu", "-n", SLURM_NS, "--replicas=1")
    report = await operator.reconcile_once()
    assert report.drained == ["gpu-02"] and report.deleted == [f"{SLURM_NS}/slurmd-gpu-02"]
    assert pods() == ["pod/slurmd-gpu-01"]
    assert slurm.node_now("gpu-02").reason.startswith("slurm-operator:")
    kubectl("scale", "nodeset", "gpu", "-n", SLURM_NS, "--replicas=2")
    report = await operator.reconcile_once()
    assert report.created == [f"{SLURM_NS}/slurmd-gpu-02"]
    assert pods() == ["pod/slurmd-gpu-01", "pod/slurmd-gpu-02"]


def test_auth_can_i_answers_for_the_admins_token(
    kubectl: Kubectl,  # noqa: F811
    emu: Running,  # noqa: F811
    tmp_path: Path,
) -> None:
    assert kubectl("auth", "can-i", "get", "nodes").stdout.strip() == "yes"
    assert kubectl("auth", "can-i", "delete", "pods", "-n", SLURM_NS).stdout.strip() == "yes"
    assert kubectl("auth", "can-i", "get", "/healthz").stdout.strip() == "yes"
    bad = tmp_path / "bad.kubeconfig"
    bad.write_text(kubeconfig(emu.url, "not-the-token", emu.ca_pem))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KUBECONFIG": str(bad)}
    done = subprocess.run(["kubectl", "auth", "can-i", "get", "nodes"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and "yes" not in done.stdout


def test_an_access_review_without_attributes_is_refused(emu: Running) -> None:  # noqa: F811
    r = httpx.post(
        f"{emu.url}/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        json={"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {}},
        headers={"Authorization": f"Bearer {TOKEN}"},
        verify=emu.verify,
    )  # fmt: skip
    assert r.status_code == 422 and r.json()["details"]["causes"][0]["field"] == (
        "spec.resourceAttributes"
    )


def _refs(x: Any) -> list[str]:
    if isinstance(x, dict):
        own = [x["$ref"]] if isinstance(x.get("$ref"), str) else []
        return own + [r for v in x.values() for r in _refs(v)]
    if isinstance(x, list):
        return [r for v in x for r in _refs(v)]
    return []


def test_openapi_v2_is_a_swagger_document(
    kubectl: Kubectl,  # noqa: F811
    emu: Running,  # noqa: F811
) -> None:
    doc = json.loads(kubectl("get", "--raw", "/openapi/v2").stdout)
    assert doc["swagger"] == "2.0" and doc["info"]["title"] == "Kubernetes"
    for ref in _refs(doc):
        assert ref.startswith("#/definitions/") and ref.split("/")[-1] in doc["definitions"], ref
    operation_ids = []
    for path, item in doc["paths"].items():
        declared = {p["name"] for p in item.get("parameters", []) if p["in"] == "path"}
        assert declared == set(re.findall(r"{(\w+)}", path)), path
        for verb, op in item.items():
            if verb != "parameters":
                assert op["responses"]["200"]["description"] and op["x-kubernetes-action"]
                operation_ids.append(op["operationId"])
    assert len(operation_ids) == len(set(operation_ids))
    assert "/api/v1/nodes/{name}" in doc["paths"] and "/api/v1/events" in doc["paths"]
    assert "/apis/slinky.slurm.net/v1beta1/namespaces/{namespace}/nodesets" in doc["paths"]
    node = doc["definitions"]["io.k8s.api.core.v1.Node"]
    assert node["x-kubernetes-group-version-kind"] == [{"group": "", "version": "v1",
                                                         "kind": "Node"}]  # fmt: skip
    # client-go's discovery asks for protobuf only: refused, so kubectl keeps its built-in
    # types (as when there was no v2), rather than parsing JSON as protobuf.
    protobuf = httpx.get(
        f"{emu.url}/openapi/v2",
        headers={"Authorization": f"Bearer {TOKEN}",
                 "Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"},
        verify=emu.verify,
    )  # fmt: skip
    assert protobuf.status_code == 406
