"""A NodeSet scaled beyond its Nodes (sandbox/slinky/operator.py, the emulator's scheduler),
against the in-process Kubernetes emulator and the in-memory Slurm:

- each missing Node is a Pending slurmd pod the default scheduler cannot place (one slurmd
  per Node: its required pod anti-affinity), with the scheduler's reason on the pod and in
  a `FailedScheduling` Event;
- a new Node gets its own slurmd pod and a Pending pod goes; scaled back, the Pending pods go.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from kubernetes import client

from autoclusters.core.sharing import POOL_TAINT_KEY
from autoclusters.sandbox.kubernetes.objects import now
from autoclusters.sandbox.slinky.operator import SlinkyOperator
from autoclusters.sandbox.slurm.topology import place_unplaced
from tests.emulators.test_slinky_operator import (  # noqa: F401  (its fixtures)
    NODESET,
    NS,
    OperatorFakeSlurm,
    admin,
    api,
    core,
    emulator,
    machine,
    nodeset,
    operator,
    slurm,
)


def pods_by_name(core: client.CoreV1Api) -> dict[str, dict[str, Any]]:  # noqa: F811
    raw: Any = core.list_namespaced_pod(NS, _preload_content=False)  # the HTTP response
    return {p["metadata"]["name"]: p for p in json.loads(raw.data)["items"]}


def scheduled(pod: dict[str, Any]) -> dict[str, Any]:
    conds = (pod.get("status") or {}).get("conditions") or []
    return next(c for c in conds if c["type"] == "PodScheduled")


async def test_replicas_beyond_the_nodes_leave_pending_pods_until_a_node_comes(
    api: client.ApiClient,  # noqa: F811
    core: client.CoreV1Api,  # noqa: F811
    admin: httpx.Client,  # noqa: F811
    nodeset: dict[str, Any],  # noqa: F811
    operator: SlinkyOperator,  # noqa: F811
) -> None:
    machine(admin, "gpu-01")
    machine(admin, "gpu-02")
    await operator.reconcile_once()
    crs = client.CustomObjectsApi(api)
    crs.patch_namespaced_custom_object(*NODESET, "gpu", {"spec": {"replicas": 4}})

    report = await operator.reconcile_once()

    assert report.created == ["slurm/slurmd-gpu-new-1", "slurm/slurmd-gpu-new-2"]
    assert report.pending == report.created
    got = pods_by_name(core)
    assert sorted(got) == ["slurmd-gpu-01", "slurmd-gpu-02", "slurmd-gpu-new-1",
                           "slurmd-gpu-new-2"]  # fmt: skip
    waiting = got["slurmd-gpu-new-1"]
    assert not waiting["spec"].get("nodeName") and waiting["status"]["phase"] == "Pending"
    cond = scheduled(waiting)
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert cond["message"] == (
        "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."
    )
    again = await operator.reconcile_once()
    assert again.created == [] and again.deleted == []  # steady: nothing made twice
    # The scheduler says so, once per pod and reason, as kube-scheduler's Event does.
    raw: Any = core.list_namespaced_event(NS, _preload_content=False)
    said = sorted(
        (e["involvedObject"]["name"], e["reason"], e["type"], e["message"])
        for e in json.loads(raw.data)["items"]
    )
    assert said == [
        (name, "FailedScheduling", "Warning", cond["message"])
        for name in ("slurmd-gpu-new-1", "slurmd-gpu-new-2")
    ]

    # The autoscaler's machine registers as a sandbox machine does (sandbox/machines/backend.py):
    # in the training pool, tainted, so no Pending pod is bound to it by the scheduler.
    admin.post(
        "/_emulator/nodes",
        json={"name": "gpu-03", "provider_id": "crusoe://vm-gpu-03", "boot_id": "b",
              "ready": True, "labels": {"nvidia.com/gpu.present": "true"},
              "register_taints": [{"key": POOL_TAINT_KEY, "value": "training",
                                   "effect": "NoSchedule"}]},
    ).raise_for_status()  # fmt: skip
    report = await operator.reconcile_once()

    assert report.created == ["slurm/slurmd-gpu-03"]
    assert report.deleted == ["slurm/slurmd-gpu-new-2"] and report.pending == [
        "slurm/slurmd-gpu-new-1"
    ]
    got = pods_by_name(core)
    assert got["slurmd-gpu-03"]["spec"]["nodeName"] == "gpu-03"
    assert "slurmd-gpu-new-2" not in got

    crs.patch_namespaced_custom_object(*NODESET, "gpu", {"spec": {"replicas": 3}})
    report = await operator.reconcile_once()

    assert report.deleted == ["slurm/slurmd-gpu-new-1"] and report.pending == []
    assert sorted(pods_by_name(core)) == ["slurmd-gpu-01", "slurmd-gpu-02", "slurmd-gpu-03"]


async def test_scale_in_takes_the_newest_node_first(
    api: client.ApiClient,  # noqa: F811
    core: client.CoreV1Api,  # noqa: F811
    admin: httpx.Client,  # noqa: F811
    nodeset: dict[str, Any],  # noqa: F811
    operator: SlinkyOperator,  # noqa: F811
    slurm: OperatorFakeSlurm,  # noqa: F811
) -> None:
    """A scaled-out Node is newer than the NodeSet's first ones: scaling back drains it, not
    an older Node that sorts after it by name."""
    for name in ("gpu-02", "gpu-03"):
        machine(admin, name)
    stamp = now()
    while now() == stamp:  # the API stamps whole seconds: gpu-01 is born a second later
        await asyncio.sleep(0.05)
    machine(admin, "gpu-01")
    await operator.reconcile_once()
    assert sorted(pods_by_name(core)) == ["slurmd-gpu-01", "slurmd-gpu-02", "slurmd-gpu-03"]
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        *NODESET, "gpu", {"spec": {"replicas": 2}}
    )

    report = await operator.reconcile_once()

    assert report.drained == ["gpu-01"] and report.downed == ["gpu-01"]


def test_a_node_no_switch_places_gets_a_switch_of_its_own() -> None:
    conf = (
        "# provisioning's\nSwitchName=leaf-01 Nodes=gpu-[01-02]\n"
        "SwitchName=pod-01 Switches=leaf-01\n"
    )
    assert place_unplaced(conf, ["gpu-01", "gpu-02"]) == conf
    assert place_unplaced("", ["cmk-gpu-3"]) == ""  # no topology/tree: nothing to place
    placed = place_unplaced(conf, ["gpu-01", "gpu-02", "cmk-gpu-3"]).splitlines()
    assert placed[-2:] == [
        "SwitchName=unplaced Nodes=cmk-gpu-3",
        "SwitchName=unplaced-root Switches=pod-01,unplaced",
    ]
