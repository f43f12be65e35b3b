"""Events on the Node for what the runbook does to it (integrations/k8s_events.py), with the
real `kubernetes` client against the loopback emulator:

- a cordon, an uncordon, an eviction and the GpuUnhealthy condition each leave one Event on
  the Node (involvedObject the Node with its uid, in `default`, from `autoclusters`);
- a GPU-sharing move's pool taint, lifted and put back, leaves one each;
- a step that changes nothing leaves none, and a repeat counts up on the same Event;
- an Event the API refuses never fails the step that made the change.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.kubernetes import KubernetesActivities
from autoclusters.activities.sharing_k8s import ShareKubernetesActivities
from autoclusters.core.kubernetes import (
    TAINT_KEY,
    CordonNodeInput,
    EvictPodsInput,
    SetNodeConditionInput,
    UncordonNodeInput,
)
from autoclusters.core.sharing import POOL_TAINT_KEY, MoveCall, SharePolicy
from autoclusters.integrations import k8s_events
from autoclusters.integrations.k8s import api_client
from autoclusters.integrations.k8s_events import NodeEvents
from autoclusters.sandbox.kubernetes.emulator import Running, running

TOKEN = "events-token"
NODE = "gpu-01"
EVENTS_PATH = "/api/v1/namespaces/default/events"


@pytest.fixture
def emu() -> Iterator[Running]:
    with running(TOKEN) as e:
        httpx.post(f"{e.url}/_emulator/nodes", json={"name": NODE}).raise_for_status()
        yield e


@pytest.fixture
def api(emu: Running, tmp_path: Path) -> Iterator[client.ApiClient]:
    config = tmp_path / "kubeconfig"
    config.write_text(emu.kubeconfig())
    c = api_client(kubeconfig=config)
    yield c
    c.close()


@pytest.fixture
def acts(api: client.ApiClient) -> KubernetesActivities:
    return KubernetesActivities(api, request_timeout_s=5)


def events(emu: Running) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = emu.store.dump()["events"]
    return sorted(items, key=lambda e: e["metadata"]["creationTimestamp"])


def node_uid(emu: Running) -> str:
    return str(next(n for n in emu.store.dump()["nodes"])["metadata"]["uid"])


def cordon(incident: str = "INC-1") -> CordonNodeInput:
    return CordonNodeInput(node=NODE, incident_id=incident, phase="quarantine", reason="XID_79")


async def test_cordon_and_uncordon_leave_an_event_each(
    emu: Running, acts: KubernetesActivities
) -> None:
    env = ActivityEnvironment()
    await env.run(acts.cordon_node, cordon())
    await env.run(acts.cordon_node, cordon())  # already ours: nothing changed, no Event
    (ev,) = events(emu)
    assert ev["reason"] == k8s_events.CORDONED and ev["type"] == "Warning"
    assert ev["involvedObject"] == {
        "apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid(emu)
    }  # fmt: skip
    assert ev["metadata"]["namespace"] == "default"
    assert ev["source"]["component"] == ev["reportingComponent"] == "autoclusters"
    assert "INC-1" in ev["message"] and f"{TAINT_KEY}=quarantine:NoSchedule" in ev["message"]
    assert ev["count"] == 1 and ev["firstTimestamp"] and ev["lastTimestamp"]

    await env.run(acts.uncordon_node, UncordonNodeInput(node=NODE, incident_id="INC-1"))
    assert [e["reason"] for e in events(emu)] == ["Cordoned", "Uncordoned"]
    assert events(emu)[1]["type"] == "Normal"


async def test_the_condition_leaves_an_event_with_its_reason(
    emu: Running, acts: KubernetesActivities
) -> None:
    env = ActivityEnvironment()
    sick = SetNodeConditionInput(node=NODE, unhealthy=True, reason="Xid79", message="XID 79")
    await env.run(acts.set_node_condition, sick)
    await env.run(acts.set_node_condition, sick)  # unchanged: no second Event
    healed = SetNodeConditionInput(node=NODE, unhealthy=False, reason="HealthGatePassed")
    await env.run(acts.set_node_condition, healed)
    got = [(e["reason"], e["type"], e["message"]) for e in events(emu)]
    assert got == [
        ("Xid79", "Warning", "GpuUnhealthy=True: XID 79"),
        ("HealthGatePassed", "Normal", "GpuUnhealthy=False"),
    ]


async def test_an_eviction_leaves_an_event_naming_the_pods(
    emu: Running, acts: KubernetesActivities, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "train"}})
    container = {"name": "main", "image": "busybox"}
    body = {"metadata": {"name": "worker-0"}, "spec": {"nodeName": NODE, "containers": [container]}}
    core.create_namespaced_pod("train", body)
    inp = EvictPodsInput(node=NODE, timeout_s=10, poll_s=0.05)
    res = await ActivityEnvironment().run(acts.evict_pods, inp)
    assert res.evicted == ["train/worker-0"]
    (ev,) = events(emu)
    assert ev["reason"] == k8s_events.EVICTED and "train/worker-0" in ev["message"]
    await ActivityEnvironment().run(acts.evict_pods, inp)  # nothing left to evict: no Event
    assert len(events(emu)) == 1


def test_a_repeat_counts_up_on_the_same_event(emu: Running, api: client.ApiClient) -> None:
    times = iter([datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in (1, 2, 3)])
    recorder = NodeEvents(api, host="worker-1", clock=lambda: next(times))
    uid = node_uid(emu)
    assert recorder.record(NODE, uid, "Cordoned", "same words", warning=True)
    assert recorder.record(NODE, uid, "Cordoned", "same words", warning=True)
    assert recorder.record(NODE, uid, "Cordoned", "other words", warning=True)
    first, other = events(emu)
    assert (first["count"], first["lastTimestamp"]) == (2, "2026-01-01T00:00:02Z")
    assert first["firstTimestamp"].startswith("2026-01-01T00:00:01")
    assert other["count"] == 1 and other["source"]["host"] == "worker-1"


async def test_a_refused_event_never_fails_the_step(
    emu: Running, acts: KubernetesActivities, api: client.ApiClient
) -> None:
    fault = {"method": "POST", "path": EVENTS_PATH, "code": 403, "times": 1}
    httpx.post(f"{emu.url}/_emulator/faults", json=fault).raise_for_status()
    res = await ActivityEnvironment().run(acts.cordon_node, cordon())
    assert res.changed and client.CoreV1Api(api).read_node(NODE).spec.unschedulable
    assert events(emu) == []  # dropped (and logged), as client-go drops one


async def test_a_sharing_move_leaves_an_event_for_the_pool_taint(
    emu: Running, api: client.ApiClient
) -> None:
    """Lending a node lifts the training pool's taint, taking it back restores it: an Event
    each, none for a step that changed nothing."""
    share = ShareKubernetesActivities(api, request_timeout_s=5)
    move = MoveCall(cluster="c", node=NODE, move_id="m-1", policy=SharePolicy())
    env = ActivityEnvironment()
    await env.run(share.lend, move)
    await env.run(share.lend, move)  # already lent: no second Event
    await env.run(share.reclaim, move)
    got = [(e["reason"], e["type"]) for e in events(emu)]
    assert got == [(k8s_events.POOL_TAINT_LIFTED, "Normal"), (k8s_events.POOL_TAINTED, "Normal")]
    assert f"{POOL_TAINT_KEY}=training:NoSchedule" in events(emu)[1]["message"]
