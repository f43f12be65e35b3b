"""apps/v1 Deployments on the Kubernetes emulator, through the official client: the scale
subresource, the Deployment controller (pods, status, scale-down order) and the scheduler
(node selector, taints, cordons, GPUs), as GPU sharing drives them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from autoclusters.core.sharing import (
    INFERENCE_APP,
    INFERENCE_APP_LABEL,
    POD_DELETION_COST,
    POOL_LABEL,
    POOL_TAINT_KEY,
)
from autoclusters.integrations.k8s import api_client
from autoclusters.sandbox.kubernetes.emulator import Running, running

TOKEN = "test-token"
NS, DEPLOY = "inference", "inference"
SELECTOR = f"{INFERENCE_APP_LABEL}={INFERENCE_APP}"
TRAINING_TAINT = {"key": POOL_TAINT_KEY, "value": "training", "effect": "NoSchedule"}


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emu", "cluster": {"server": server}}],
                "users": [{"name": "emu", "user": {"token": TOKEN}}],
                "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
                "current-context": "emu",
            }
        )
    )
    return path


class Cluster:
    def __init__(self, emu: Running, tmp: Path) -> None:
        self.api = api_client(kubeconfig=_kubeconfig(tmp / "kubeconfig", emu.url))
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.admin = httpx.Client(base_url=emu.url, timeout=5)

    def node(self, name: str, pool: str = "training", *, gpus: int = 8) -> None:
        """A machine registering as the sandbox's do: in the training pool, tainted."""
        self.admin.post(
            "/_emulator/nodes",
            json={"name": name, "provider_id": f"crusoe://{name}", "gpus": gpus,
                  "register_labels": {POOL_LABEL: "training"},
                  "register_taints": [TRAINING_TAINT]},
        ).raise_for_status()  # fmt: skip
        if pool == "inference":
            self.lend(name)

    def lend(self, name: str) -> None:
        """What the sharing workflow does to lend a node: relabel, untaint, uncordon."""
        node = self.core.read_node(name)
        taints = [t.to_dict() for t in node.spec.taints or [] if t.key != POOL_TAINT_KEY]
        self.core.patch_node(
            name,
            {"metadata": {"labels": {POOL_LABEL: "inference"}},
             "spec": {"taints": taints or None, "unschedulable": None}},
        )  # fmt: skip

    def deployment(self, replicas: int = 0, gpus: int = 8) -> None:
        self.core.create_namespace({"metadata": {"name": NS}})
        labels = {INFERENCE_APP_LABEL: INFERENCE_APP}
        self.apps.create_namespaced_deployment(
            NS,
            {
                "metadata": {"name": DEPLOY, "labels": labels},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "nodeSelector": {POOL_LABEL: "inference"},
                            "containers": [
                                {
                                    "name": "server",
                                    "image": "autoclusters/inference-standin",
                                    "resources": {
                                        "requests": {"nvidia.com/gpu": str(gpus)},
                                        "limits": {"nvidia.com/gpu": str(gpus)},
                                    },
                                    "readinessProbe": {
                                        "httpGet": {"path": "/healthz", "port": 8000}
                                    },
                                }
                            ],
                        },
                    },
                },
            },
        )

    def scale(self, replicas: int) -> None:
        self.apps.patch_namespaced_deployment_scale(DEPLOY, NS, {"spec": {"replicas": replicas}})

    def pods(self) -> list[client.V1Pod]:
        return self.core.list_namespaced_pod(NS, label_selector=SELECTOR).items

    def placement(self) -> dict[str, str | None]:
        return {p.metadata.name: p.spec.node_name for p in self.pods()}

    def close(self) -> None:
        self.admin.close()
        self.api.close()


@pytest.fixture
def k8s(tmp_path: Path) -> Iterator[Cluster]:
    with running(TOKEN) as emu:
        c = Cluster(emu, tmp_path)
        yield c
        c.close()


def _condition(pod: client.V1Pod, kind: str) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == kind), None)


def test_scale_up_lands_on_a_lent_node_only(k8s: Cluster) -> None:
    k8s.node("gpu-01")  # training: tainted and labelled training
    k8s.node("gpu-02", "inference")
    k8s.node("gpu-03", "inference")
    k8s.core.patch_node("gpu-03", {"spec": {"unschedulable": True}})  # cordoned
    k8s.deployment(replicas=0)
    assert k8s.pods() == []
    k8s.scale(1)
    assert list(k8s.placement().values()) == ["gpu-02"]
    pod = k8s.pods()[0]
    assert pod.metadata.name.startswith(f"{DEPLOY}-")
    assert len(pod.metadata.name.split("-")) == 3  # <deploy>-<hash>-<rand5>
    assert pod.metadata.owner_references[0].kind == "Deployment"
    assert pod.status.phase == "Running" and _condition(pod, "Ready").status == "True"
    scale = k8s.apps.read_namespaced_deployment_scale(DEPLOY, NS)
    assert scale.spec.replicas == 1 and scale.status.replicas == 1
    assert scale.status.selector == SELECTOR
    d = k8s.apps.read_namespaced_deployment(DEPLOY, NS)
    assert d.status.ready_replicas == 1 and d.status.available_replicas == 1
    assert d.status.updated_replicas == 1
    assert d.status.observed_generation == d.metadata.generation
    # A second replica has no node: the training node, the cordoned one, the full one.
    k8s.scale(2)
    pending = [p for p in k8s.pods() if not p.spec.node_name]
    assert len(pending) == 1 and pending[0].status.phase == "Pending"
    cond = _condition(pending[0], "PodScheduled")
    assert cond.status == "False" and cond.reason == "Unschedulable"
    assert "1 node(s) didn't match Pod's node affinity/selector" in cond.message
    assert "unschedulable" in cond.message and "Insufficient nvidia.com/gpu" in cond.message
    d = k8s.apps.read_namespaced_deployment(DEPLOY, NS)
    assert (d.status.replicas, d.status.ready_replicas) == (2, 1)


def test_a_pending_pod_lands_when_a_node_is_lent_or_uncordoned(k8s: Cluster) -> None:
    k8s.node("gpu-01")
    k8s.node("gpu-02")
    k8s.deployment(replicas=1)
    assert list(k8s.placement().values()) == [None]
    k8s.core.patch_node("gpu-02", {"metadata": {"labels": {POOL_LABEL: "inference"}}})
    assert list(k8s.placement().values()) == [None], "still tainted for training"
    message = _condition(k8s.pods()[0], "PodScheduled").message
    assert "1 node(s) had untolerated taint {autoclusters.io/pool: training}" in message
    k8s.core.patch_node("gpu-02", {"spec": {"unschedulable": True}})
    k8s.lend("gpu-02")  # the taint goes, and the cordon with it
    assert list(k8s.placement().values()) == ["gpu-02"]
    assert _condition(k8s.pods()[0], "PodScheduled").status == "True"


def test_pod_deletion_cost_picks_the_pod_a_scale_down_removes(k8s: Cluster) -> None:
    for name in ("gpu-01", "gpu-02", "gpu-03"):
        k8s.node(name, "inference")
    k8s.deployment(replicas=0)
    born: list[str] = []  # pod names, oldest first
    for n in (1, 2, 3):
        k8s.scale(n)
        born += [p for p in k8s.placement() if p not in born]
    assert len(born) == 3 and all(k8s.placement().values())
    # The oldest pod, which a plain scale-down keeps: its cost makes it go first.
    k8s.core.patch_namespaced_pod(
        born[0], NS, {"metadata": {"annotations": {POD_DELETION_COST: "-1000"}}}
    )
    k8s.scale(2)
    assert sorted(k8s.placement()) == sorted(born[1:])
    k8s.scale(1)  # without a cost, the newest goes
    assert list(k8s.placement()) == [born[1]]


def test_one_gpu_pod_per_node(k8s: Cluster) -> None:
    k8s.node("gpu-01", "inference")
    k8s.deployment(replicas=2)
    assert sorted(k8s.placement().values(), key=str) == [None, "gpu-01"]
    k8s.node("gpu-02", "inference")
    assert sorted(k8s.placement().values(), key=str) == ["gpu-01", "gpu-02"]
    k8s.scale(3)  # a third pod finds no node with 8 GPUs free
    assert sorted(k8s.placement().values(), key=str) == [None, "gpu-01", "gpu-02"]


def test_deleted_pods_are_replaced_and_a_deleted_deployment_takes_its_pods(
    k8s: Cluster,
) -> None:
    k8s.node("gpu-01", "inference")
    k8s.deployment(replicas=1)
    (first,) = k8s.placement()
    k8s.core.delete_namespaced_pod(first, NS)
    (second,) = k8s.placement()
    assert second != first
    k8s.apps.delete_namespaced_deployment(DEPLOY, NS)
    assert k8s.pods() == []


def test_scale_is_validated_and_conflicts_on_a_stale_version(k8s: Cluster) -> None:
    k8s.deployment(replicas=0)
    scale = k8s.apps.read_namespaced_deployment_scale(DEPLOY, NS)
    k8s.scale(1)
    scale.spec.replicas = 3
    with pytest.raises(ApiException) as stale:
        k8s.apps.replace_namespaced_deployment_scale(DEPLOY, NS, scale)
    assert stale.value.status == 409
    with pytest.raises(ApiException) as negative:
        k8s.scale(-1)
    assert negative.value.status == 422
    fresh = k8s.apps.read_namespaced_deployment_scale(DEPLOY, NS)
    fresh.spec.replicas = 0
    assert k8s.apps.replace_namespaced_deployment_scale(DEPLOY, NS, fresh).spec.replicas == 0
    assert k8s.apps.read_namespaced_deployment(DEPLOY, NS).spec.replicas == 0


def test_an_external_kubelet_starts_pods_and_finishes_their_deletion(tmp_path: Path) -> None:
    with running(TOKEN, external_kubelet=SELECTOR) as emu:
        k8s = Cluster(emu, tmp_path)
        k8s.node("gpu-01", "inference")
        k8s.deployment(replicas=1)
        (pod,) = k8s.pods()
        name = pod.metadata.name
        assert pod.spec.node_name == "gpu-01" and pod.status.phase == "Pending"
        k8s.admin.post(f"/_emulator/pods/{NS}/{name}/ready", json={"ready": True})
        (pod,) = k8s.pods()
        assert pod.status.phase == "Running" and _condition(pod, "Ready").status == "True"
        assert k8s.apps.read_namespaced_deployment(DEPLOY, NS).status.ready_replicas == 1
        # Its node goes NotReady: the pod is not Ready, whatever that kubelet says meanwhile.
        k8s.admin.post("/_emulator/nodes/gpu-01/ready", json={"ready": False})
        k8s.admin.post(f"/_emulator/pods/{NS}/{name}/ready", json={"ready": True})
        assert _condition(k8s.pods()[0], "Ready").status == "False"
        k8s.admin.post("/_emulator/nodes/gpu-01/ready", json={"ready": True})
        k8s.admin.post(f"/_emulator/pods/{NS}/{name}/ready", json={"ready": True})
        assert _condition(k8s.pods()[0], "Ready").status == "True"
        k8s.scale(0)
        (pod,) = k8s.pods()  # Terminating until its kubelet says its process is gone
        assert pod.metadata.deletion_timestamp is not None
        status = k8s.apps.read_namespaced_deployment(DEPLOY, NS).status
        assert not status.replicas and not status.ready_replicas
        r = k8s.admin.post(f"/_emulator/pods/{NS}/{name}/terminated")
        r.raise_for_status()
        assert k8s.pods() == []
        k8s.close()


def test_a_reboot_keeps_the_pool_a_new_machine_starts_in_training(k8s: Cluster) -> None:
    k8s.node("gpu-01", "inference")
    k8s.node("gpu-01")  # the same machine boots again: its kubelet registers again
    node = k8s.core.read_node("gpu-01")
    assert node.metadata.labels[POOL_LABEL] == "inference"
    assert not [t for t in node.spec.taints or [] if t.key == POOL_TAINT_KEY]
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    k8s.admin.post(
        "/_emulator/nodes",
        json={"name": "gpu-01", "provider_id": "crusoe://replacement", "gpus": 4,
              "register_labels": {POOL_LABEL: "training"},
              "register_taints": [TRAINING_TAINT]},
    ).raise_for_status()  # fmt: skip
    node = k8s.core.read_node("gpu-01")
    assert node.metadata.labels[POOL_LABEL] == "training"
    assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [
        (POOL_TAINT_KEY, "training", "NoSchedule")
    ]
    assert node.status.allocatable["nvidia.com/gpu"] == "4"
