"""Kubernetes activities with the real `kubernetes` client, against the loopback emulator:

- the runbook path: cordon → evict (a PDB refuses with 429 until the test adds capacity) →
  the machine is replaced (new providerID and bootID) → wait for the new node → uncordon;
- a reboot keeps the Node and its cordon until uncordon;
- cordon and uncordon are idempotent; a cordon that is not ours is left alone; our taint is
  replaced, never duplicated, and others' taints stay;
- DaemonSet, mirror and (by default) slurmd pods are skipped; the slurmd pod is found;
- after the timeout: force-delete when asked, else EvictionBlocked; a NotReady node's pods
  stay Terminating until forced;
- the GpuUnhealthy condition is set and cleared, merged by type;
- errors: UnknownNode is final; a 409 is re-read, then left to Temporal's retries, as are
  5xx; a wait rides out 5xx;
- the API server's answers: 401 for a bad token, 409 for a stale resourceVersion, selectors,
  the patch flavours; the emulator's state file and entry point.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from kubernetes.client import ApiException
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.kubernetes import KubernetesActivities
from autoclusters.core.kubernetes import (
    CORDON_REASON_ANNOTATION,
    GPU_UNHEALTHY,
    INCIDENT_ANNOTATION,
    PHASE_LABEL,
    TAINT_KEY,
    CordonNodeInput,
    EvictPodsInput,
    FindSlurmdPodInput,
    NodeIdentityInput,
    SetNodeConditionInput,
    UncordonNodeInput,
    WaitNewNodeInput,
)
from autoclusters.integrations.k8s import api_client
from autoclusters.sandbox.kubernetes.emulator import THREAD_NAME, Running, running
from autoclusters.sandbox.kubernetes.objects import NODES
from tests.helpers import eventually

TOKEN = "test-token"
NODE = "gpu-01"
REASON = "autoclusters: INC-1 XID_79"


@pytest.fixture
def emulator() -> Iterator[Running]:
    with running(TOKEN) as emu:
        yield emu
    assert not [t for t in threading.enumerate() if t.name == THREAD_NAME], "emulator left running"


def write_kubeconfig(path: Path, server: str, token: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emu", "cluster": {"server": server}}],
                "users": [{"name": "emu", "user": {"token": token}}],
                "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
                "current-context": "emu",
            }
        )
    )
    return path


@pytest.fixture
def api(emulator: Running, tmp_path: Path) -> Iterator[client.ApiClient]:
    c = api_client(kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", emulator.url, TOKEN))
    yield c
    c.close()


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def acts(api: client.ApiClient) -> KubernetesActivities:
    return KubernetesActivities(api, request_timeout_s=5)


@pytest.fixture
def admin(emulator: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=emulator.url, timeout=5) as c:
        yield c


def machine(admin: httpx.Client, name: str, vm: str, boot: str, *, ready: bool = True) -> None:
    admin.post(
        "/_emulator/nodes",
        json={"name": name, "provider_id": f"crusoe://{vm}", "boot_id": boot, "ready": ready,
              "labels": {"crusoe.ai/instance.id": vm}},
    ).raise_for_status()  # fmt: skip


def pod(core: client.CoreV1Api, ns: str, name: str, node: str, **meta: Any) -> client.V1Pod:
    body = {
        "metadata": {"name": name, **meta},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
    }
    return core.create_namespaced_pod(ns, body)


def pod_names(core: client.CoreV1Api, node: str) -> list[str]:
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    return sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in pods)


def taints(core: client.CoreV1Api, node: str = NODE) -> list[tuple[str, str | None, str]]:
    return sorted((t.key, t.value, t.effect) for t in core.read_node(node).spec.taints or [])


def cordon(phase: str = "quarantine", incident: str = "INC-1") -> CordonNodeInput:
    return CordonNodeInput(node=NODE, incident_id=incident, phase=phase, reason=REASON)


def pdb(name: str, app: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"selector": {"matchLabels": {"app": app}}, **spec}}


async def test_cordon_evict_replace_wait_uncordon(
    core: client.CoreV1Api, acts: KubernetesActivities, admin: httpx.Client, api: client.ApiClient
) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    machine(admin, "gpu-02", "vm-9", "boot-9")
    core.create_namespace({"metadata": {"name": "train"}})
    pod(core, "train", "web-0", NODE, labels={"app": "web"})
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget("train", pdb("web", "web", minAvailable=1))
    env, beats = ActivityEnvironment(), []
    env.on_heartbeat = lambda *d: beats.append(d)

    before = await env.run(acts.node_identity, NodeIdentityInput(node=NODE))
    assert (before.provider_id, before.boot_id, before.instance_id) == (
        "crusoe://vm-1",
        "boot-1",
        "vm-1",
    )
    assert before.ready and not before.unschedulable

    done = await env.run(acts.cordon_node, cordon())
    assert done.cordoned and done.changed and not done.foreign
    node = core.read_node(NODE)
    assert node.spec.unschedulable
    assert node.metadata.labels[PHASE_LABEL] == "quarantine"
    assert node.metadata.annotations[INCIDENT_ANNOTATION] == "INC-1"
    assert node.metadata.annotations[CORDON_REASON_ANNOTATION] == REASON
    assert (TAINT_KEY, "quarantine", "NoSchedule") in taints(core)

    inp = EvictPodsInput(node=NODE, timeout_s=30, poll_s=0.05, max_backoff_s=0.2)
    evicting = asyncio.create_task(env.run(acts.evict_pods, inp))

    async def refused() -> bool:
        # Beats with details (a dict) say what blocks; the plain ones only keep it alive.
        return any(
            "train/web-0" in (d[0].get("blocked") or {}) for d in beats if isinstance(d[0], dict)
        )

    await eventually(refused, what="the PDB to refuse the eviction")
    assert not evicting.done() and pod_names(core, NODE) == ["train/web-0"]
    pod(core, "train", "web-1", "gpu-02", labels={"app": "web"})  # capacity elsewhere
    evicted = await evicting
    assert evicted.evicted == ["train/web-0"] and not evicted.forced
    assert pod_names(core, NODE) == []

    waiting = asyncio.create_task(
        env.run(acts.wait_new_node_ready, WaitNewNodeInput(
            node=NODE, old_provider_id=before.provider_id, old_boot_id=before.boot_id, poll_s=0.05,
        ))
    )  # fmt: skip
    admin.delete(f"/_emulator/nodes/{NODE}").raise_for_status()  # the old VM is gone
    machine(admin, NODE, "vm-2", "boot-2", ready=False)
    await eventually(lambda: _beat_says(beats, "vm-2"), what="the new node, not yet Ready")
    assert not waiting.done()
    admin.post(f"/_emulator/nodes/{NODE}/ready", json={"ready": True}).raise_for_status()
    after = await waiting
    assert (after.provider_id, after.boot_id, after.instance_id) == (
        "crusoe://vm-2",
        "boot-2",
        "vm-2",
    )
    assert after.uid != before.uid and after.ready

    # A new machine registers a new Node: the old cordon went with the old Node.
    back = await env.run(acts.uncordon_node, UncordonNodeInput(node=NODE, incident_id="INC-1"))
    assert back.uncordoned and not back.changed and back.detail == "not cordoned"


async def _beat_says(beats: list[Any], text: str) -> bool:
    return any(text in str(d[0]) for d in beats)


async def test_the_new_node_is_cordoned_on_sight_before_it_is_ready(
    core: client.CoreV1Api, acts: KubernetesActivities, admin: httpx.Client
) -> None:
    """A Node that joins uncordoned invites pods (and, on Slinky, the operator undrains its
    Slurm node): the wait cordons it the moment it appears, Ready or not."""
    machine(admin, NODE, "vm-1", "boot-1")
    waiting = asyncio.create_task(
        ActivityEnvironment().run(
            acts.wait_new_node_ready,
            WaitNewNodeInput(
                node=NODE,
                old_provider_id="crusoe://vm-1",
                old_boot_id="boot-1",
                cordon=cordon("health-gate"),
                poll_s=0.05,
            ),
        )
    )
    admin.delete(f"/_emulator/nodes/{NODE}").raise_for_status()  # the old VM is gone
    machine(admin, NODE, "vm-2", "boot-2", ready=False)

    async def cordoned() -> bool:
        return bool(core.read_node(NODE).spec.unschedulable)

    await eventually(cordoned, what="the new Node cordoned")
    assert not waiting.done()  # still waiting for Ready
    node = core.read_node(NODE)
    assert node.metadata.labels[PHASE_LABEL] == "health-gate"
    assert node.metadata.annotations[CORDON_REASON_ANNOTATION] == REASON
    admin.post(f"/_emulator/nodes/{NODE}/ready", json={"ready": True}).raise_for_status()
    after = await waiting
    assert after.provider_id == "crusoe://vm-2" and after.unschedulable


async def test_reboot_keeps_the_cordon_until_uncordon(
    core: client.CoreV1Api, acts: KubernetesActivities, admin: httpx.Client
) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    env = ActivityEnvironment()
    await env.run(acts.cordon_node, cordon())
    machine(admin, NODE, "vm-1", "boot-2")  # same VM, rebooted
    after = await env.run(
        acts.wait_new_node_ready,
        WaitNewNodeInput(node=NODE, old_provider_id="crusoe://vm-1", old_boot_id="boot-1"),
    )
    assert (after.provider_id, after.boot_id, after.unschedulable) == (
        "crusoe://vm-1",
        "boot-2",
        True,
    )
    back = await env.run(acts.uncordon_node, UncordonNodeInput(node=NODE, incident_id="INC-1"))
    assert back.uncordoned and back.changed
    node = core.read_node(NODE)
    assert not node.spec.unschedulable and not node.spec.taints
    assert PHASE_LABEL not in node.metadata.labels
    assert INCIDENT_ANNOTATION not in (node.metadata.annotations or {})
    assert CORDON_REASON_ANNOTATION not in (node.metadata.annotations or {})


async def test_cordon_and_uncordon_are_idempotent(
    core: client.CoreV1Api, acts: KubernetesActivities, admin: httpx.Client
) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    env = ActivityEnvironment()
    first = await env.run(acts.cordon_node, cordon())
    rv = core.read_node(NODE).metadata.resource_version
    second = await env.run(acts.cordon_node, cordon())
    assert first.changed and not second.changed and second.cordoned
    assert core.read_node(NODE).metadata.resource_version == rv
    inp = UncordonNodeInput(node=NODE, incident_id="INC-1")
    first_back, second_back = (
        await env.run(acts.uncordon_node, inp),
        await env.run(acts.uncordon_node, inp),
    )
    assert first_back.changed and not second_back.changed and second_back.uncordoned
    assert not core.read_node(NODE).spec.unschedulable


async def test_an_uncordon_that_keeps_the_taint_lifts_only_the_cordon(
    core: client.CoreV1Api, acts: KubernetesActivities, admin: httpx.Client
) -> None:
    """The burn-in screen's uncordon: Slinky stops draining the Slurm node (the cordon is
    gone) while the remediation taint keeps every other pod off the node on trial."""
    machine(admin, NODE, "vm-1", "boot-1")
    env = ActivityEnvironment()
    await env.run(acts.cordon_node, cordon("health-gate"))
    trial = UncordonNodeInput(node=NODE, incident_id="INC-1", keep_taint=True)
    first = await env.run(acts.uncordon_node, trial)
    assert first.uncordoned and first.changed and "taint kept" in first.detail
    node = core.read_node(NODE)
    assert not node.spec.unschedulable
    assert taints(core) == [(TAINT_KEY, "health-gate", "NoSchedule")]
    assert node.metadata.labels[PHASE_LABEL] == "health-gate"
    assert node.metadata.annotations[INCIDENT_ANNOTATION] == "INC-1"
    again = await env.run(acts.uncordon_node, trial)
    assert again.uncordoned and not again.changed
    # Another incident's keep-taint uncordon is refused like any other.
    other = UncordonNodeInput(node=NODE, incident_id="INC-2", keep_taint=True)
    refused = await env.run(acts.uncordon_node, other)
    assert refused.foreign and not refused.changed
    # The return: everything of ours goes.
    done = await env.run(acts.uncordon_node, UncordonNodeInput(node=NODE, incident_id="INC-1"))
    assert done.changed and not core.read_node(NODE).spec.taints


async def test_a_foreign_cordon_is_left_alone(
    core: client.CoreV1Api, acts: KubernetesActivities, admin: httpx.Client
) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    admins_cordon = {
        "spec": {"unschedulable": True},
        "metadata": {"annotations": {CORDON_REASON_ANNOTATION: "bad DIMM"}},
    }
    core.patch_node(NODE, admins_cordon)
    env = ActivityEnvironment()
    took = await env.run(acts.cordon_node, cordon())
    assert took.foreign and not took.changed and "bad DIMM" in took.detail
    back = await env.run(acts.uncordon_node, UncordonNodeInput(node=NODE, incident_id="INC-1"))
    assert back.foreign and not back.uncordoned
    node = core.read_node(NODE)
    assert (
        node.spec.unschedulable
        and node.metadata.annotations[CORDON_REASON_ANNOTATION] == "bad DIMM"
    )
    assert INCIDENT_ANNOTATION not in node.metadata.annotations

    # Another incident's cordon is not this incident's to lift either.
    core.patch_node(NODE, {"spec": {"unschedulable": None}})
    await env.run(acts.cordon_node, cordon(incident="INC-0"))
    back = await env.run(acts.uncordon_node, UncordonNodeInput(node=NODE, incident_id="INC-1"))
    assert back.foreign and "INC-0" in back.detail and core.read_node(NODE).spec.unschedulable


async def test_our_taint_is_replaced_and_others_kept(
    core: client.CoreV1Api, acts: KubernetesActivities, admin: httpx.Client
) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    core.patch_node(NODE, {"spec": {"taints": [gpu_taint]}})
    env = ActivityEnvironment()
    await env.run(acts.cordon_node, cordon("quarantine"))
    moved = await env.run(acts.cordon_node, cordon("repair"))
    assert moved.changed
    assert taints(core) == [
        (TAINT_KEY, "repair", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", None, "NoSchedule"),
        ("nvidia.com/gpu", "present", "NoSchedule"),
    ]
    assert core.read_node(NODE).metadata.labels[PHASE_LABEL] == "repair"
    await env.run(acts.uncordon_node, UncordonNodeInput(node=NODE, incident_id="INC-1"))
    assert taints(core) == [("nvidia.com/gpu", "present", "NoSchedule")]


async def test_daemonset_mirror_and_slurmd_pods_are_skipped(
    core: client.CoreV1Api, acts: KubernetesActivities, admin: httpx.Client, api: client.ApiClient
) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    core.create_namespace({"metadata": {"name": "slurm"}})
    nodeset = client.CustomObjectsApi(api).create_namespaced_custom_object(
        "slinky.slurm.net", "v1beta1", "slurm", "nodesets",
        {"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
         "metadata": {"name": "gpu"},
         "spec": {"controllerRef": {"name": "slurm"}, "replicas": 1}},
    )  # fmt: skip
    owner = {"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet", "name": "gpu",
             "uid": nodeset["metadata"]["uid"], "controller": True}  # fmt: skip
    pod(core, "slurm", "gpu-0", NODE, ownerReferences=[owner],
        labels={"nodeset.slinky.slurm.net/pod-hostname": "gpu-0",
                "nodeset.slinky.slurm.net/pod-protect": "true"})  # fmt: skip
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": "dcgm",
        "uid": "u-1",
        "controller": True,
    }
    pod(core, "kube-system", "dcgm-exporter-x", NODE, ownerReferences=[ds])
    pod(core, "kube-system", f"etcd-{NODE}", NODE, annotations={"kubernetes.io/config.mirror": "h"})
    pod(core, "default", "notebook", NODE)
    env = ActivityEnvironment()

    found = await env.run(acts.find_slurmd_pod, FindSlurmdPodInput(node=NODE))
    assert found.pod is not None
    assert (found.pod.name, found.pod.nodeset, found.pod.slurm_node) == ("gpu-0", "gpu", "gpu-0")
    assert found.pod.protected and found.pod.ready and found.pod.phase == "Running"

    res = await env.run(acts.evict_pods, EvictPodsInput(node=NODE, timeout_s=5, poll_s=0.05))
    assert res.evicted == ["default/notebook"]
    assert sorted(res.skipped) == [
        "kube-system/dcgm-exporter-x",
        f"kube-system/etcd-{NODE}",
        "slurm/gpu-0",
    ]
    assert "DaemonSet" in res.skipped["kube-system/dcgm-exporter-x"]
    assert "Slurm" in res.skipped["slurm/gpu-0"]

    res = await env.run(
        acts.evict_pods, EvictPodsInput(node=NODE, timeout_s=5, poll_s=0.05, skip_slurmd=False)
    )
    assert res.evicted == ["slurm/gpu-0"]
    assert (await env.run(acts.find_slurmd_pod, FindSlurmdPodInput(node=NODE))).pod is None


async def test_blocked_eviction_is_forced_or_fails(
    core: client.CoreV1Api, acts: KubernetesActivities, admin: httpx.Client, api: client.ApiClient
) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    pod(core, "default", "ps-0", NODE, labels={"app": "ps"})
    client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default", pdb("ps", "ps", maxUnavailable=0)
    )
    env = ActivityEnvironment()
    inp = EvictPodsInput(node=NODE, timeout_s=0.3, poll_s=0.05, max_backoff_s=0.1)
    with pytest.raises(ApplicationError) as err:
        await env.run(acts.evict_pods, inp)
    assert err.value.type == "EvictionBlocked" and err.value.non_retryable
    assert "needs 1 healthy pods" in str(err.value)
    assert pod_names(core, NODE) == ["default/ps-0"]

    res = await env.run(acts.evict_pods, inp.model_copy(update={"force_after_timeout": True}))
    assert res.forced == ["default/ps-0"] and res.evicted == []
    assert pod_names(core, NODE) == []


async def test_pods_of_a_notready_node_stay_terminating_until_forced(
    core: client.CoreV1Api, acts: KubernetesActivities, admin: httpx.Client
) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    pod(core, "default", "job-0", NODE)
    admin.post(f"/_emulator/nodes/{NODE}/ready", json={"ready": False}).raise_for_status()
    env = ActivityEnvironment()
    inp = EvictPodsInput(node=NODE, timeout_s=0.3, poll_s=0.05, force_after_timeout=True)
    res = await env.run(acts.evict_pods, inp)
    # The eviction went through, but the dead kubelet never finished the deletion.
    assert res.evicted == ["default/job-0"] and res.forced == ["default/job-0"]
    assert pod_names(core, NODE) == []
    assert ("node.kubernetes.io/not-ready", None, "NoSchedule") in taints(core)


async def test_gpu_unhealthy_condition_is_set_and_cleared(
    core: client.CoreV1Api, acts: KubernetesActivities, admin: httpx.Client
) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    env = ActivityEnvironment()

    def conditions() -> dict[str, client.V1NodeCondition]:
        return {c.type: c for c in core.read_node(NODE).status.conditions}

    kinds = set(conditions())
    cleared = await env.run(acts.set_node_condition, SetNodeConditionInput(
        node=NODE, unhealthy=False, reason="GpuHealthy"))  # fmt: skip
    assert not cleared.changed and GPU_UNHEALTHY not in conditions()

    bad = SetNodeConditionInput(node=NODE, unhealthy=True, reason="Xid79", message="GPU fell off")
    assert (await env.run(acts.set_node_condition, bad)).changed
    now = conditions()
    assert set(now) == kinds | {GPU_UNHEALTHY}
    assert (now[GPU_UNHEALTHY].status, now[GPU_UNHEALTHY].reason) == ("True", "Xid79")
    assert now["Ready"].status == "True"
    again = await env.run(acts.set_node_condition, bad)
    assert not again.changed

    good = SetNodeConditionInput(node=NODE, unhealthy=False, reason="HealthGatePassed")
    assert (await env.run(acts.set_node_condition, good)).status == "False"
    after = conditions()
    assert set(after) == kinds | {GPU_UNHEALTHY}
    assert (after[GPU_UNHEALTHY].status, after[GPU_UNHEALTHY].reason) == (
        "False",
        "HealthGatePassed",
    )
    assert after[GPU_UNHEALTHY].last_transition_time >= now[GPU_UNHEALTHY].last_transition_time


async def test_unknown_node_is_not_retried(acts: KubernetesActivities) -> None:
    for step, inp in [
        (acts.cordon_node, cordon()),
        (acts.evict_pods, EvictPodsInput(node=NODE)),
        (acts.node_identity, NodeIdentityInput(node=NODE)),
    ]:
        with pytest.raises(ApplicationError) as err:
            await ActivityEnvironment().run(step, inp)
        assert err.value.type == "UnknownNode" and err.value.non_retryable


async def test_two_budgets_on_a_pod_fail_retryably(
    core: client.CoreV1Api, acts: KubernetesActivities, admin: httpx.Client, api: client.ApiClient
) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    pod(core, "default", "web-0", NODE, labels={"app": "web"})
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget("default", pdb("a", "web", minAvailable=0))
    policy.create_namespaced_pod_disruption_budget("default", pdb("b", "web", minAvailable=0))
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.evict_pods, EvictPodsInput(node=NODE, timeout_s=1))
    assert err.value.type == "KubernetesRetryable" and not err.value.non_retryable
    assert "more than one PodDisruptionBudget" in str(err.value)


def fault(admin: httpx.Client, method: str, path: str, code: int, times: int = 1) -> None:
    spec = {"method": method, "path": path, "code": code, "times": times}
    admin.post("/_emulator/faults", json=spec).raise_for_status()


async def test_conflicts_are_reread_then_left_to_temporal(
    core: client.CoreV1Api, acts: KubernetesActivities, admin: httpx.Client
) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    env = ActivityEnvironment()
    fault(admin, "PATCH", f"/api/v1/nodes/{NODE}", 409)
    assert (await env.run(acts.cordon_node, cordon())).changed
    assert core.read_node(NODE).spec.unschedulable

    fault(admin, "PATCH", f"/api/v1/nodes/{NODE}", 409, times=5)
    with pytest.raises(ApplicationError) as err:
        await env.run(acts.uncordon_node, UncordonNodeInput(node=NODE, incident_id="INC-1"))
    assert err.value.type == "KubernetesRetryable" and not err.value.non_retryable
    assert core.read_node(NODE).spec.unschedulable


async def test_server_errors_are_retryable_and_waits_ride_them_out(
    acts: KubernetesActivities, admin: httpx.Client
) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    env = ActivityEnvironment()
    fault(admin, "GET", f"/api/v1/nodes/{NODE}", 503)
    with pytest.raises(ApplicationError) as err:
        await env.run(acts.node_identity, NodeIdentityInput(node=NODE))
    assert err.value.type == "KubernetesUnavailable" and not err.value.non_retryable

    fault(admin, "GET", f"/api/v1/nodes/{NODE}", 503, times=3)
    machine(admin, NODE, "vm-1", "boot-2")
    inp = WaitNewNodeInput(
        node=NODE, old_provider_id="crusoe://vm-1", old_boot_id="boot-1", poll_s=0.02
    )
    assert (await env.run(acts.wait_new_node_ready, inp)).boot_id == "boot-2"


async def test_a_bad_token_is_unauthorized(
    emulator: Running, admin: httpx.Client, tmp_path: Path
) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    bad = api_client(kubeconfig=write_kubeconfig(tmp_path / "bad", emulator.url, "wrong"))
    try:
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(bad).read_node(NODE)
        assert err.value.status == 401 and '"reason":"Unauthorized"' in err.value.body
        with pytest.raises(ApplicationError) as app_err:
            await ActivityEnvironment().run(
                KubernetesActivities(bad).node_identity, NodeIdentityInput(node=NODE)
            )
        assert app_err.value.type == "KubernetesUnauthorized" and app_err.value.non_retryable
    finally:
        bad.close()


def test_stale_resource_version_conflicts(core: client.CoreV1Api, admin: httpx.Client) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    stale = core.read_node(NODE)
    core.patch_node(NODE, {"metadata": {"labels": {"team": "a"}}})
    with pytest.raises(ApiException) as err:
        core.replace_node(NODE, stale)
    assert err.value.status == 409 and '"reason":"Conflict"' in err.value.body
    with pytest.raises(ApiException) as err:
        core.patch_node(NODE, {"metadata": {"resourceVersion": stale.metadata.resource_version,
                                            "labels": {"team": "b"}}})  # fmt: skip
    assert err.value.status == 409
    fresh = core.read_node(NODE)
    fresh.metadata.labels["team"] = "c"
    assert core.replace_node(NODE, fresh).metadata.labels["team"] == "c"


def test_selectors(core: client.CoreV1Api, admin: httpx.Client) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    machine(admin, "gpu-02", "vm-2", "boot-2")
    pod(core, "default", "a", NODE, labels={"app": "web"})
    pod(core, "default", "b", "gpu-02", labels={"app": "db"})
    pod(core, "kube-system", "c", NODE)
    assert pod_names(core, NODE) == ["default/a", "kube-system/c"]

    def names(**kw: str) -> list[str]:
        return sorted(p.metadata.name for p in core.list_pod_for_all_namespaces(**kw).items)

    assert names(label_selector="app=web") == ["a"]
    assert names(label_selector="app in (web,db)") == ["a", "b"]
    assert names(label_selector="!app") == ["c"]
    assert names(label_selector="app,app!=web") == ["b"]
    assert names(field_selector=f"spec.nodeName!={NODE}") == ["b"]
    assert names(field_selector=f"spec.nodeName={NODE},metadata.namespace=default") == ["a"]
    nodes = core.list_node(label_selector="crusoe.ai/instance.id=vm-2").items
    assert [n.metadata.name for n in nodes] == ["gpu-02"]
    with pytest.raises(ApiException) as err:
        core.list_pod_for_all_namespaces(field_selector="spec.gpu=8")
    assert err.value.status == 400


def test_patch_flavours(core: client.CoreV1Api, admin: httpx.Client, api: client.ApiClient) -> None:
    machine(admin, NODE, "vm-1", "boot-1")
    pod(core, "default", "a", NODE)
    probe = [{"type": "Ready", "status": "False"}, {"type": "example.com/Probe", "status": "True"}]
    core.patch_namespaced_pod_status("a", "default", {"status": {"conditions": probe}})
    conds = {c.type: c.status for c in core.read_namespaced_pod("a", "default").status.conditions}
    assert conds["Ready"] == "False" and conds["PodScheduled"] == "True"
    assert conds["example.com/Probe"] == "True"
    ops = [{"op": "add", "path": "/metadata/labels", "value": {"x": "1"}},
           {"op": "test", "path": "/spec/unschedulable", "value": True}]  # fmt: skip
    with pytest.raises(ApiException) as err:  # the test op fails: nothing is applied
        core.patch_node(NODE, ops)
    assert err.value.status == 422 and "x" not in core.read_node(NODE).metadata.labels
    core.patch_node(NODE, ops[:1])
    assert core.read_node(NODE).metadata.labels == {"x": "1"}
    with pytest.raises(ApiException) as err:
        core.patch_node(NODE, {"spec": {"providerID": "crusoe://other"}})
    assert err.value.status == 422

    core.create_namespace({"metadata": {"name": "slurm"}})
    crs = client.CustomObjectsApi(api)
    args = ("slinky.slurm.net", "v1beta1", "slurm", "nodesets")
    nodeset = {
        "apiVersion": "slinky.slurm.net/v1beta1",
        "kind": "NodeSet",
        "metadata": {"name": "gpu"},
        "spec": {"controllerRef": {"name": "slurm"}},  # required by the published schema
    }
    crs.create_namespaced_custom_object(*args, nodeset)
    crs.patch_namespaced_custom_object(*args, "gpu", {"spec": {"replicas": 4}})
    got = crs.get_namespaced_custom_object(*args, "gpu")
    assert got["spec"]["replicas"] == 4 and got["metadata"]["generation"] == 2
    with pytest.raises(ApiException) as err:
        crs.patch_namespaced_custom_object(
            *args, "gpu", {"spec": {"replicas": 5}},
            _content_type="application/strategic-merge-patch+json",
        )  # fmt: skip
    assert err.value.status == 415
    with pytest.raises(ApiException) as err:
        crs.create_namespaced_custom_object(*args, nodeset)
    assert err.value.status == 409 and '"reason":"AlreadyExists"' in err.value.body


def test_state_file_survives_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "k8s.json"
    with running(TOKEN, state_file=state) as emu:
        httpx.post(f"{emu.url}/_emulator/nodes", json={"name": NODE}).raise_for_status()
        uid = emu.store.get(NODES, None, NODE)["metadata"]["uid"]
    with running(TOKEN, state_file=state) as emu:
        assert emu.store.get(NODES, None, NODE)["metadata"]["uid"] == uid


@pytest.mark.integration
def test_the_emulator_runs_as_a_module(tmp_path: Path) -> None:
    """Integration lane: it starts the emulator as a server process (make unit starts none),
    over HTTPS with the certificate it keeps in --cert-dir."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autoclusters.sandbox.kubernetes.emulator",
            "--port",
            str(port),
            "--token",
            TOKEN,
            "--cert-dir",
            str(tmp_path),
        ],
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        url = f"https://127.0.0.1:{port}/version"
        got = _when_up(proc, url, {"Authorization": f"Bearer {TOKEN}"}, tmp_path / "tls.crt")
        assert got.status_code == 200 and got.json()["major"] == "1"
        trusting = ssl.create_default_context(cafile=tmp_path / "tls.crt")
        assert httpx.get(url, verify=trusting).status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _when_up(
    proc: subprocess.Popen[bytes], url: str, headers: dict[str, str], cert: Path
) -> httpx.Response:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if not cert.exists():
                raise httpx.ConnectError("no certificate yet")
            trusting = ssl.create_default_context(cafile=cert)
            return httpx.get(url, headers=headers, timeout=1, verify=trusting)
        except (httpx.TransportError, ssl.SSLError):
            try:
                proc.wait(timeout=0.05)  # not up yet: wait a little, unless it died
            except subprocess.TimeoutExpired:
                continue
            raise AssertionError(f"the emulator exited with {proc.returncode}") from None
    raise AssertionError("the emulator did not answer within 20s")
