"""The emulated Slinky NodeSet controller (sandbox/slinky/operator.py) against the in-process
Kubernetes emulator (a thread) and the in-memory Slurm:

- each GPU Node gets one slurmd pod the NodeSet controls, and a second pass adds none;
- a pod whose Node is gone goes, and its Slurm node is DOWN with the preStop hook's reason
  (also when the API server removed the pod with its Node);
- a cordon drains with the Node's reason annotation (else the default text) and annotates
  the pod; an uncordon undrains; a drain that is not the operator's is never touched;
- lowering replicas drains the node and keeps its pod while a job runs, deletes it after;
- while Slurm cannot be read nothing is drained, marked or deleted (only missing pods are
  created) and the pass says "unknown"; what was owed is done once Slurm answers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client

from autoclusters.integrations.k8s import api_client
from autoclusters.sandbox.kubernetes.emulator import Running, running
from autoclusters.sandbox.slinky.operator import SlinkyOperator
from autoclusters.sandbox.slinky.operator_pods import NODE_CORDON_REASON, POD_CORDON, POD_HOSTNAME
from autoclusters.sandbox.slinky.operator_slurm import TERMINATING_REASON
from tests.fakes.systems import FakeSlurm

TOKEN = "test-token"
NS = "slurm"
NODESET = ("slinky.slurm.net", "v1beta1", NS, "nodesets")
AUTOCLUSTERS_REASON = "autoclusters: INC-1 XID_79"


class OperatorFakeSlurm(FakeSlurm):
    """FakeSlurm with the preStop hook's write (`scontrol update state=down reason=...`)."""

    async def mark_down(self, node: str, reason: str) -> None:
        self._reachable("mark_down")
        self.calls["mark_down"] += 1
        n = self._node(node)
        n.state, n.reason = "down", reason
        self.record("down", node)


@pytest.fixture
def emulator() -> Iterator[Running]:
    with running(TOKEN) as emu:
        yield emu


@pytest.fixture
def api(emulator: Running, tmp_path: Path) -> Iterator[client.ApiClient]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emu", "cluster": {"server": emulator.url}}],
                "users": [{"name": "emu", "user": {"token": TOKEN}}],
                "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
                "current-context": "emu",
            }
        )
    )
    c = api_client(kubeconfig=kubeconfig)
    yield c
    c.close()


@pytest.fixture
def admin(emulator: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=emulator.url, timeout=5) as c:
        yield c


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def nodeset(api: client.ApiClient, core: client.CoreV1Api) -> dict[str, Any]:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    body = {
        "apiVersion": "slinky.slurm.net/v1beta1",
        "kind": "NodeSet",
        "metadata": {"name": "gpu"},
        # controllerRef: required by the published schema, which the emulator checks.
        "spec": {"controllerRef": {"name": "slurm"}, "scalingMode": "DaemonSet"},
    }
    created = client.CustomObjectsApi(api).create_namespaced_custom_object(*NODESET, body)
    assert isinstance(created, dict)
    return created


@pytest.fixture
def slurm() -> OperatorFakeSlurm:
    s = OperatorFakeSlurm()
    for n in ("gpu-01", "gpu-02", "gpu-03"):
        s.add_node(n)
    return s


@pytest.fixture
def operator(api: client.ApiClient, slurm: OperatorFakeSlurm) -> SlinkyOperator:
    return SlinkyOperator(api, slurm)


def machine(admin: httpx.Client, name: str, *, gpu: bool = True) -> None:
    labels = {"crusoe.ai/instance.id": f"vm-{name}"}
    if gpu:
        labels["nvidia.com/gpu.present"] = "true"
    admin.post(
        "/_emulator/nodes",
        json={"name": name, "provider_id": f"crusoe://vm-{name}", "boot_id": "b", "ready": True,
              "labels": labels},
    ).raise_for_status()  # fmt: skip


def slurmd_pods(core: client.CoreV1Api) -> dict[str, dict[str, Any]]:
    """The slurmd pods by their Node, as the API's JSON."""
    raw: Any = core.list_namespaced_pod(NS, _preload_content=False)  # the HTTP response
    doc = json.loads(raw.data)
    return {p["spec"]["nodeName"]: p for p in doc["items"]}


def cordon(core: client.CoreV1Api, node: str, on: bool = True, why: str | None = None) -> None:
    patch: dict[str, Any] = {"spec": {"unschedulable": on}}
    if why is not None:
        patch["metadata"] = {"annotations": {NODE_CORDON_REASON: why}}
    core.patch_node(node, patch)


def pod_cordoned(core: client.CoreV1Api, node: str) -> bool:
    annotations = slurmd_pods(core)[node]["metadata"].get("annotations") or {}
    return annotations.get(POD_CORDON) == "true"


async def test_each_gpu_node_gets_one_pod_owned_by_the_nodeset(
    core: client.CoreV1Api,
    admin: httpx.Client,
    nodeset: dict[str, Any],
    operator: SlinkyOperator,
) -> None:
    machine(admin, "gpu-01")
    machine(admin, "gpu-02")
    machine(admin, "cpu-01", gpu=False)

    report = await operator.reconcile_once()

    assert sorted(report.created) == ["slurm/slurmd-gpu-01", "slurm/slurmd-gpu-02"]
    got = slurmd_pods(core)
    assert sorted(got) == ["gpu-01", "gpu-02"]  # no pod on the CPU node
    for node, pod in got.items():
        assert pod["metadata"]["name"] == f"slurmd-{node}"
        assert pod["metadata"]["labels"][POD_HOSTNAME] == node
        [owner] = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "NodeSet", "gpu", nodeset["metadata"]["uid"], True,
        )  # fmt: skip

    again = await operator.reconcile_once()
    assert again.created == [] and again.deleted == []
    assert len(slurmd_pods(core)) == 2


async def test_a_gone_nodes_pod_is_deleted_and_its_slurm_node_down(
    core: client.CoreV1Api,
    admin: httpx.Client,
    nodeset: dict[str, Any],
    operator: SlinkyOperator,
    slurm: OperatorFakeSlurm,
) -> None:
    machine(admin, "gpu-01")
    machine(admin, "gpu-02")
    await operator.reconcile_once()
    # A pod left behind on a Node that no longer exists (before the pod GC removes it).
    orphan: dict[str, Any] = {
        "metadata": {
            "name": "slurmd-gpu-03",
            "labels": {POD_HOSTNAME: "gpu-03"},
            "ownerReferences": [
                {"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet", "name": "gpu",
                 "uid": nodeset["metadata"]["uid"], "controller": True}
            ],
        },
        "spec": {"nodeName": "gpu-03", "containers": [{"name": "slurmd", "image": "x"}]},
    }  # fmt: skip
    core.create_namespaced_pod(NS, orphan)  # type: ignore[arg-type]  # sent as it is
    # The machine gpu-02 is deleted: the API server takes its pod with it.
    admin.delete("/_emulator/nodes/gpu-02").raise_for_status()

    report = await operator.reconcile_once()

    assert sorted(report.downed) == ["gpu-02", "gpu-03"]
    assert report.deleted == ["slurm/slurmd-gpu-03"]
    assert sorted(slurmd_pods(core)) == ["gpu-01"]
    for gone in ("gpu-02", "gpu-03"):
        node = slurm.node_now(gone)
        assert (node.state, node.reason) == ("down", TERMINATING_REASON)
    assert slurm.node_now("gpu-01").state == "idle"
    # Once is enough: the next pass marks nothing again.
    assert (await operator.reconcile_once()).downed == []
    assert slurm.calls["mark_down"] == 2


async def test_cordon_drains_with_the_nodes_reason_and_uncordon_undrains(
    core: client.CoreV1Api,
    admin: httpx.Client,
    nodeset: dict[str, Any],
    operator: SlinkyOperator,
    slurm: OperatorFakeSlurm,
) -> None:
    machine(admin, "gpu-01")
    machine(admin, "gpu-02")
    await operator.reconcile_once()
    cordon(core, "gpu-01", why="health-check: XID 79")
    cordon(core, "gpu-02")

    report = await operator.reconcile_once()

    assert sorted(report.drained) == ["gpu-01", "gpu-02"]
    assert slurm.node_now("gpu-01").reason == "slurm-operator: health-check: XID 79"
    assert slurm.node_now("gpu-02").reason == (
        "slurm-operator: Node (gpu-02) was cordoned, Pod (slurm/slurmd-gpu-02) must be cordoned"
    )
    assert all(slurm.node_now(n).drained for n in ("gpu-01", "gpu-02"))
    assert pod_cordoned(core, "gpu-01") and pod_cordoned(core, "gpu-02")
    assert (await operator.reconcile_once()).drained == []  # already drained: no new write
    assert slurm.calls["drain"] == 2

    cordon(core, "gpu-01", on=False)
    report = await operator.reconcile_once()

    assert report.undrained == ["gpu-01"]
    assert not slurm.node_now("gpu-01").drained and slurm.node_now("gpu-01").reason == ""
    assert not pod_cordoned(core, "gpu-01")
    assert slurm.node_now("gpu-02").drained and pod_cordoned(core, "gpu-02")


async def test_a_drain_that_is_not_the_operators_is_left_alone(
    core: client.CoreV1Api,
    admin: httpx.Client,
    nodeset: dict[str, Any],
    operator: SlinkyOperator,
    slurm: OperatorFakeSlurm,
) -> None:
    machine(admin, "gpu-01")
    machine(admin, "gpu-02")
    await operator.reconcile_once()
    await slurm.drain("gpu-01", AUTOCLUSTERS_REASON)
    # gpu-02's slurmd stopped answering: Slurm set it DOWN itself.
    slurm.add_node("gpu-02", state="down", state_flags=["NOT_RESPONDING"], reason="Not responding")

    cordon(core, "gpu-01", why="health-check: XID 79")
    cordon(core, "gpu-02")
    first = await operator.reconcile_once()
    cordon(core, "gpu-01", on=False)
    second = await operator.reconcile_once()

    for report in (first, second):
        assert report.drained == [] and report.undrained == [] and report.cordoned == []
    node = slurm.node_now("gpu-01")
    assert node.drained and node.reason == AUTOCLUSTERS_REASON
    assert slurm.node_now("gpu-02").reason == "Not responding"
    assert slurm.calls["resume"] == 0 and slurm.calls["drain"] == 1  # the test's own drain
    assert not pod_cordoned(core, "gpu-01") and not pod_cordoned(core, "gpu-02")


async def test_scale_in_keeps_a_busy_nodes_pod_until_it_is_idle(
    api: client.ApiClient,
    core: client.CoreV1Api,
    admin: httpx.Client,
    nodeset: dict[str, Any],
    operator: SlinkyOperator,
    slurm: OperatorFakeSlurm,
) -> None:
    machine(admin, "gpu-01")
    machine(admin, "gpu-02")
    await operator.reconcile_once()
    slurm.add_job(7, nodes="gpu-02")
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        *NODESET, "gpu", {"spec": {"replicas": 1}}
    )

    report = await operator.reconcile_once()

    assert report.drained == ["gpu-02"] and report.waiting == ["slurm/slurmd-gpu-02"]
    assert report.deleted == []
    node = slurm.node_now("gpu-02")
    assert node.drained and node.state == "allocated"
    assert node.reason == (
        "slurm-operator: Pod (slurm/slurmd-gpu-02) is pending termination for scale-in"
    )
    assert sorted(slurmd_pods(core)) == ["gpu-01", "gpu-02"] and pod_cordoned(core, "gpu-02")
    assert (await operator.reconcile_once()).deleted == []  # still busy

    slurm.finish_job(7)
    report = await operator.reconcile_once()

    assert report.deleted == ["slurm/slurmd-gpu-02"] and report.downed == ["gpu-02"]
    assert sorted(slurmd_pods(core)) == ["gpu-01"]
    assert slurm.node_now("gpu-02").state == "down"
    assert not slurm.node_now("gpu-01").drained  # the kept node is untouched
    again = await operator.reconcile_once()
    assert again.created == [] and again.downed == []  # replicas=1: no pod comes back


async def test_slurm_unknown_changes_nothing_and_says_so(
    core: client.CoreV1Api,
    admin: httpx.Client,
    nodeset: dict[str, Any],
    operator: SlinkyOperator,
    slurm: OperatorFakeSlurm,
) -> None:
    machine(admin, "gpu-01")
    machine(admin, "gpu-02")
    await operator.reconcile_once()
    slurm.down = True
    cordon(core, "gpu-01")
    admin.delete("/_emulator/nodes/gpu-02").raise_for_status()
    machine(admin, "gpu-03")

    report = await operator.reconcile_once()

    assert report.slurm == "unknown" and "Unable to contact" in report.slurm_error
    assert dict(slurm.calls_while_down) == {"nodes": 1}  # the read, and no write at all
    assert report.created == ["slurm/slurmd-gpu-03"]  # a new pod never asks Slurm
    assert report.drained == report.downed == report.deleted == report.cordoned == []
    assert not pod_cordoned(core, "gpu-01")
    assert slurm.node_now("gpu-02").state == "idle" and not slurm.node_now("gpu-01").drained

    slurm.down = False
    report = await operator.reconcile_once()

    assert report.slurm == "ok"
    assert report.drained == ["gpu-01"] and pod_cordoned(core, "gpu-01")
    assert report.downed == ["gpu-02"]  # owed since gpu-02 went with its pod
    assert slurm.node_now("gpu-02").reason == TERMINATING_REASON
